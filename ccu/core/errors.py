"""The library's error for a result that cannot be trusted, shared by the math (a density family
whose bounds fail their check, :mod:`ccu.core.density_check`) and the results store
(:mod:`ccu.store.results`), so that neither imports the other for it. The command line gives it exit
code 4 (:data:`ccu.cli_parser.EXIT_CORRUPT`)."""


class CorruptResultError(ValueError):
    """A result file cannot be read or does not match the config that vouches for it."""
