"""The checks made before any work starts: names (datasets, methods, profiles), a workflow grid
(``workflow/config.yaml``, checked by the Snakefile), ``--overrides`` JSON and a results folder.
Each failure is a :class:`UsageError` (the command line's exit code 2) that says what is wrong
and what is allowed; an input a step needs that is not there is a :class:`MissingError` (exit
code 3)."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path


class UsageError(ValueError):
    """A wrong argument (exit code 2)."""


class MissingError(FileNotFoundError):
    """An input the step needs is not there (exit code 3)."""


def names():
    """``(datasets, methods, profiles)``: every registered name of each."""
    from ccu.data import dataset_names
    from ccu.methods import method_names
    from ccu.run.config import PROFILES

    # every registered method: the paper's eleven in its column order, then any others
    # (CCU-<family> for every registered density family, --plugin's included)
    return dataset_names(), method_names(), sorted(PROFILES)


def check(kind: str, values, valid) -> None:
    """:class:`UsageError` for the first of ``values`` not in ``valid`` (a ``kind`` of name)."""
    from ccu.methods import unknown_method_hint

    for v in values:
        if v not in valid:
            hint = unknown_method_hint(v) if kind == "method" else ""
            raise UsageError(f"unknown {kind} {v!r}; choose from: {', '.join(valid)}.{hint}")


def check_grid(
    datasets, methods, seeds, profile, overrides=None, device="cpu", reference_seed=None
):
    """Check a workflow grid (``workflow/config.yaml``) before any job starts; a
    :class:`UsageError` says which key is wrong and what it may be."""
    from ccu.run.config import get_profile

    valid_datasets, valid_methods, profiles = names()
    where = "in the workflow config (workflow/config.yaml, --config or --configfile)"
    for key, value in (("datasets", datasets), ("methods", methods), ("seeds", seeds)):
        if not isinstance(value, list | tuple) or not value:
            raise UsageError(f"{key} {where} must be a non-empty list, not {value!r}.")
    try:
        check("dataset", datasets, valid_datasets)
        check("method", methods, valid_methods)
        check("profile", [profile], profiles)
    except UsageError as exc:
        raise UsageError(f"{exc} ({where})") from exc
    if "CCU" not in methods:
        raise UsageError(
            f"methods {where} must include CCU: its certified balls define the attack."
        )
    if len(set(methods)) != len(methods) or len(set(datasets)) != len(datasets):
        raise UsageError(f"datasets and methods {where} must not repeat a name.")
    for s in seeds:
        if isinstance(s, bool) or not isinstance(s, int) or s < 0:
            raise UsageError(f"seeds {where} must be non-negative integers, not {s!r}.")
    if reference_seed is not None and reference_seed not in seeds:
        raise UsageError(f"reference_seed {reference_seed} {where} is not one of seeds {seeds}.")
    if not isinstance(overrides or {}, dict):
        raise UsageError(f"overrides {where} must be a mapping of profile fields.")
    try:
        for dataset in datasets:
            get_profile(profile, dataset, **dict(overrides or {}))
    except (TypeError, ValueError) as exc:
        raise UsageError(f"{exc} ({where})") from exc
    if not (device == "cpu" or device.startswith("cuda")):
        raise UsageError(f"device {device!r} {where} must be cpu or cuda.")


def parse_overrides(text: str | None) -> dict:
    """``--overrides`` JSON: an object of profile fields, e.g. ``'{"epochs": 5}'``."""
    if not text:
        return {}
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise UsageError(
            f"--overrides is not valid JSON ({exc.msg} at character {exc.pos}): {text!r}. "
            'Give an object of profile fields, e.g. --overrides \'{"epochs": 5, "n_train": 500}\'.'
        ) from exc
    if not isinstance(value, dict):
        raise UsageError(
            f"--overrides must be a JSON object of profile fields, not {type(value).__name__}: "
            f"{text!r}; e.g. --overrides '{{\"epochs\": 5}}'."
        )
    return value


def profile(name: str, overrides: str | None, dataset: str | None = None):
    """The profile ``name`` with the ``--overrides`` JSON applied (a :class:`ccu.Profile`), for
    ``dataset`` (``smoke`` is scaled to its network, :func:`ccu.run.config.get_profile`)."""
    from ccu.run.config import get_profile

    try:
        return get_profile(name, dataset, **parse_overrides(overrides))
    except (TypeError, ValueError) as exc:
        if isinstance(exc, UsageError):
            raise
        raise UsageError(str(exc)) from exc


def check_results_dir(path, what: str = "--results") -> None:
    """A results folder must be a folder this process can write (or create): a
    :class:`UsageError` otherwise, before any work starts."""
    folder = Path(path).expanduser()
    if folder.exists() and not folder.is_dir():
        raise UsageError(f"{what} {path} is a file, not a folder; give a folder for the results.")
    existing = next(p for p in (folder, *folder.absolute().parents) if p.exists())
    if not existing.is_dir():
        raise UsageError(
            f"{what} {path} cannot be created: {existing} is a file; give another folder."
        )
    problem = None if os.access(existing, os.W_OK | os.X_OK) else "read-only to this user"
    if problem is None:  # the real test (root passes os.access, not a read-only mount)
        import tempfile

        try:
            folder.mkdir(parents=True, exist_ok=True)
            tempfile.TemporaryFile(dir=folder).close()
        except OSError as exc:
            problem = f"not writable: {exc.strerror}"
    if problem is not None:
        raise UsageError(
            f"{what} {path} is not writable ({existing} is {problem}); give a folder you can "
            "write to."
        )


def check_arguments(args) -> None:
    """The parsed command line's names, seeds, ``--overrides``, ``--device`` and results folder
    (``--results``, else ``CCU_RESULTS``), checked before any step starts."""
    datasets, methods, profiles = names()
    if getattr(args, "profile", None) is not None:
        check("profile", [args.profile], profiles)
    for attr, kind, valid in (("dataset", "dataset", datasets), ("method", "method", methods)):
        value = getattr(args, attr, None)
        if value is not None:
            check(kind, value if isinstance(value, list) else [value], valid)
    seeds = getattr(args, "seed", None)
    for s in seeds if isinstance(seeds, list) else [seeds] if seeds is not None else []:
        if s < 0:
            raise UsageError(f"--seed must be a non-negative integer, not {s}.")
    if getattr(args, "overrides", None) is not None:
        parse_overrides(args.overrides)
    device = getattr(args, "device", None)
    if device is not None and not re.fullmatch(r"auto|cpu|cuda(:\d+)?", device):
        raise UsageError(f"--device {device!r} is not a device; use cpu, cuda, cuda:N or auto.")
    for attr, flag in (("threads", "--threads"), ("jobs_per_gpu", "--jobs-per-gpu")):
        value = getattr(args, attr, None)
        if value is not None and value < 1:
            raise UsageError(f"{flag} must be a positive integer, not {value}.")
    budget = getattr(args, "budget_seconds", None)
    if budget is not None and not budget > 0:
        raise UsageError(f"--budget-seconds must be a positive number of seconds, not {budget}.")
    # output folders: refused before a step runs, not after it (a run's --reference-out)
    outputs = (("out", "--out"), ("part_out", "--part-out"), ("reference_out", "--reference-out"),
               ("gpu_slots", "--gpu-slots"))  # fmt: skip
    for attr, flag in outputs:
        value = getattr(args, attr, None)
        if isinstance(value, (str, Path)) and value:
            check_results_dir(value, flag)
    if getattr(args, "command", None) == "compare-densities":
        not_ccu = [m for m in args.method if not (m == "CCU" or m.startswith("CCU-"))]
        if not_ccu:
            raise UsageError(
                f"compare-densities compares CCU's density families; {', '.join(not_ccu)} "
                "is not one: give CCU and CCU-<family> methods."
            )
    if getattr(args, "results", None):
        check_results_dir(args.results, "--results")
    elif hasattr(args, "results") and os.environ.get("CCU_RESULTS"):
        check_results_dir(os.environ["CCU_RESULTS"], "CCU_RESULTS")
