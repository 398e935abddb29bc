"""The OOD methods the paper compares, behind one interface (:class:`Method`).

Every method can be built for a dataset, trained, saved and loaded, predicts classes, and gives a
differentiable ``score`` (higher = more in-distribution) so that one evaluation and one attack
serve all of them. Methods are named as in the paper's tables; :data:`METHOD_ORDER` is the
paper's column order.
"""

from __future__ import annotations

from ccu.methods.base import BaseMethod, Method
from ccu.methods.ccu_method import CCUMethod
from ccu.methods.gan import GANMethod
from ccu.methods.posthoc import MahaMethod, ODINMethod
from ccu.methods.trained import ACET2Method, ACETMethod, DEMethod, EDLMethod, MCDMethod, OEMethod

METHOD_ORDER = ("Base", "MCD", "EDL", "DE", "GAN", "ODIN", "Maha", "ACET", "ACET2", "OE", "CCU")

METHODS: dict[str, type[Method]] = {
    m.name: m
    for m in (
        BaseMethod,
        MCDMethod,
        EDLMethod,
        DEMethod,
        GANMethod,
        ODINMethod,
        MahaMethod,
        ACETMethod,
        ACET2Method,
        OEMethod,
        CCUMethod,
    )
}


def get_method(name: str) -> type[Method]:
    """The method class called ``name`` (as in the paper's tables)."""
    if name not in METHODS:
        raise ValueError(f"unknown method {name!r}; available: {', '.join(sorted(METHODS))}.")
    return METHODS[name]


def ordered(names) -> list[str]:
    """``names`` in the paper's column order."""
    rank = {m: i for i, m in enumerate(METHOD_ORDER)}
    return sorted(names, key=lambda m: rank.get(m, len(rank)))


__all__ = ["METHODS", "METHOD_ORDER", "BaseMethod", "CCUMethod", "Method", "get_method", "ordered"]
