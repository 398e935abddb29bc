"""GPU slots: on a machine with several GPUs every job gets its own (no GPU needed to test).

No test here depends on how fast anything runs: a held slot is probed with ``timeout=0`` (a lock
is either free or not, at once), a waiting job is followed by the events it signals, and a
holder process keeps its slot until the test closes its stdin. Timeouts that remain are hang
guards of minutes, never the thing a test measures."""

import os
import subprocess
import sys
import threading

import pytest
from filelock import Timeout

from ccu.run import gpuslots


def test_visible_gpus_come_from_cuda_visible_devices():
    assert gpuslots.visible_gpus({"CUDA_VISIBLE_DEVICES": "2, 5"}) == ["2", "5"]
    assert gpuslots.visible_gpus({"CUDA_VISIBLE_DEVICES": "GPU-ab12,GPU-cd34"}) == [
        "GPU-ab12",
        "GPU-cd34",
    ]
    assert gpuslots.visible_gpus({"CUDA_VISIBLE_DEVICES": ""}) == []
    assert gpuslots.visible_gpus({"CUDA_VISIBLE_DEVICES": "-1"}) == []


def test_each_holder_gets_its_own_gpu_and_a_released_one_is_reused(tmp_path):
    gpus = ["0", "1", "2"]
    a = gpuslots.acquire(tmp_path, gpus)
    b = gpuslots.acquire(tmp_path, gpus)
    c = gpuslots.acquire(tmp_path, gpus)
    assert sorted([a.gpu, b.gpu, c.gpu]) == gpus
    with pytest.raises(Timeout):  # all held: a fourth job would wait
        gpuslots.acquire(tmp_path, gpus, timeout=0)
    b.release()
    d = gpuslots.acquire(tmp_path, gpus, timeout=0)  # free at once
    assert d.gpu == b.gpu
    for s in (a, c, d):
        s.release()


def test_a_waiting_job_says_so_and_gets_the_gpu_when_it_is_freed(tmp_path):
    held = gpuslots.acquire(tmp_path, ["7"])
    waiting = threading.Event()
    said, got = [], []

    def announce(message):
        said.append(message)
        waiting.set()

    def job():  # waits without a time limit until the GPU is freed
        got.append(gpuslots.acquire(tmp_path, ["7"], poll=0.01, announce=announce))

    worker = threading.Thread(target=job, daemon=True)
    worker.start()
    assert waiting.wait(timeout=300), "the waiting job never said that it waits"  # hang guard
    assert "waiting" in said[0] and not got  # it says so while the GPU is held
    held.release()
    worker.join(timeout=300)  # hang guard
    assert not worker.is_alive() and got[0].gpu == "7"
    assert len(said) == 1  # said once, not at every poll
    got[0].release()


def test_assign_restricts_the_job_to_its_gpu_and_leaves_slurm_alone(tmp_path):
    env = {"CUDA_VISIBLE_DEVICES": "4,6"}
    first = gpuslots.assign(tmp_path, env, announce=lambda m: None)
    assert env["CUDA_VISIBLE_DEVICES"] == "4"
    env2 = {"CUDA_VISIBLE_DEVICES": "4,6"}
    second = gpuslots.assign(tmp_path, env2, announce=lambda m: None)
    assert env2["CUDA_VISIBLE_DEVICES"] == "6"
    first.release()
    second.release()
    slurm = {"CUDA_VISIBLE_DEVICES": "0", "SLURM_JOB_ID": "123"}
    assert gpuslots.assign(tmp_path, slurm) is None
    assert slurm["CUDA_VISIBLE_DEVICES"] == "0"
    with pytest.raises(gpuslots.NoGPUError, match="--device cpu"):
        gpuslots.assign(tmp_path, {"CUDA_VISIBLE_DEVICES": ""})


HOLDER = """
import os, sys
from ccu.run import gpuslots
slot = gpuslots.assign(sys.argv[1], announce=lambda m: None)
print(os.environ["CUDA_VISIBLE_DEVICES"], flush=True)
sys.stdin.read()  # hold the slot until the test closes stdin (or kills this process)
"""


def test_concurrent_processes_get_different_gpus_and_a_dead_one_frees_its_gpu(tmp_path):
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="0,1")
    env.pop("SLURM_JOB_ID", None)
    cmd = [sys.executable, "-c", HOLDER, str(tmp_path)]

    def holder():
        return subprocess.Popen(cmd, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                text=True)  # fmt: skip

    first = holder()
    try:
        gpu_first = first.stdout.readline().strip()  # it holds its slot from here on
        second = holder()
        gpu_second = second.stdout.readline().strip()
        assert {gpu_first, gpu_second} == {"0", "1"}
        second.stdin.close()  # a job that ends frees its GPU
        assert second.wait(timeout=300) == 0  # hang guard
        again = gpuslots.acquire(tmp_path, ["0", "1"], timeout=0)
        assert again.gpu == gpu_second
        again.release()
        with pytest.raises(Timeout):  # the first still holds its GPU: only the other is free
            held = gpuslots.acquire(tmp_path, ["0", "1"], timeout=0)
            try:
                gpuslots.acquire(tmp_path, ["0", "1"], timeout=0)
            finally:
                held.release()
    finally:
        first.kill()  # a killed job leaks nothing: its lock goes with it
        first.wait(timeout=300)
    held = [gpuslots.acquire(tmp_path, ["0", "1"], timeout=0) for _ in range(2)]
    assert sorted(s.gpu for s in held) == ["0", "1"]
    for s in held:
        s.release()


def test_several_jobs_share_a_gpu_after_every_gpu_has_one(tmp_path):
    gpus = ["0", "1"]
    held = [gpuslots.acquire(tmp_path, gpus, jobs_per_gpu=2) for _ in range(4)]
    # spread first: one job on each GPU, then a second on each
    assert [(s.gpu, s.job) for s in held] == [("0", 0), ("1", 0), ("0", 1), ("1", 1)]
    with pytest.raises(Timeout):  # 2 GPUs x 2 jobs are held: a fifth would wait
        gpuslots.acquire(tmp_path, gpus, jobs_per_gpu=2, timeout=0)
    held[3].release()
    again = gpuslots.acquire(tmp_path, gpus, jobs_per_gpu=2, timeout=0)
    assert (again.gpu, again.job) == ("1", 1)
    for s in held[:3] + [again]:
        s.release()


@pytest.mark.parametrize("bad", [0, -1, 1.5, "2", True])
def test_jobs_per_gpu_must_be_a_positive_integer(tmp_path, bad):
    with pytest.raises(ValueError, match="jobs_per_gpu must be a positive integer"):
        gpuslots.acquire(tmp_path, ["0"], jobs_per_gpu=bad)
