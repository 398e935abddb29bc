"""The paper's tables and ours beside them, from saved or committed results (pandas):
:mod:`~ccu.report.tables` (Tables 1-3 and the run tables), :mod:`~ccu.report.glance` (every
number at a glance), :mod:`~ccu.report.aggregate` (mean ± sd over seeds),
:mod:`~ccu.report.guarantees` (CCU in the field's terms), :mod:`~ccu.report.benchmarks`
(the committed GPU timings).

``ccu.report.ood_table`` and the other names of :mod:`~ccu.report.tables` resolve here too, as
they did when ``ccu.report`` was one module. It imports no method and no run.
"""

import importlib


def __getattr__(name: str):
    # the names of ccu.report.tables (and of ccu.report.benchmarks, which held the GPU tables
    # when ccu.report was one module), imported on first use
    if name.startswith("__"):  # e.g. __path__ lookups during imports: not ours
        raise AttributeError(name)
    for module in map(importlib.import_module, ("ccu.report.tables", "ccu.report.benchmarks")):
        if hasattr(module, name):
            return getattr(module, name)
    raise AttributeError(f"module 'ccu.report' has no attribute {name!r}")
