"""The OOD methods the paper compares, behind one interface (:class:`Method`).

Every method can be built for a dataset, trained, saved and loaded, predicts classes, and gives a
differentiable ``score`` (higher = more in-distribution) so that one evaluation and one attack
serve all of them. Methods register themselves (:func:`register_method`) under the names of the
paper's tables; :data:`METHOD_ORDER` is the paper's column order. ``CCU-<family>`` is CCU with
another registered density family (:func:`ccu.register_density`).
"""

from __future__ import annotations

from ccu.core.density import DENSITY_FAMILIES
from ccu.methods import gan, posthoc, trained  # noqa: F401 - their methods register themselves
from ccu.methods.base import METHODS, BaseMethod, Method, register_method
from ccu.methods.ccu_method import CCUMethod
from ccu.store.records import METHOD_ORDER, ordered


def get_method(name: str) -> type[Method]:
    """The method class called ``name`` (as in the paper's tables; ``CCU-<family>`` for CCU with
    another density family)."""
    if name in METHODS:
        return METHODS[name]
    if name.startswith("CCU-") and name[4:] in DENSITY_FAMILIES:
        return CCUMethod.with_density(name[4:])
    families = ", ".join(f"CCU-{f}" for f in sorted(DENSITY_FAMILIES) if f != CCUMethod.density)
    raise ValueError(
        f"unknown method {name!r}; available: {', '.join(sorted(METHODS))}"
        + (f", and CCU with another density: {families}." if families else ".")
        + unknown_method_hint(name)
    )


def unknown_method_hint(name: str) -> str:
    """How to make an unknown method known: for ``CCU-<name>`` its density family, for any
    other name a plug-in's method (``--plugin``)."""
    if not isinstance(name, str):
        return ""
    if not name.startswith("CCU-") or len(name) == 4:
        return (
            f" If {name} is your own method, register it with @ccu.register_method in a module "
            "and load that first: on the command line --plugin MODULE (a module name or a .py "
            "file; the workflow's config key `plugins`)."
        )
    return (
        f" {name} needs its density family registered in this process: decorate the class with "
        f"@ccu.register_density({name[4:]!r}) and run that cell or import that module first; "
        "on the command line pass the module with --plugin MODULE (a module name or a .py "
        "file; the workflow's config key `plugins`)."
    )


def method_names() -> list[str]:
    """Every method by name, in the paper's column order: the registered methods, then
    ``CCU-<family>`` for every other registered density family (e.g. ``CCU-diag``)."""
    others = [f"CCU-{f}" for f in DENSITY_FAMILIES if f != CCUMethod.density]
    return ordered(dict.fromkeys([*METHODS, *others]))


__all__ = [
    "METHODS",
    "METHOD_ORDER",
    "BaseMethod",
    "CCUMethod",
    "Method",
    "get_method",
    "method_names",
    "ordered",
    "register_method",
    "unknown_method_hint",
]
