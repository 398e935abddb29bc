"""GPU slots: on a machine with several GPUs every job gets its own (no GPU needed to test)."""

import os
import subprocess
import sys
import time

import pytest
from filelock import Timeout

from ccu import gpuslots


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
    with pytest.raises(Timeout):  # all held: a fourth job waits
        gpuslots.acquire(tmp_path, gpus, timeout=0.3, poll=0.05)
    b.release()
    d = gpuslots.acquire(tmp_path, gpus, timeout=1)
    assert d.gpu == b.gpu
    for s in (a, c, d):
        s.release()


def test_a_waiting_job_says_so_and_gets_the_gpu_when_it_is_freed(tmp_path):
    held = gpuslots.acquire(tmp_path, ["7"])
    said = []
    start = time.monotonic()
    with pytest.raises(Timeout):
        gpuslots.acquire(tmp_path, ["7"], timeout=0.2, poll=0.05, announce=said.append)
    assert time.monotonic() - start >= 0.2
    assert said and "waiting" in said[0]
    held.release()
    with gpuslots.acquire(tmp_path, ["7"], timeout=0.5) as again:
        assert again.gpu == "7"


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
import os, sys, time
from ccu import gpuslots
slot = gpuslots.assign(sys.argv[1], announce=lambda m: None)
print(os.environ["CUDA_VISIBLE_DEVICES"], flush=True)
time.sleep(float(sys.argv[2]))
"""


def test_concurrent_processes_get_different_gpus_and_a_dead_one_frees_its_gpu(tmp_path):
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="0,1")
    env.pop("SLURM_JOB_ID", None)
    cmd = [sys.executable, "-c", HOLDER, str(tmp_path)]
    procs = [subprocess.Popen([*cmd, "3"], env=env, stdout=subprocess.PIPE, text=True)]
    first = procs[0].stdout.readline().strip()
    procs.append(subprocess.Popen([*cmd, "0"], env=env, stdout=subprocess.PIPE, text=True))
    second = procs[1].stdout.readline().strip()
    assert {first, second} == {"0", "1"}
    procs[1].wait(timeout=30)
    procs[0].kill()  # a killed job leaks nothing: its lock goes with it
    procs[0].wait(timeout=30)
    held = [gpuslots.acquire(tmp_path, ["0", "1"], timeout=2) for _ in range(2)]
    assert sorted(s.gpu for s in held) == ["0", "1"]


def test_several_jobs_share_a_gpu_after_every_gpu_has_one(tmp_path):
    gpus = ["0", "1"]
    held = [gpuslots.acquire(tmp_path, gpus, jobs_per_gpu=2) for _ in range(4)]
    # spread first: one job on each GPU, then a second on each
    assert [(s.gpu, s.job) for s in held] == [("0", 0), ("1", 0), ("0", 1), ("1", 1)]
    with pytest.raises(Timeout):  # 2 GPUs x 2 jobs are held: a fifth waits
        gpuslots.acquire(tmp_path, gpus, jobs_per_gpu=2, timeout=0.2, poll=0.05)
    held[3].release()
    again = gpuslots.acquire(tmp_path, gpus, jobs_per_gpu=2, timeout=1)
    assert (again.gpu, again.job) == ("1", 1)
    for s in held[:3] + [again]:
        s.release()


@pytest.mark.parametrize("bad", [0, -1, 1.5, "2", True])
def test_jobs_per_gpu_must_be_a_positive_integer(tmp_path, bad):
    with pytest.raises(ValueError, match="jobs_per_gpu must be a positive integer"):
        gpuslots.acquire(tmp_path, ["0"], jobs_per_gpu=bad)
