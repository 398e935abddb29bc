"""The committed timings of ``benchmarks/bench_gpu.py`` as tables (chapter *Training*): the input
pipeline's speed-up, its variants, and the GPU speed targets.

These read the repository's ``benchmarks/timings/`` (the benchmarks commit their runs there), not
the results store: a folder can be given instead.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks" / "timings"


def _bench_rows(directory: Path | None):
    """``(device, network, method, network's timings)`` of every committed run of
    ``benchmarks/bench_gpu.py``, in file order."""
    for path in sorted(Path(directory or BENCHMARKS).glob("bench_gpu_*.json")):
        result = json.loads(path.read_text())
        for kind in ("lenet", "resnet18"):
            r = result.get(kind)
            for method in ("Base", "CCU") if r is not None else ():
                yield result["device"], kind, method, r


def _bench_frame(rows: list, index: list, columns: list) -> pd.DataFrame:
    names = ["device", "network", "method"]
    index = pd.MultiIndex.from_tuples(index, names=names) if index else None
    return pd.DataFrame(rows, columns=columns, index=index)


def pipeline_benchmarks(directory: Path | None = None) -> pd.DataFrame:
    """The committed runs of ``benchmarks/bench_gpu.py`` (chapter *Training*), one row per
    device, network and method (the index): the old (host-fed) and the new (device-resident)
    epoch time, the speed-up, images/s and the speed-up of the input pipeline alone. Empty when
    none is committed."""
    columns = ["images", "old epoch (s)", "new epoch (s)", "speed-up", "images/s"]
    columns += ["loader speed-up"]
    rows, index = [], []
    for device, kind, method, r in _bench_rows(directory):
        row = r[method]
        index.append((device, kind, method))
        rows.append(
            [
                r["n_in"],
                row.get("old_epoch_s", np.nan),
                row["new_epoch_s"],
                row.get("speedup", np.nan),
                row["new_images_per_s"],
                r.get("loader_speedup", np.nan),
            ]
        )
    return _bench_frame(rows, index, columns)


#: the new pipeline's variants of ``benchmarks/bench_gpu.py`` (column: its epoch-time field)
PIPELINE_VARIANTS = {
    "float32": "new_epoch_s",
    "bf16": "new_bf16_epoch_s",
    "channels_last": "new_channels_last_epoch_s",
    "compiled": "new_compile_epoch_s",
    "float32 (compile run)": "compile_run_new_epoch_s",
}


def pipeline_variants(directory: Path | None = None) -> pd.DataFrame:
    """The epoch times (s) of the new pipeline's variants in the committed runs of
    ``benchmarks/bench_gpu.py`` (chapter *Training*): one row per device, network and method,
    one column per variant (:data:`PIPELINE_VARIANTS`; NaN where a run did not time it). A
    compiled epoch is timed in a run of its own: compare it with that run's float32 epoch
    (``float32 (compile run)``), the other variants with ``float32``. Rows without any
    variant are left out; empty when none is committed."""
    rows, index = [], []
    for device, kind, method, r in _bench_rows(directory):
        row = [r[method].get(field, np.nan) for field in PIPELINE_VARIANTS.values()]
        if not all(np.isnan(v) for v in row[1:]):
            index.append((device, kind, method))
            rows.append(row)
    return _bench_frame(rows, index, list(PIPELINE_VARIANTS))


#: issue 19's speed targets for an H200, as (label, network, what, bound, at most): the epochs
#: at full size (60,000 + 60,000 MNIST-sized, 50,000 + 50,000 CIFAR-sized images)
GPU_TARGETS = (
    ("LeNet CCU epoch (s)", "lenet", "ccu_epoch_s", 2.0, True),
    ("ResNet18 CCU epoch (s)", "resnet18", "ccu_epoch_s", 10.0, True),
    ("ResNet18 CCU epoch, new / old pipeline", "resnet18", "ccu_speedup", 5.0, False),
    ("LeNet CCU step / Base step", "lenet", "step_ratio", 1.2, True),
    ("ResNet18 CCU step / Base step", "resnet18", "step_ratio", 1.2, True),
    ("ResNet18 attack 200 x 50 x 500 (s)", "resnet18", "attack_s", 300.0, True),
)


def gpu_benchmark_targets(directory: Path | None = None) -> pd.DataFrame:
    """The committed GPU runs of ``benchmarks/bench_gpu.py`` against the speed targets
    (:data:`GPU_TARGETS`; chapter *Training*): one row per device and target with the measured
    value, the target and whether it is met. A CCU step sees 128 in- and 128 out-images, a
    Base step 128: the step ratio is per step. An attack timed on fewer seeds than 200 is
    scaled to 200 (the seeds are independent batches of restarts) and says so; a value not
    measured is neither met nor missed (None). Empty when no GPU run is committed (CPU runs
    have no targets)."""
    rows, index = [], []
    for path in sorted(Path(directory or BENCHMARKS).glob("bench_gpu_*.json")):
        result = json.loads(path.read_text())
        if result["device"].startswith("CPU"):
            continue
        for label, kind, what, bound, at_most in GPU_TARGETS:
            r = result.get(kind)
            if r is None:
                continue
            note = ""
            if what == "ccu_epoch_s":
                value = r["CCU"]["new_epoch_s"]
            elif what == "ccu_speedup":
                value = r["CCU"].get("speedup", np.nan)
            elif what == "step_ratio":
                value = r["ccu_over_base_step"]
            else:
                attack = r.get("attack")
                if attack is None:  # e.g. a run stopped by its time box before the attack
                    value = np.nan
                else:
                    value = attack["seconds"] * 200 / attack["seeds"]
                    if attack["seeds"] != 200:
                        note = f"scaled linearly from {attack['seeds']} seeds"
            if np.isnan(value):  # e.g. a run with --skip-old: no speed-up to judge
                met, note = None, "not measured"
            else:
                met = bool(value <= bound if at_most else value >= bound)
            index.append((result["device"], label))
            rows.append([value, ("≤ " if at_most else "≥ ") + f"{bound:g}", met, note])
    index = pd.MultiIndex.from_tuples(index, names=["device", "target"]) if index else None
    return pd.DataFrame(rows, columns=["measured", "target (H200)", "met", "note"], index=index)
