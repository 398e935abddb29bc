"""The modules that moved into packages by role (after version 0.5.0), under their old names.

``import ccu.results`` or ``from ccu.config import get_profile`` in an older notebook still
works: the old name is the new module itself (one module object, so its state is shared), and
a :class:`DeprecationWarning` names the new place. ``CHANGELOG.md`` lists every move.

Written by hand (a meta-path finder, :mod:`importlib.abc`): Python has no built-in alias of
one module name for another.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import types
import warnings

#: old module name -> new module name, or the new modules a split module's names went to (the
#: old name is then a module that looks each name up in them, in order)
MOVED: dict[str, str | tuple[str, ...]] = {
    "ccu.validation": "ccu.core.validation",
    "ccu.errors": "ccu.core.errors",
    "ccu.settings": "ccu.core.settings",
    "ccu.metric": "ccu.core.metric",
    "ccu.density": ("ccu.core.density", "ccu.core.gmm"),
    "ccu.diag_gmm": "ccu.core.diag_gmm",
    "ccu.density_check": "ccu.core.density_check",
    "ccu.testing": "ccu.core.density_check",
    "ccu.model": "ccu.core.model",
    "ccu.bounds": "ccu.core.bounds",
    "ccu.attacks": "ccu.core.attacks",
    "ccu.losses": "ccu.core.losses",
    "ccu.lp": "ccu.core.lp",
    "ccu.nets": "ccu.core.nets",
    "ccu.initialisation": "ccu.core.initialisation",
    "ccu.evaluate": "ccu.core.evaluate",
    "ccu.train": "ccu.methods.training",
    "ccu.prefit": "ccu.methods.prefit",
    "ccu.experiment": "ccu.run.experiment",
    "ccu.steps": ("ccu.run.steps", "ccu.run.deadline", "ccu.run.run_times"),
    "ccu.deadline": "ccu.run.deadline",
    "ccu.gpuslots": "ccu.run.gpuslots",
    "ccu.adversarial_noise": "ccu.run.adversarial_noise",
    "ccu.balls": "ccu.run.balls",
    "ccu.config": "ccu.run.config",
    "ccu.checks": "ccu.run.checks",
    "ccu.density_comparison": "ccu.run.density_comparison",
    "ccu.guarantees": (
        "ccu.run.guarantees",
        "ccu.core.guarantees",
        "ccu.report.guarantees",
        "ccu.store.records",
    ),
    "ccu.results": "ccu.store.results",
    "ccu.records": "ccu.store.records",
    "ccu.reference_results": ("ccu.store.reference_results", "ccu.run.reference"),
    "ccu.plugins": "ccu.store.plugins",
    "ccu.glance": "ccu.report.glance",
    "ccu.aggregate": "ccu.report.aggregate",
    "ccu.chapter": "ccu.book.chapter",
    "ccu.book_checks": "ccu.book.checks",
    "ccu.equations": "ccu.book.equations",
    "ccu.plots": "ccu.book.plots",
}


#: what the import system sets on a module it loads
_IMPORT_ATTRIBUTES = ("__spec__", "__loader__", "__name__", "__package__", "__file__", "__path__")


class _Alias(importlib.abc.Loader):
    def __init__(self, new: str | tuple[str, ...]):
        self.new = new

    def create_module(self, spec):
        if isinstance(self.new, str):
            module = importlib.import_module(self.new)
            # the import system stamps the old name's spec on the module it gets; exec_module
            # puts the module's own back, so that it stays what it is under its new name
            self.own = {k: v for k, v in vars(module).items() if k in _IMPORT_ATTRIBUTES}
            return module
        parts = [importlib.import_module(name) for name in self.new]
        module = types.ModuleType(spec.name, f"{spec.name}, split into {', '.join(self.new)}.")

        def __getattr__(name: str):
            for part in parts:
                if hasattr(part, name):
                    return getattr(part, name)
            raise AttributeError(f"module {spec.name!r} has no attribute {name!r}")

        module.__getattr__ = __getattr__
        return module

    def exec_module(self, module):  # the new modules have run already
        if isinstance(self.new, str):
            vars(module).update(self.own)


class MovedModuleFinder(importlib.abc.MetaPathFinder):
    """Finds an old module name of :data:`MOVED` and gives the new module, with a warning."""

    def find_spec(self, fullname, path=None, target=None):
        new = MOVED.get(fullname)
        if new is None:
            return None
        where = new if isinstance(new, str) else " / ".join(new)
        warnings.warn(
            f"{fullname} moved to {where} (the layout by role after ccu 0.5.0); import "
            f"{where} instead.",
            DeprecationWarning,
            stacklevel=2,
        )
        return importlib.util.spec_from_loader(fullname, _Alias(new))


def install() -> None:
    """Put the finder on :data:`sys.meta_path` once."""
    if not any(isinstance(f, MovedModuleFinder) for f in sys.meta_path):
        sys.meta_path.append(MovedModuleFinder())
