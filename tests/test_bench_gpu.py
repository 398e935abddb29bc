"""The GPU benchmark keeps running (tiny sizes on the CPU): old and new pipelines, the attack."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_bench_gpu_runs_small(tmp_path):
    spec = importlib.util.spec_from_file_location("bench_gpu", ROOT / "benchmarks/bench_gpu.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    out = tmp_path / "bench.json"
    args = ["--device", "cpu", "--networks", "lenet", "--n-train", "256", "--epochs", "1"]
    args += ["--fit-points", "200", "--seeds", "3", "--restarts", "2", "--attack-steps", "2"]
    result = bench.main([*args, "--precision", "bf16", "--out", str(out)])
    r = result["lenet"]
    for method in ("Base", "CCU"):
        row = r[method]
        assert row["old_epoch_s"] > 0 and row["new_epoch_s"] > 0 and row["new_bf16_epoch_s"] > 0
        assert row["speedup"] == row["old_epoch_s"] / row["new_epoch_s"]
    assert r["steps_per_epoch"] == 2 and r["attack"]["seeds"] == 3
    assert out.exists() and any("CCU step / Base step" in line for line in bench.summary(result))


def test_the_committed_timings_are_found_by_the_training_chapter():
    from ccu import report

    table = report.pipeline_benchmarks()
    assert {"lenet", "resnet18"} <= set(table.index.get_level_values("network")) and len(table) >= 4
    assert (table["speed-up"] > 0).all() and (table["loader speed-up"] > 1).all()
