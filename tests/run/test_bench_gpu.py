"""The GPU benchmark keeps running (tiny sizes on the CPU): old and new pipelines, the attack."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _benchmark(name: str):
    """``benchmarks/<name>.py`` as a module (the benchmarks are scripts, not in the package)."""
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_bench_gpu_runs_small(tmp_path):
    bench = _benchmark("bench_gpu")
    out = tmp_path / "bench.json"
    # 64 images: bf16 convolutions are slow on a CPU (9 of the test's 22 s with 128)
    args = ["--device", "cpu", "--networks", "lenet", "--n-train", "64", "--epochs", "1"]
    args += ["--fit-points", "200", "--seeds", "3", "--restarts", "2", "--attack-steps", "2"]
    result = bench.main([*args, "--precision", "bf16", "--out", str(out)])
    r = result["lenet"]
    for method in ("Base", "CCU"):
        row = r[method]
        assert row["old_epoch_s"] > 0 and row["new_epoch_s"] > 0 and row["new_bf16_epoch_s"] > 0
        assert row["speedup"] == row["old_epoch_s"] / row["new_epoch_s"]
    # 64 in- and 64 out-images: one step
    assert r["steps_per_epoch"] == 1 and r["attack"]["seeds"] == 3
    assert out.exists() and any("CCU step / Base step" in line for line in bench.summary(result))


def test_a_bench_stopped_during_the_attack_keeps_its_epoch_times(tmp_path, monkeypatch):
    """The H200 run's ResNet18 invocation ran out of its time box in the attack and lost
    every ResNet18 row: --out is written once both methods are timed, before the attack."""
    bench = _benchmark("bench_gpu")

    def killed(*args, **kwargs):
        raise KeyboardInterrupt  # timeout -s INT

    monkeypatch.setattr(bench, "bench_attack", killed)
    out = tmp_path / "bench.json"
    args = ["--device", "cpu", "--networks", "lenet", "--n-train", "256", "--epochs", "1"]
    args += ["--fit-points", "200", "--seeds", "3", "--restarts", "2", "--attack-steps", "2"]
    with pytest.raises(KeyboardInterrupt):
        bench.main([*args, "--skip-old", "--out", str(out)])
    r = json.loads(out.read_text())["lenet"]
    assert r["CCU"]["new_epoch_s"] > 0 and r["ccu_over_base_step"] > 0 and "attack" not in r


def test_the_committed_timings_are_found_by_the_training_chapter():
    from ccu import report

    table = report.pipeline_benchmarks()
    assert {"lenet", "resnet18"} <= set(table.index.get_level_values("network")) and len(table) >= 4
    # a run stopped by its time box may lack the input pipeline's timing (NaN), never hold 0
    assert (table["speed-up"] > 0).all() and (table["loader speed-up"].dropna() > 1).all()
    assert {"NVIDIA H100 80GB HBM3", "NVIDIA H200"} <= set(table.index.get_level_values("device"))
    variants = report.pipeline_variants()
    h200 = variants.xs("NVIDIA H200", level="device")
    assert h200.loc[("lenet", "CCU"), "compiled"] > 0  # timed beside its own float32 epoch
    assert h200[["compiled", "float32 (compile run)"]].notna().sum().tolist() == [2, 2]


def test_gpu_runs_are_judged_against_the_targets(tmp_path):
    from ccu import report

    committed = report.gpu_benchmark_targets()
    assert len(committed) >= 6 and set(committed.index.get_level_values("device")) >= {
        "NVIDIA H100 80GB HBM3"
    }
    # a run of its own: CPU runs have no targets; the attack is scaled to 200 seeds
    row = {"new_epoch_s": 1.5, "speedup": 6.0}
    gpu = {
        "device": "GPU X",
        "resnet18": {
            "CCU": dict(row, new_epoch_s=12.0),
            "ccu_over_base_step": 1.1,
            "attack": {"seeds": 20, "restarts": 50, "steps": 500, "seconds": 31.0},
        },
        "lenet": {"CCU": row, "ccu_over_base_step": 2.0},
    }
    (tmp_path / "bench_gpu_x.json").write_text(json.dumps(gpu))
    (tmp_path / "bench_gpu_cpu.json").write_text(json.dumps({**gpu, "device": "CPU x86_64"}))
    t = report.gpu_benchmark_targets(tmp_path).droplevel("device")
    assert len(t) == 6
    assert not t.loc["ResNet18 CCU epoch (s)", "met"]
    assert t.loc["LeNet CCU epoch (s)", "met"] and t.loc["ResNet18 CCU step / Base step", "met"]
    assert t.loc["ResNet18 CCU epoch, new / old pipeline", "met"]
    assert not t.loc["LeNet CCU step / Base step", "met"]
    attack = t.loc["ResNet18 attack 200 x 50 x 500 (s)"]
    assert attack["measured"] == 310.0 and not attack["met"] and "20 seeds" in attack["note"]
    # a run without its attack (stopped by a time box): shown as not measured, neither met nor not
    del gpu["resnet18"]["attack"]
    (tmp_path / "bench_gpu_x.json").write_text(json.dumps(gpu))
    attack = report.gpu_benchmark_targets(tmp_path).droplevel("device").iloc[-1]
    assert attack.name == "ResNet18 attack 200 x 50 x 500 (s)" and attack["met"] is None
    assert attack["note"] == "not measured"


def test_bench_lanes_times_a_grid_per_number_of_lanes(tmp_path, monkeypatch):
    """benchmarks/bench_lanes.py: one fresh lease call per JOBS value, each in folders of its
    own, the speed-up against the first, the file written after each call, and a failed call
    stops it with its exit code. The lease call itself (tools/lease_run.sh) is stubbed here: its
    runs on the CPU are tests/run/test_lease.py's."""
    import subprocess

    bench = _benchmark("bench_lanes")
    calls = []

    def lease_call(cmd, cwd, env, capture_output, text):
        calls.append((cmd, env))
        assert cmd[:2] == ["bash", "tools/lease_run.sh"] and Path(cwd) == ROOT
        assert not Path(env["CCU_RESULTS"]).exists()  # a fresh machine for every call
        failed = env["JOBS"] == "3"
        return subprocess.CompletedProcess(cmd, 1 if failed else 0, "out", "err")

    monkeypatch.setattr(bench.subprocess, "run", lease_call)
    out = tmp_path / "lanes.json"
    args = ["--dataset", "digits", "--profile", "smoke", "--methods", "CCU", "Base"]
    args += ["--device", "cpu", "--threads", "2", "--out", str(out)]
    tiny = {"epochs": 1, "n_train": 200}
    result = bench.main([*args, "--jobs", "1", "2", "--overrides", json.dumps(tiny)])
    assert [c[0][2:] for c in calls] == [["digits", "CCU", "Base"]] * 2
    assert [c[1]["JOBS"] for c in calls] == ["1", "2"]
    assert json.loads(calls[0][1]["OVERRIDES"]) == tiny and calls[0][1]["PROFILE"] == "smoke"
    assert calls[0][1]["CCU_RESULTS"] != calls[1][1]["CCU_RESULTS"]
    assert set(result["runs"]) == {"1", "2"} and result["device"].startswith("CPU")
    for r in result["runs"].values():
        assert r["exit_code"] == 0 and r["seconds"] > 0
    assert result["runs"]["1"]["speedup"] == 1.0
    expected = result["runs"]["1"]["seconds"] / result["runs"]["2"]["seconds"]
    assert result["runs"]["2"]["speedup"] == expected
    assert json.loads(out.read_text()) == json.loads(json.dumps(result))
    with pytest.raises(SystemExit, match="digits with JOBS=3 failed .exit 1."):
        bench.main([*args, "--jobs", "1", "3"])
    assert set(json.loads(out.read_text())["runs"]) == {"1"}  # what it measured is kept
