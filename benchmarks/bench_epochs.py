"""Seconds of one training epoch of the lease's long methods, each alone on the GPU.

The planner's costs for MCD, GAN, ACET and ACET2 come from a call that trained all four at
once (2026-11-28: 7.0, 15.2, 33.7 and 34.4 s an epoch); MCD's and GAN's VGG13s and ACET's
launch-bound inner attacks may have slowed one another, and DE's member was never timed. This
trains each method of ``--methods`` on the real data at the ``paper`` profile (its networks:
VGG13 for MCD and GAN; every method's whole step in CUDA graphs where
:mod:`ccu.methods.graphed_step` turns them on, ACET's with its inner attack inside, and then
the same two epochs eagerly too: ``step_graphs_speedup``), one after another in one
process, on ``--batches`` batches (an epoch of ``n_train = batches x batch size``) for two epochs, and takes the second epoch (the first holds
cuDNN's and the graphs' set-up), scaled to a full epoch of the dataset. DE is timed as one
member (``ensemble`` 1): its members train at once, each in a process of its own. A graphed
epoch also gets its checks against the eager step added (``check_s_per_epoch``: the timed
batches hold none) and the share of its wall time its replays kept the GPU busy
(``gpu_busy_fraction``, from CUDA events around each replay: :class:`ReplayClock`), by which
the planner shares the GPU between lanes.

Then the trained model's Table 1 attack is timed (``--attack``, on by default): the attack of
the paper's protocol (every certified ball x 50 restarts) in the committed balls of
``reference-results/paper/<dataset>/`` (else as many uniform-noise balls of radius 1 under the
identity metric), run for 1 step untimed (set-up), then for 5 and for 10 PGD steps timed; the
difference gives the seconds a step,
which scaled to the protocol's 500 steps plus what both runs share is ``attack_full_s``. MCD
scores seven dropout passes of a VGG13 per step, so its attack may cost far more than a LeNet's
(~40 s): until measured it is a guess (``tools/lease.py``'s ``COST_S``). Nothing is saved but
the JSON; ``tools/lease.py absorb`` commits it as
``benchmarks/timings/epochs_<dataset>_gpu.json`` and ``plan`` then uses these epochs for the
methods it holds (``tools/lease.py``'s ``alone_train_seconds``).

Usage (on the device, the data gathered as ``tools/lease_run.sh`` gathers it)::

    python3 tools/pack_data.py --gather .devdata/mnist --into /tmp/ccu-devdata/mnist
    CCU_OFFLINE_DATA=/tmp/ccu-devdata/mnist PYTHONPATH=$PWD python3 benchmarks/bench_epochs.py \\
        --dataset mnist --out $OUT/epochs_mnist_gpu.json
    python benchmarks/bench_epochs.py --dataset digits --batches 2 --device cpu   # a check
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import math
import os
import platform
import time

import torch

#: the methods the planner cannot place without their epoch measured alone
METHODS = ("MCD", "GAN", "DE", "ACET", "ACET2")


#: the attack's runs timed: their step counts (the difference gives the seconds a step)
ATTACK_STEPS = (5, 10)


def attack_alone(m, prof, shape, balls_dir, centres: int | None = None, seed: int = 0) -> dict:
    """Seconds of the Table 1 attack (``prof``'s restarts and steps) on the trained method
    ``m`` (images of ``shape``): run for each of :data:`ATTACK_STEPS` steps in the balls of
    ``balls_dir`` (or, when it holds none, ``centres`` uniform-noise balls of radius 1, the
    identity metric), the
    seconds a step from their difference, scaled to ``prof.attack_steps``."""
    from ccu.core.metric import Mahalanobis
    from ccu.data.images import uniform_noise
    from ccu.run.adversarial_noise import TABLE1_GRADIENT, attack_method
    from ccu.run.balls import Balls
    from ccu.store.results import CorruptResultError

    balls = None
    if balls_dir is not None and Balls.exists(balls_dir):
        try:
            balls = Balls.load(balls_dir)
        except CorruptResultError:  # e.g. balls.npz not committed: timed in noise balls
            balls = None
    if balls is not None:
        x0, radii, metric = balls.centres[balls.ok], balls.radii[balls.ok], balls.metric
        where = "committed"
    else:
        n = centres or prof.n_centres
        x0 = uniform_noise(n, shape, seed + 1000)
        radii = torch.ones(n, dtype=torch.float64)
        d = math.prod(shape)
        metric = Mahalanobis(torch.ones(d), torch.eye(d))
        where = "uniform noise, radius 1, identity metric"
    if centres is not None:
        x0, radii = x0[:centres], radii[:centres]
    m.model.eval()
    metric = metric.to(m.device)
    # one step first, untimed: the attack's batch shapes tuned (cuDNN) and its memory taken
    attack_method(m, x0, radii, metric, 1, prof.attack_restarts, seed, gradient=TABLE1_GRADIENT)
    seconds = []
    gpu = GpuUtilisation() if torch.device(m.device).type == "cuda" else None  # none: the CPU
    with gpu or contextlib.nullcontext():
        for steps in ATTACK_STEPS:
            _sync(m.device)
            began = time.perf_counter()
            attack_method(m, x0, radii, metric, steps, prof.attack_restarts, seed,
                          gradient=TABLE1_GRADIENT)  # fmt: skip
            _sync(m.device)
            seconds.append(time.perf_counter() - began)
    (a, b), (sa, sb) = ATTACK_STEPS, seconds
    per_step = (sb - sa) / (b - a)
    if per_step <= 0:  # noise larger than the 5 steps more: the longer run's mean step
        per_step = sb / b
    shared = max(sa - a * per_step, 0.0)
    return {
        "balls": where,
        "iterates": len(x0) * prof.attack_restarts,
        "steps_timed": list(ATTACK_STEPS),
        "seconds": seconds,
        "ms_per_step": 1e3 * per_step,
        "attack_full_s": shared + per_step * prof.attack_steps,
        # the share of the timed attacks the GPU was busy (nvidia-smi; none on the CPU): lanes
        # attack beside graphed trainings, and a busy attack takes its turns too
        **({"gpu_busy_fraction": gpu.fraction} if gpu and gpu.fraction is not None else {}),
    }


class GpuUtilisation:
    """The GPU's utilisation while a block runs, read from ``nvidia-smi`` every ``every_s``
    seconds by a thread (``utilization.gpu``: the share of the driver's last sample period in
    which a kernel ran), as a share of the time: :attr:`fraction` (None where ``nvidia-smi``
    is missing, fails or gave no number). An eager attack's GPU time cannot be read from CUDA
    events (they hold the host's gaps too), so the driver's own counter is read. One query a
    sample, each run to its end (no looping ``nvidia-smi`` to stop: its last lines could
    stay in its buffer); at least one is taken. The command is ``CCU_NVIDIA_SMI`` where set.

    >>> with GpuUtilisation(command=["sh", "-c", "echo 40; echo 60"]) as gpu:
    ...     pass
    >>> gpu.fraction
    0.5
    """

    def __init__(self, command=None, every_s: float = 0.2):
        default = os.environ.get("CCU_NVIDIA_SMI", "nvidia-smi").split()
        self.command = command or [*default, "--query-gpu=utilization.gpu",
                                   "--format=csv,noheader,nounits"]  # fmt: skip
        self.every_s = every_s
        self.fraction: float | None = None
        self.samples: list[float] = []

    def _sample(self) -> None:
        import subprocess

        while True:
            try:
                out = subprocess.run(self.command, capture_output=True, text=True,
                                     timeout=10).stdout  # fmt: skip
            except (OSError, subprocess.SubprocessError):  # no nvidia-smi: no number
                return
            for line in out.splitlines():
                try:  # one GPU: one number a line
                    self.samples.append(float(line.strip().split(",")[0]))
                except ValueError:
                    continue
            if self._stop.wait(self.every_s):
                return

    def __enter__(self):
        import threading

        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join(timeout=15)  # an nvidia-smi stuck in the driver: its thread left
        samples = list(self.samples)
        if samples:
            mean = sum(samples) / len(samples)
            self.fraction = min(max(mean / 100, 0.0), 1.0)
        return False


def _sync(device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


class ReplayClock:
    """Times every replay of a CUDA graph (``ccu.methods.cuda_graphs.replay_timer``): on CUDA
    by events recorded on the stream before and after it (their elapsed time is the GPU's
    time on the graph, whatever the host did meanwhile), elsewhere by the wall clock (the
    stand-in graphs of the tests). :meth:`busy` sums a range of them: the seconds an epoch kept
    the GPU busy with its graphs, which the planner sets against the epoch's wall time (lanes
    that replay graphs take the GPU in turns: ``tools/lease.py``'s ``gpu_seconds``)."""

    def __init__(self, device):
        self.cuda = torch.device(device).type == "cuda"
        self.spans: list = []

    def __call__(self, replay, *inputs):
        if not self.cuda:
            began = time.perf_counter()
            out = replay(*inputs)
            self.spans.append(time.perf_counter() - began)
            return out
        before = torch.cuda.Event(enable_timing=True)
        after = torch.cuda.Event(enable_timing=True)
        before.record()
        out = replay(*inputs)
        after.record()
        self.spans.append((before, after))
        return out

    def busy(self, first: int, last: int) -> float:
        """Seconds of the replays ``first`` to ``last`` (indices into :attr:`spans`)."""
        spans = self.spans[first:last]
        if not self.cuda:
            return float(sum(spans))
        torch.cuda.synchronize()
        return sum(a.elapsed_time(b) for a, b in spans) / 1e3


def epoch_alone(data_all, dataset: str, method: str, batches: int, device: str, seed=0,
                attack: bool = False, balls_dir=None, centres=None) -> dict:  # fmt: skip
    """``method`` trained for two epochs of ``batches`` batches of ``data_all`` (``dataset``
    loaded once for every method) at the ``paper`` profile: its second epoch's seconds, per
    batch and scaled to the whole training set; with ``attack``, its attack timed too
    (:func:`attack_alone`)."""
    from ccu.methods import get_method
    from ccu.run.config import get_profile

    batch = data_all.spec.settings.batch_size
    n_train = min(batches * batch, len(data_all.train_x))
    prof = get_profile("paper", dataset, epochs=2, n_train=n_train, ensemble=1)
    data = data_all.subset(prof.n_train, prof.n_test)
    cls = get_method(method)
    # no milestone inside the two epochs: a new learning rate would be captured again in the
    # timed epoch, which a 100-epoch run does three times in all (the rates change no speed)
    settings = dataclasses.replace(data.spec.settings, milestones=())
    m = cls(data.spec, settings, prof, seed=seed, device=device)
    began = time.perf_counter()
    m.build(data)
    built = time.perf_counter() - began
    from ccu.methods import cuda_graphs

    clock, ends = ReplayClock(device), [0]  # the replays timed, and how many by each epoch's end
    cuda_graphs.replay_timer = clock
    try:
        history = m.fit(data, on_epoch_end=lambda done, total: ends.append(len(clock.spans)))
    finally:
        cuda_graphs.replay_timer = None
    batches = math.ceil(n_train / batch)
    per_batch = history.seconds[-1] / batches
    steps = math.ceil(len(data_all.train_x) / batch)
    out = {
        "network": m.network_kind(),
        "batches": batches,
        "epoch_seconds": list(history.seconds),
        "build_seconds": built,
        "ms_per_batch": 1e3 * per_batch,
        "full_epoch_s": per_batch * steps,
        **m.training_record(),  # how it ran, e.g. its steps or ACET's inner attack in graphs
    }
    if (out.get("training_step") or {}).get("cuda_graphs"):
        # the same two epochs with eager steps (CCU_CUDA_GRAPHS=0), from the weights trained so
        # far: the graphs' speed-up, measured in this run (the planner uses the graphed epoch)
        from ccu.methods.cuda_graphs import ENV

        before = os.environ.get(ENV)
        os.environ[ENV] = "0"
        try:
            eager = m.fit(data).seconds[-1] / batches
        finally:
            if before is None:
                del os.environ[ENV]
            else:
                os.environ[ENV] = before
        out["eager_full_epoch_s"] = eager * steps
        out["step_graphs_speedup"] = eager / per_batch if per_batch > 0 else None
        # the timed epoch (steps 31 to 60) holds no check against the eager step; a whole
        # epoch holds one every GraphedStep.check_every steps, each an eager step and the
        # state saved, put back and compared (taken as a second eager step): the planner's
        # epoch includes them
        from ccu.methods.graphed_step import GraphedStep

        checks = steps / GraphedStep.check_every
        out["graphed_epoch_s"] = out["full_epoch_s"]
        out["check_s_per_epoch"] = checks * 2 * eager
        out["full_epoch_s"] += out["check_s_per_epoch"]
    if len(ends) >= 3 and ends[-1] > ends[-2] and history.seconds[-1] > 0:
        # the timed epoch's replays (a training step's graphs, or ACET's inner attack's): the
        # share of its wall time they kept the GPU busy
        # of the epoch's steps that replayed (EDL captures a graph each epoch: its first
        # steps run eagerly), taken as the share of the whole epoch's
        replayed = ends[-1] - ends[-2]
        busy = clock.busy(ends[-2], ends[-1])
        out["gpu_busy_s"] = busy
        out["gpu_busy_fraction"] = min(busy * batches / (replayed * history.seconds[-1]), 1.0)
    if attack:
        try:
            out["attack"] = attack_alone(m, prof, data.spec.shape, balls_dir, centres, seed)
        except Exception as exc:  # the epoch's numbers stand without it
            out["attack"] = {"error": f"{type(exc).__name__}: {exc}"}
    return out


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dataset", default="mnist")
    ap.add_argument("--methods", nargs="+", default=list(METHODS))
    ap.add_argument("--batches", type=int, default=30, help="batches an epoch (default 30)")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--out", help="write the numbers as JSON here")
    ap.add_argument("--no-attack", dest="attack", action="store_false",
                    help="time the epochs only, not each method's Table 1 attack")  # fmt: skip
    ap.add_argument("--balls", help="the balls to attack in (default: the committed ones of "
                    "reference-results/paper/<dataset>/, else uniform-noise balls)")  # fmt: skip
    ap.add_argument("--attack-centres", type=int,
                    help="attack only this many of the balls (a check on the CPU)")  # fmt: skip
    args = ap.parse_args(argv)
    os.environ.setdefault("CCU_PROGRESS", "0")
    import ccu
    from ccu.data.registry import load_dataset
    from ccu.store.reference_results import REFERENCE_RESULTS, current_commit

    balls_dir = args.balls or REFERENCE_RESULTS / "paper" / args.dataset

    data = load_dataset(args.dataset, seed=0)  # once: each method takes its batches from it
    out = {
        "dataset": args.dataset,
        # the data the epochs ran on, the code and the machine (CCU_COMMIT where .git is stale)
        "data_checksum": data.checksum(),
        "ccu_version": ccu.__version__,
        "commit": current_commit(),
        "args": vars(args),
        "device": args.device,
        "device_name": torch.cuda.get_device_name(0)
        if args.device.startswith("cuda")
        else platform.processor(),
        "torch": torch.__version__,
        "by_method": {},
    }
    for method in args.methods:
        began = time.perf_counter()
        try:
            timed = epoch_alone(data, args.dataset, method, args.batches, args.device,
                                attack=args.attack, balls_dir=balls_dir,
                                centres=args.attack_centres)  # fmt: skip
        except Exception as exc:  # one method's failure must not cost the others' numbers
            timed = {"error": f"{type(exc).__name__}: {exc}"}
        timed["wall_seconds"] = time.perf_counter() - began
        out["by_method"][method] = timed
        print(method, json.dumps(timed), flush=True)
        if args.out:  # after each method: a call cut short keeps what was measured
            with open(args.out, "w") as f:
                json.dump(out, f, indent=1)
    return out


if __name__ == "__main__":
    main()
