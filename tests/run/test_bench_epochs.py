"""benchmarks/bench_epochs.py (call 0 of a lease: each long method's epoch timed alone), run
small on the CPU: the numbers the planner reads, and one method's failure costing no other's."""

import importlib.util
import json
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location(
    "bench_epochs", REPO / "benchmarks" / "bench_epochs.py"
)
bench_epochs = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bench_epochs)


def test_each_method_is_timed_alone_and_a_failure_is_recorded_not_raised(tmp_path):
    out = tmp_path / "epochs.json"
    argv = ["--dataset", "digits", "--batches", "2", "--device", "cpu", "--out", str(out),
            "--attack-centres", "2"]  # fmt: skip
    timed = bench_epochs.main([*argv, "--methods", "DE", "NoSuch", "ACET"])
    assert json.loads(out.read_text()) == json.loads(json.dumps(timed))
    de, acet = timed["by_method"]["DE"], timed["by_method"]["ACET"]
    for t in (de, acet):  # two epochs of two batches; the second scaled to the whole set
        assert t["batches"] == 2 and len(t["epoch_seconds"]) == 2
        assert t["full_epoch_s"] > t["epoch_seconds"][1] > 0
    assert acet["inner_attack"]["cuda_graphs"] is False  # on the CPU: eager
    assert "error" in timed["by_method"]["NoSuch"]
    for t in (de, acet):  # its attack: 5 and 10 steps timed, the protocol's 500 extrapolated
        attack = t["attack"]
        assert attack["steps_timed"] == [5, 10] and attack["iterates"] == 2 * 50
        assert attack["attack_full_s"] >= attack["seconds"][0] > 0
    assert len(timed["data_checksum"]) == 64 and timed["ccu_version"] and timed["commit"]


def test_a_graphed_epoch_is_planned_with_its_checks_against_the_eager_step(tmp_path, monkeypatch):
    """Call 0 times steps 31 to 60, which hold no check of the graphs against the eager step;
    a whole epoch holds one every GraphedStep.check_every steps (each an eager step more, and
    the state saved and compared): the epoch the planner reads includes them. The graphs here
    are stand-ins replaying the step (the CPU has none); CCU_CUDA_GRAPHS=0 turns them off for
    the eager epochs, as on the device."""
    import os

    from ccu.methods import graphed_step, training

    monkeypatch.setattr(
        training, "graphs_wanted", lambda device: os.environ.get("CCU_CUDA_GRAPHS") != "0"
    )
    monkeypatch.setattr(graphed_step, "cuda_warmup", lambda step, x, y, z: step(x, y, z))
    monkeypatch.setattr(graphed_step, "cuda_sync_checked", lambda warmup, *args: warmup(*args))
    monkeypatch.setattr(graphed_step, "cuda_capture", lambda step, x, y, z: step)
    make = training.make_optimizer
    monkeypatch.setattr(
        training, "make_optimizer", lambda model, settings, capturable=False: make(model, settings)
    )
    argv = ["--dataset", "digits", "--batches", "3", "--device", "cpu", "--no-attack"]
    t = bench_epochs.main([*argv, "--methods", "Base"])["by_method"]["Base"]
    assert t["training_step"]["cuda_graphs"] and t["step_graphs_speedup"] > 0
    steps = 1e3 * t["graphed_epoch_s"] / t["ms_per_batch"]  # the whole set's batches
    checks = steps / graphed_step.GraphedStep.check_every
    assert abs(t["check_s_per_epoch"] - checks * 2 * t["eager_full_epoch_s"] / steps) < 1e-9
    assert abs(t["full_epoch_s"] - t["graphed_epoch_s"] - t["check_s_per_epoch"]) < 1e-9
    assert t["check_s_per_epoch"] > 0
    # the timed epoch's replays (here the stand-ins' wall clock; CUDA events on the device):
    # the share of its wall time the graphs kept the GPU busy, which the planner shares out
    assert 0 < t["gpu_busy_s"] <= t["epoch_seconds"][1] and 0 < t["gpu_busy_fraction"] <= 1
    monkeypatch.setenv("CCU_CUDA_GRAPHS", "0")  # eager: no replay to time
    eager = bench_epochs.main([*argv, "--methods", "Base"])["by_method"]["Base"]
    assert "gpu_busy_fraction" not in eager and "training_step" not in eager


def test_the_gpus_utilisation_is_read_from_nvidia_smi_and_is_none_without_it(tmp_path):
    """An eager attack's GPU time cannot be read from CUDA events (they hold the host's gaps):
    call 0 samples nvidia-smi's utilisation while the attack is timed; no nvidia-smi (or no
    sample) gives no number, never an error."""
    with bench_epochs.GpuUtilisation(command=["sh", "-c", "echo 40; echo 60; echo x"]) as gpu:
        pass
    assert gpu.fraction == 0.5
    with bench_epochs.GpuUtilisation(command=[str(tmp_path / "no-nvidia-smi")]) as gpu:
        pass
    assert gpu.fraction is None
    with bench_epochs.GpuUtilisation(command=["sh", "-c", "echo N/A"]) as gpu:
        pass  # a GPU that does not say
    assert gpu.fraction is None
