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
