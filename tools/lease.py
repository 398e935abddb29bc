"""A GPU lease, planned from git and committed as it goes: ``plan`` prints the device calls,
``absorb`` commits what each call brought back.

A lease is 15 minutes of device time (the machine's start included), at most 10 minutes a
call; the GPU machine is wiped when it ends and only git survives here. So each method runs
start to finish inside one call (``tools/lease_run.sh``: train -> attack in CCU's balls -> its
*part*, no weights), every finished part comes back in that call's files, and ``absorb``
commits it under ``reference-results/<label>/<dataset>/`` at once. The next lease plans from
what git holds: a method with a committed part never runs again::

    python tools/lease.py plan --dataset mnist --budget-s 900        # before the first call
    python tools/lease.py absorb <files_at> --dataset mnist          # after every call

``plan`` starts only the methods that can finish (train, score, attack, pack) inside a call,
from :data:`COST_S` (device seconds per method; measured where a lease measured them, the
parts' provenance records every run's own seconds), biggest first, in up to ``--jobs`` lanes;
a method that no lease holds even alone runs, once call 0 has measured the long methods, as
the reduced variant that fits the lease's first call (``MCD@45`` in the printed lanes: 45
epochs, label ``paper-e45``, its own folder, attacked in ``paper``'s balls, never mixed with
``paper``; a committed variant counts as done). On a dataset no lease has measured
(FMNIST, CIFAR-10) the costs are MNIST's scaled by the committed benchmark of its network
(:func:`estimated_seconds`) until its own call 0 times them (:func:`epochs_bench`); a CCU
that no lease holds is never a variant: the whole grid then runs at ``plan --epochs N``
under its own label. Standard library and
``ccu`` only (``absorb`` rebuilds ``table1.json`` with :func:`ccu.store.reference_results.assemble_reference`).
Exit codes: 0 done; 1 ``prepare --check`` found no carried fit that matches; 2 bad usage; 3
nothing to absorb, or ``prepare`` misses the data; 4 an archive or a part is corrupt or
conflicts with a committed one (nothing of that call is written).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from typing import NamedTuple

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # run as a script from anywhere: the checkout's ccu
from ccu.store.records import BALLS_KEY  # noqa: E402

#: every method of the paper's grid (ccu.methods.METHOD_ORDER; ACET2 from its appendix)
ALL = ["Base", "MCD", "EDL", "DE", "GAN", "ODIN", "Maha", "ACET", "ACET2", "OE", "CCU"]
#: device seconds per method on MNIST at the paper's protocol (100 epochs; 200 centres x 50
#: restarts x 500 steps): (train and score, attack and part), each with its processes' start and
#: data loading, in four lanes on one GPU (an H200). The calls' logs are in reference-results/leases/.
#: Measured 2026-11-28 (paper-mnist-69677792a0f0.log, one call of 512 s): Base 167 s, ODIN 13 s,
#: Maha 11 s (both on Base), EDL 294 s, OE 204 s, CCU 330 s with its initial fit carried
#: (``prepare``; its build 0.8 s) plus ~10 s for its balls; the attacks 54-56 s each while four
#: ran at once, 39-40 s alone, plus ~10 s for each process (``ccu attack --part-out``). Measured
#: 2026-11-28 (paper-e2-mnist-epoch-times-2026-11-28.log, two epochs each, four at once):
#: ACET 33.7 s an epoch, ACET2 34.4 s, GAN (VGG13) 15.2 s, MCD (VGG13) 7.0 s; 100 epochs plus
#: scoring and start (with ACET's and ACET2's attacks beside them: MCD and GAN alone may be faster). Estimated: DE's five members at once (each a Base training in a process
#: of its own; 4 processes did not slow each other) plus its resume and scoring; the attacks of
#: DE, MCD and GAN from the `cpu` run's attack seconds on the H200 x 50 (5 x 100 -> 50 x 500).
#: CCU's entry includes its build (:data:`CCU_BUILD_S`), which a carried fit takes out. MCD and GAN
#: train LeNet on MNIST since 0.7.0 (the VGG13 measures: VGG13_COST_S): estimated until call 0.
COST_S = {
    "Base": (170, 65),
    "ODIN": (14, 50),  # on Base, which its lane trains first (cost of Base added)
    "Maha": (11, 50),
    "EDL": (295, 65),
    "OE": (205, 65),
    "CCU": (465, 130),  # 76 measured; + a second attack since 0.8.0 (on its density ratio, ~55)
    "DE": (250, 100),  # its five members at once, each in a process of its own
    "MCD": (200, 290),  # on LeNet since 0.7.0 (VGG13_COST_S before): Base's training; its attack
    "GAN": (450, 80),  # seven LeNet passes a step (~5x Base's); GAN's step ~3 LeNet passes: guesses
    "ACET": (3400, 65),
    "ACET2": (3470, 65),
}
#: MCD's and GAN's costs on VGG13 at MNIST's size, measured 2026-11-28 (7.0 and 15.2 s an epoch,
#: four at once; the attacks estimated): what their VGG13s on the other datasets are scaled from
#: (:func:`estimated_seconds`); on MNIST the paper's MCD and GAN train LeNet (COST_S)
VGG13_COST_S = {"MCD": (720, 110), "GAN": (1545, 80)}
#: a reduced variant among a call's methods: ``MCD@50`` is MCD trained for 50 epochs, with the
#: profile's other fields as they are: its own label (``paper-e50``), its part in its own folder,
#: attacked in the certified balls of the call's profile (``CCU@N``, ``ODIN@N`` and ``Maha@N``
#: are not variants: CCU certifies the balls, ODIN and Maha are Base's)
VARIANT = re.compile(r"^([A-Za-z][A-Za-z0-9+_-]*)@([1-9][0-9]*)$")


def method_of(token: str) -> str:
    """The method of a call's ``token`` (``MCD@50`` -> ``MCD``; a method is its own token)."""
    m = VARIANT.match(token)
    return m.group(1) if m else token


def epochs_of(token: str) -> int | None:
    """The epochs of a reduced variant's ``token`` (``MCD@50`` -> 50), None for a method."""
    m = VARIANT.match(token)
    return int(m.group(2)) if m else None


#: seconds of CCU's build (metric, EM of both mixtures) inside its training: the 2026-11-27
#: call of CCU at 10 epochs was stopped 160 s in before its 10 epochs were done (~3.5 s each),
#: so the build took at least 125 s. A call that carries the fit (``prepare``) skips it.
CCU_BUILD_S = 125
#: CCU's build planned where no lease measured it. Its k-means and EM iterations run on the
#: GPU (ccu.core.em_device, since 2026-11-28; before, scikit-learn's on the device's CPU took
#: most of the ~125-185 s above), so what is left is on the CPU: the augmented covariance
#: sample, the metric's eigendecomposition and scikit-learn's k-means++ start of both
#: mixtures, timed here at the paper profile on the full training sets (2 threads, 2026-11-28;
#: the device's CPU built MNIST at least as fast as this one): MNIST's dimension (784, 60,000
#: + 20,000 points for EM) 10.3 s, CIFAR-10's (3072, 50,000 + 20,000) 47.1 s; another
#: dimension scales linearly from the nearest below (the eigendecomposition grows faster: its
#: d^3 is 20 of CIFAR-10's 47 s)
CCU_BUILD_CPU_S = {784: 10.3, 3072: 47.1}
#: the GPU's part of the build, estimated (not yet timed on a GPU): CIFAR-10's k-means (199
#: Lloyd iterations here) and EM (100 iterations), both mixtures, are ~30 TFLOP in float64;
#: 10 s at an assumed 3 TFLOP/s (an H200 peaks at 67), the data's copy to the GPU included
CCU_BUILD_GPU_S = 10


#: where the committed runs are whose builds :func:`measured_build_s` reads
BUILDS_FROM = REPO / "reference-results"


def measured_build_s(dataset: str) -> float | None:
    """The longest build of CCU fitted on the GPU that a committed part of ``dataset``
    records (any label: its config's ``initial_fit``, written since 2026-11-28: ``from``
    "fitted", ``fitted_by`` torch on CUDA, ``build_seconds``); None when none does."""
    seen = []
    for config in sorted(BUILDS_FROM.glob(f"*/{dataset}/CCU.config.json")):
        try:
            fit = json.loads(config.read_text()).get("initial_fit") or {}
        except (OSError, ValueError):
            continue
        if fit.get("from") == "fitted" and str(fit.get("fitted_by", "")).startswith(
            "torch on cuda"
        ):
            seen.append(float(fit["build_seconds"]))
    return max(seen, default=None)


def ccu_build_s(dataset: str) -> int:
    """Seconds of CCU's build on ``dataset`` (its fit, when not carried): on the datasets of
    :data:`COST_S` its measured :data:`CCU_BUILD_S` (of the build before its EM ran on the
    GPU: an upper bound now, kept since COST_S's CCU holds it); elsewhere the longest one a
    committed run of ``dataset`` measured on the GPU (:func:`measured_build_s`), else its CPU
    part (:data:`CCU_BUILD_CPU_S`, by the input dimension) plus :data:`CCU_BUILD_GPU_S`."""
    if dataset in COST_DATASETS:
        return CCU_BUILD_S
    measured = measured_build_s(dataset)
    if measured is not None:
        return int(math.ceil(measured))
    d = input_dim(dataset)
    known = max((k for k in CCU_BUILD_CPU_S if k <= d), default=min(CCU_BUILD_CPU_S))
    return int(math.ceil(CCU_BUILD_CPU_S[known] * max(d / known, 1.0) + CCU_BUILD_GPU_S))


#: the measured costs are one run's: plan with this much room on every training
SAFETY = 1.1


#: the benchmark of ACET's inner attack in CUDA graphs on the leases' GPU
#: (``python3 benchmarks/bench_acet_graphs.py --out ...`` on the device, committed): once it
#: is there and its checks against the eager attack passed, ACET and ACET2 are planned with it
GRAPHS_BENCH = REPO / "benchmarks" / "timings" / "acet_graphs_gpu.json"
#: the methods whose inner attack runs in CUDA graphs on a GPU (ccu.methods.cuda_graphs)
GRAPHED = ("ACET", "ACET2")
#: seconds of an ACET run outside its epochs (process start, data, scoring), in COST_S
ACET_FIXED_S = 20
#: ACET's epochs at the paper's protocol
EPOCHS = 100


#: each long method's epoch timed alone on the leases' GPU at MNIST's paper profile
#: (``benchmarks/bench_epochs.py`` in call 0, committed): planned from it once it is there;
#: another dataset's call 0 writes its own beside it (:func:`epochs_bench`)
EPOCHS_BENCH = REPO / "benchmarks" / "timings" / "epochs_mnist_gpu.json"
#: the methods call 0 times alone on MNIST (their costs in COST_S were measured four at once,
#: or not); on another dataset call 0 times every method it has not measured (:func:`to_time`)
ALONE = ("MCD", "GAN", "DE", "ACET", "ACET2")
#: the datasets whose runs COST_S measured (digits: the tests' fake leases plan with them)
COST_DATASETS = ("mnist", "digits")
#: seconds of a run outside its epochs when planned from its epoch alone: the process, the
#: data, the scoring (ACET_FIXED_S); DE: its members' processes, its own resume and scoring;
#: CCU: its balls and certificates (its build, :func:`ccu_build_s`, is planned apart)
OUTSIDE_EPOCHS_S = {"DE": 45, "CCU": 30}


def epochs_bench(dataset: str = "mnist") -> Path:
    """Where call 0's epochs of ``dataset`` are committed: ``epochs_<dataset>_gpu.json`` beside
    :data:`EPOCHS_BENCH` (MNIST's)."""
    return EPOCHS_BENCH.with_name(f"epochs_{dataset}_gpu.json")


def _timed_alone(method: str, bench: Path | None = None, dataset: str = "mnist") -> dict:
    """Call 0's numbers for ``method`` on ``dataset`` (:func:`epochs_bench`, or ``bench``);
    empty without. On MNIST only :data:`ALONE`'s: COST_S measured the others in a lease."""
    bench = Path(bench) if bench is not None else epochs_bench(dataset)
    if dataset in COST_DATASETS and method not in ALONE or not bench.exists():
        return {}
    return (json.loads(bench.read_text()).get("by_method") or {}).get(method) or {}


#: the committed H200 benchmark of Base's and CCU's epochs on each network (LeNet on MNIST,
#: ResNet18 on CIFAR-10's shape: ``benchmarks/bench_gpu.py``): what a dataset whose runs no
#: lease has measured is estimated from until its call 0 times them (:func:`estimated_seconds`)
NETWORK_BENCH = REPO / "benchmarks" / "timings" / "bench_gpu_h200.json"
#: the methods on a dataset's own network whose training COST_S scales with Base's epoch on
#: that network (DE: a member; OE: twice the images, as Base's ratio scales both), with CCU's
#: own; MCD and GAN train a VGG13 where the others train ResNet18: VGG13_COST_S per image
ON_THE_NETWORK = ("Base", "ODIN", "Maha", "EDL", "OE", "DE", "ACET", "ACET2")


def on_vgg13(method: str, dataset: str) -> bool:
    """Whether the paper's ``method`` trains a VGG13 on ``dataset``: MCD and GAN where the
    others train a ResNet18 (:data:`ccu.methods.base.PAPER_NETWORK_REPLACES`), not on LeNet."""
    from ccu.data.registry import get_spec
    from ccu.methods.base import PAPER_NETWORK_REPLACES

    replaced = get_spec(dataset).settings.classifier in PAPER_NETWORK_REPLACES
    return method in VGG13_COST_S and replaced


def network_factor(dataset: str, method: str, per: str = "epoch") -> float | None:
    """How much longer ``method``'s epoch (``per="epoch"``) or one image's step (``per=
    "image"``: an attack's) on ``dataset`` is than on MNIST, from the committed
    :data:`NETWORK_BENCH`: the ratio of Base's (CCU: CCU's) steps on ``dataset``'s network to
    LeNet's, an epoch's also times the ratio of the training sets' steps; for MCD and GAN
    (VGG13 everywhere) the images' pixels instead of the networks. None when the benchmark
    lacks the network."""
    from ccu.data.registry import get_spec

    spec, mnist = get_spec(dataset), get_spec("mnist")
    # the training set's size: the specs fit their metric's covariance on all of it
    steps = spec.settings.n_covariance / mnist.settings.n_covariance if per == "epoch" else 1.0
    if on_vgg13(method, dataset):
        return steps * math.prod(spec.shape) / math.prod(mnist.shape)
    if not NETWORK_BENCH.exists():
        return None
    bench = json.loads(NETWORK_BENCH.read_text())
    row = "CCU" if method == "CCU" else "Base"
    net, lenet = bench.get(spec.settings.classifier) or {}, bench.get("lenet") or {}
    try:
        here = net[row]["new_epoch_s"] / net["steps_per_epoch"]
        there = lenet[row]["new_epoch_s"] / lenet["steps_per_epoch"]
    except (KeyError, TypeError, ZeroDivisionError):
        return None
    return here / there * steps


def estimated_seconds(method: str, dataset: str) -> tuple[int, int] | None:
    """``method``'s (train and score, attack and part) seconds on ``dataset`` before any run
    there measured them: MNIST's :data:`COST_S` times :func:`network_factor` (the training by
    the epoch's, the attack by an image's). DE: its members as if one after another
    (:func:`members_in_turn`). None when there is nothing to scale by."""
    epoch, image = network_factor(dataset, method), network_factor(dataset, method, "image")
    if epoch is None or image is None or method not in COST_S:
        return None
    train, attack = VGG13_COST_S[method] if on_vgg13(method, dataset) else COST_S[method]
    if method == "CCU":  # its build is on the inputs, not the network: planned apart
        train = ccu_build_s(dataset) + (train - CCU_BUILD_S) * epoch
    elif method == "DE":
        base = COST_S["Base"][0]
        train = OUTSIDE_EPOCHS_S["DE"] + (base - ACET_FIXED_S) * epoch * members_in_turn(dataset)
    else:
        train = train * epoch
    return int(round(train)), int(round(attack * image))


def members_in_turn(dataset: str, graphed: bool = False) -> int:
    """How many of DE's members' epochs its epoch is planned as on ``dataset``: one on MNIST,
    whose five LeNet members trained at once without slowing one another (four eager processes
    were measured so); elsewhere, and wherever call 0 timed the member's steps in CUDA graphs
    (``graphed``: each process then keeps the GPU busy, :func:`graphed_alone`), all of them
    (:data:`DE_MEMBERS`), as if one after another: five ResNet18s at once share one GPU, which
    no lease has measured, and DE cannot continue in another call if it runs long."""
    return 1 if dataset in COST_DATASETS and not graphed else DE_MEMBERS


def graphed_alone(method: str, dataset: str = "mnist", bench: Path | None = None) -> bool:
    """Whether call 0 timed ``method``'s epoch on ``dataset`` with its whole step in CUDA
    graphs (its ``training_step`` record), so that its plan comes from a graphed epoch.

    Such a training holds the GPU nearly all the time: a graph replays its kernels back to
    back, and without CUDA's MPS (which the device does not run) the kernels of two processes
    never run at once, the GPU takes them in turns. The four eager LeNet lanes of the
    2026-11-28 lease did not slow one another because each left the GPU idle between its
    launches; graphed lanes would. So :func:`plan` adds up the graphed trainings of a call
    (:func:`gpu_seconds`) instead of taking them as side by side."""
    timed = _timed_alone(method_of(method), bench, dataset)
    step = (timed.get("training_step") or {}).get("cuda_graphs")
    inner = (timed.get("inner_attack") or {}).get("cuda_graphs")  # ACET's, when the step's were off
    return "full_epoch_s" in timed and bool(step or inner)


#: the busy share measured in call 0 is the graphs' own: the batch's copies and the sums around
#: each replay, and the GPU's switches between processes, come on top (not measured)
BUSY_MARGIN = 1.25


def busy_share(method: str, dataset: str = "mnist") -> float:
    """The share of a graphed epoch's wall time that ``method``'s graphs keep the GPU busy:
    call 0's ``gpu_busy_fraction`` (CUDA events around each replay) times
    :data:`BUSY_MARGIN`, at most 1; 1 where call 0 did not measure it (all of it, the safe
    side); 0 for a method not timed in graphs (:func:`graphed_alone`)."""
    if not graphed_alone(method, dataset):
        return 0.0
    busy = _timed_alone(method_of(method), None, dataset).get("gpu_busy_fraction")
    return 1.0 if busy is None else min(1.0, BUSY_MARGIN * float(busy))


def alone_train_seconds(
    method: str, bench: Path | None = None, dataset: str = "mnist"
) -> int | None:
    """``method``'s training and scoring seconds from its epoch timed alone on the GPU (the
    committed :func:`epochs_bench` of ``dataset``; DE: one member's epoch, its members
    training at once): what it adds to the epochs (:data:`OUTSIDE_EPOCHS_S`; CCU: and its
    build, :func:`ccu_build_s`) plus 100 of them. None without the benchmark or its number for
    ``method``. Alone: four lanes at once may be slower, which SAFETY and a training's stop
    after a saved epoch (continued in the next call) absorb."""
    timed = _timed_alone(method, bench, dataset)
    if "full_epoch_s" not in timed:
        return None
    fixed = outside_epochs(method, dataset=dataset)
    members = members_in_turn(dataset, graphed_alone("DE", dataset, bench)) if method == "DE" else 1
    return int(round(fixed + EPOCHS * members * float(timed["full_epoch_s"])))


#: seconds of an attack's process outside the attack itself: its start, the data and the model
#: loaded, the part written (the 2026-11-28 lease: 54-56 s an attack in four lanes, 39-40 s of
#: it the attack alone)
ATTACK_FIXED_S = 20
#: DE's members, each attacked in every step of its attack (call 0 times one member's)
DE_MEMBERS = 5


def alone_attack_seconds(
    method: str, bench: Path | None = None, dataset: str = "mnist"
) -> int | None:
    """``method``'s attack and part from its attack timed alone on the GPU in call 0
    (:func:`epochs_bench`'s ``attack``: the protocol's 500 steps extrapolated from 5 and 10),
    plus :data:`ATTACK_FIXED_S`; DE's: its one timed member times :data:`DE_MEMBERS`. None
    without the benchmark or its attack for ``method``."""
    attack = _timed_alone(method, bench, dataset).get("attack") or {}
    if "attack_full_s" not in attack:
        return None
    members = DE_MEMBERS if method == "DE" else 1
    return int(round(ATTACK_FIXED_S + members * float(attack["attack_full_s"])))


def graphed_train_seconds(method: str, bench: Path | None = None) -> int | None:
    """``method``'s training and scoring seconds with its inner attack in CUDA graphs: the
    epoch :data:`COST_S` measured eagerly, less the eager inner attacks of an epoch as the
    committed benchmark timed them (at most the whole epoch), plus its graphed ones. None
    for another method, without the benchmark, or when its checks did not pass (then ACET
    runs eagerly on the device too). An estimate until a lease measures a graphed run: the
    benchmark runs alone, the measured epoch in four lanes, so the rest of the epoch kept
    here is if anything too long."""
    bench = Path(bench) if bench is not None else GRAPHS_BENCH
    if method not in GRAPHED or not bench.exists():
        return None
    timed = json.loads(bench.read_text())
    if not (timed.get("checks") or {}).get("cuda_graphs") or "graphed_epoch_s" not in timed:
        return None
    epoch = (COST_S[method][0] - ACET_FIXED_S) / EPOCHS
    rest = epoch - min(epoch, float(timed["eager_epoch_s"]))
    return int(round(ACET_FIXED_S + EPOCHS * (rest + float(timed["graphed_epoch_s"]))))


def outside_epochs(method: str, ccu_init: bool = False, dataset: str = "mnist") -> int:
    """The seconds of ``method``'s run on ``dataset`` that do not scale with its epochs: the
    process, the data and the scoring (:data:`OUTSIDE_EPOCHS_S`), CCU's build
    (:func:`ccu_build_s`) unless its fit is carried."""
    fixed = OUTSIDE_EPOCHS_S.get(method, ACET_FIXED_S)
    return fixed + (ccu_build_s(dataset) if method == "CCU" and not ccu_init else 0)


def train_cost(method: str, ccu_init: bool = False, dataset: str = "mnist",
               epochs: int = EPOCHS) -> int:  # fmt: skip
    """Planned device seconds of ``method``'s training and scoring on ``dataset`` at
    ``epochs`` epochs (the plan's profile), times :data:`SAFETY`: its epoch timed alone in
    ``dataset``'s call 0 (:func:`alone_train_seconds`), else on MNIST :data:`COST_S` (ACET's
    and ACET2's from the graphs' benchmark when it is committed: :func:`graphed_train_seconds`),
    on another dataset :func:`estimated_seconds`, else ten minutes; CCU's build left out when
    its initial fit is carried (``ccu_init``). A reduced variant (``MCD@50``) or a plan at
    fewer epochs: their share of the epochs, the seconds outside them kept whole."""
    n = epochs_of(method) or epochs
    m = method_of(method)
    if n != EPOCHS:
        full = train_cost(m, ccu_init, dataset)
        fixed = outside_epochs(m, ccu_init, dataset)
        return int(round(fixed + max(full - fixed, 0) * min(n, EPOCHS) / EPOCHS))
    if dataset in COST_DATASETS:
        known = graphed_train_seconds(m) or (COST_S.get(m) or (None,))[0]
    else:
        known = (estimated_seconds(m, dataset) or (None,))[0]
    train = alone_train_seconds(m, dataset=dataset) or known or 600
    if m == "CCU" and ccu_init:
        train -= ccu_build_s(dataset)
    return int(round(train * SAFETY))


def attack_cost(method: str, dataset: str = "mnist") -> int:
    """Planned device seconds of ``method``'s attack and part on ``dataset``: timed in call 0
    (:func:`alone_attack_seconds`) with :data:`SAFETY`, else :data:`COST_S` (another dataset:
    :func:`estimated_seconds`); a reduced variant's: its method's."""
    m = method_of(method)
    timed = alone_attack_seconds(m, dataset=dataset)
    if timed is not None:
        return int(round(timed * SAFETY))
    if dataset not in COST_DATASETS and estimated_seconds(m, dataset):
        return estimated_seconds(m, dataset)[1]
    return COST_S.get(m, (600, 30))[1]


def measured_on(method: str, dataset: str) -> bool:
    """Whether ``method``'s costs on ``dataset`` are measured (COST_S's datasets, or its call
    0), not estimated from another network's benchmark."""
    return dataset in COST_DATASETS or "full_epoch_s" in _timed_alone(
        method_of(method), dataset=dataset
    )


def needs_base(method: str) -> bool:
    """Whether ``method`` is built on Base's trained model (its ``needs_base``: ODIN, Maha):
    Base trains first in its lane (weights are not kept from one lease to the next)."""
    from ccu.methods import get_method

    try:
        return bool(get_method(method_of(method)).needs_base)
    except ValueError:  # a plug-in's method not loaded here: on its own
        return False


def seconds(method: str, dataset: str = "mnist", epochs: int = EPOCHS) -> int:
    """Planned device seconds of ``method`` alone (train and score, attack and part)."""
    return train_cost(method, dataset=dataset, epochs=epochs) + attack_cost(method, dataset)


def groups(methods: list[str]) -> list[list[str]]:
    """Each method with the ones that must follow it in its lane (Base, then ODIN and Maha)."""
    out: dict[str, list[str]] = {}
    for m in methods:
        head = "Base" if needs_base(m) and "Base" in methods else m
        out.setdefault(head, [])
        if m != head:
            out[head].append(m)
    return [[head, *tail] for head, tail in out.items()]


def call_lanes(methods: list[str], jobs: int, dataset: str = "mnist",
               epochs: int = EPOCHS) -> list[list[str]]:  # fmt: skip
    """The lanes of one device call (``tools/lease_run.sh``): with CCU, CCU alone in the first
    lane (every other lane attacks in the balls it certifies) and the others in the remaining
    ``jobs - 1`` (:func:`lanes`); with one lane, CCU first in it; without CCU, :func:`lanes`."""
    others = [m for m in methods if m != "CCU"]
    if "CCU" not in methods:
        return lanes(others, jobs, dataset, epochs)
    rest = lanes(others, max(1, jobs - 1), dataset, epochs) if others else []
    if jobs == 1:
        return [["CCU", *(m for lane in rest for m in lane)]]
    return [["CCU"], *rest]


def given_lanes(methods: list[str]) -> list[list[str]] | None:
    """The lanes written out in a call's methods (``plan`` prints them: ``A B / C / D``), or
    None when there is no ``/`` (then :func:`call_lanes` splits them). ValueError when a lane
    is empty, a method comes twice, or CCU is not first in its lane (the others wait for it)."""
    if "/" not in methods:
        return None
    out, lane = [], []
    for m in [*methods, "/"]:
        if m != "/":
            lane.append(m)
            continue
        if not lane:
            raise ValueError(f"an empty lane in {' '.join(methods)!r}")
        out.append(lane)
        lane = []
    flat = [method_of(m) for lane in out for m in lane]
    if len(set(flat)) != len(flat):
        raise ValueError(f"a method in two lanes: {' '.join(methods)!r}")
    if any("CCU" in lane[1:] for lane in out):
        raise ValueError("CCU goes first in its lane: the other lanes wait for its balls")
    return out


def call_command(args) -> int:
    """``call``: the first line ``<profile label> <DE's members>``, then one line per lane (as
    given with ``/``, :func:`given_lanes`, else :func:`call_lanes`), then one per reduced
    variant: ``@ TOKEN LABEL FIELDS ATTACK_SECONDS`` (its label, profile fields as JSON, and
    the seconds its attack and part are planned at: what ``lease_run.sh`` leaves for them);
    one process where the call once started two (each a torch import)."""
    from ccu.run.config import get_profile

    try:
        overrides = json.loads(args.overrides or "{}")
        prof = get_profile(args.profile, args.dataset, **overrides)
        lanes = given_lanes(args.methods) or call_lanes(
            args.methods, args.jobs, args.dataset, prof.epochs
        )
        tokens = [m for lane in lanes for m in lane]
        for m in tokens:
            if "@" in m and not VARIANT.match(m):
                raise ValueError(f"{m!r} is no reduced variant: write METHOD@EPOCHS, e.g. MCD@50")
        if len({method_of(m) for m in tokens}) != len(tokens):
            raise ValueError(f"a method twice in {' '.join(args.methods)!r}")
        variants = {m: variant(args.profile, overrides, args.dataset, m, prof.label)
                    for m in tokens if epochs_of(m) is not None}  # fmt: skip
    except (ValueError, TypeError) as err:  # bad JSON, profile, field, dataset, lanes: one line
        print(f"[lease] error: {err}", file=sys.stderr)
        return 2
    print(prof.label, prof.ensemble)
    for lane in lanes:
        print(" ".join(lane))
    for token, (label, fields) in variants.items():  # and its attack's planned seconds
        print("@", token, label, json.dumps(fields, separators=(",", ":")),
              attack_cost(token, args.dataset))  # fmt: skip
    return 0


def variant(profile: str, overrides: dict, dataset: str, token: str, label: str):
    """A reduced variant's label and profile fields (``MCD@50``: the call's overrides with
    ``epochs`` 50): ``(label, fields)``. ValueError for CCU (its balls are what the variants
    are attacked in), ODIN and Maha (built on Base), a method that does not exist, and epochs
    that are the profile's own (then it is no variant: write the method alone)."""
    from ccu.methods import get_method
    from ccu.run.config import get_profile

    method = method_of(token)
    get_method(method)  # ValueError: unknown
    if method == "CCU" or needs_base(method):
        why = (
            "its balls are what every variant is attacked in"
            if method == "CCU"
            else "it is built on Base"
        )
        raise ValueError(
            f"{token}: {method} runs at the call's profile ({why}); only a method trained on "
            "its own can run as a reduced variant"
        )
    fields = dict(overrides, epochs=epochs_of(token))
    prof = get_profile(profile, dataset, **fields)
    if prof.label == label:
        raise ValueError(f"{token} is {label} itself: write {method}")
    return prof.label, fields


def lanes(methods: list[str], jobs: int, dataset: str = "mnist",
          epochs: int = EPOCHS) -> list[list[str]]:  # fmt: skip
    """``methods`` split into at most ``jobs`` lanes that run at once on one GPU: groups
    (:func:`groups`) longest first, each to the lane with the least work so far (the LPT rule,
    within 4/3 of the best split); within a lane the cheaper groups first, so that more
    methods finish, and come back, in a call that ends early."""
    if jobs < 1:
        raise ValueError(f"jobs must be at least 1, not {jobs}")

    def cost(group):
        return sum(seconds(m, dataset, epochs) for m in group)

    work = [0.0] * jobs
    filled: list[list[list[str]]] = [[] for _ in range(jobs)]
    for group in sorted(groups(methods), key=lambda g: -cost(g)):
        k = min(range(jobs), key=lambda i: work[i])
        filled[k].append(group)
        work[k] += cost(group)
    return [[m for g in sorted(lane, key=cost) for m in g] for lane in filled if lane]


#: seconds of a lease spent outside the commands: the machine's start, and each call's
#: transfers. Measured on the lease of 2026-11-28 (751 s held for 693 s of commands in three
#: calls): the start ~34 s, each later call ~12 s; planned with room for a slower start
START_S, CALL_OVERHEAD_S = 60, 20
#: ``tools/lease_run.sh``'s STOP_MARGIN: a training that would not end before the hard limit
#: stops this long before it, after a saved epoch, and continues in the next call
STOP_MARGIN_S = 20
#: seconds a continued training spends in the next call before its first epoch (the process,
#: the data, the model rebuilt from its checkpoint: no refit)
RESUME_S = 20
#: a whole lease's device seconds: what "too long even for a lease" is measured against
LEASE_S = 900
#: seconds a call keeps after its hard limit: lanes stopped, the archive written, files sent
HARD_MARGIN_S = 40
#: seconds of planned work one call holds: its hard limit 45 s past the plan (call_timeout)
LONGEST_WORK_S = 595 - HARD_MARGIN_S - 45
#: the files of a part, as ``ccu part`` writes them (ccu.store.reference_results)
PART_FILE = re.compile(
    r"^([A-Za-z0-9+_-]+)\.(config\.json|metrics\.json|guarantees\.json|attack\.json|attack\.npz)$"
)
BALL_FILES = ("balls.json", "balls.npz", "radii.csv")


def reference_dir(reference: Path, label: str, dataset: str) -> Path:
    return Path(reference) / label / dataset


def committed_parts(folder: Path) -> list[str]:
    """The methods whose whole part is in ``folder`` (its attack and, written last, its config)."""
    return [m for m in ALL + sorted(_others(folder)) if (folder / f"{m}.attack.json").exists()
            and (folder / f"{m}.config.json").exists()]  # fmt: skip


def _others(folder: Path) -> set[str]:
    found = {p.name.split(".")[0] for p in Path(folder).glob("*.attack.json")}
    return found - set(ALL)


def units(todo: list[str], ccu_init: bool = False, dataset: str = "mnist",
          epochs: int = EPOCHS) -> list[tuple[list[str], int, int]]:  # fmt: skip
    """The methods to run as units of a lane: ``(methods, train seconds, attack seconds)``.
    ODIN and Maha go with Base (built on its trained model); without Base to run, they train it
    first all the same (weights are not kept from one lease to the next)."""
    out, on_base = [], [m for m in todo if needs_base(m)]
    for m in todo:
        if needs_base(m):
            continue
        group = [m, *on_base] if m == "Base" else [m]
        if m == "Base":
            on_base = []
        out.append(group)
    if on_base:
        out.append(["Base*", *on_base])  # Base trained again, its part already committed
    result = []
    for group in out:
        train = sum(train_cost(m.rstrip("*"), ccu_init, dataset, epochs) for m in group)
        attack = sum(attack_cost(m, dataset) for m in group if not m.endswith("*"))
        result.append(([m for m in group if not m.endswith("*")], train, attack))
    return result


def attack_share(unit, dataset: str = "mnist") -> float:
    """The share of ``unit``'s attacks that keeps the GPU busy: each method's attack timed in
    call 0 with the GPU's utilisation (``nvidia-smi``: its ``attack``'s ``gpu_busy_fraction``)
    times :data:`BUSY_MARGIN`, at most 1, weighted by their planned seconds; 0 for an attack
    not measured so (the attacks of 2026-11-28 ran four at once, 54-56 s against 39-40 s
    alone: side by side, nearly)."""
    group, _, _ = unit
    costs = {m: attack_cost(m, dataset) for m in group}
    total = sum(costs.values())
    busy = 0.0
    for m, c in costs.items():
        share = (_timed_alone(method_of(m), None, dataset).get("attack") or {}).get(
            "gpu_busy_fraction"
        )
        if share is not None:
            busy += c * min(1.0, BUSY_MARGIN * float(share))
    return busy / total if total else 0.0


def gpu_seconds(unit, dataset: str = "mnist", epochs: int = EPOCHS, ccu_init: bool = False) -> int:
    """The seconds of ``unit``'s planned training that keep the GPU busy: of each method timed
    in graphs (:func:`graphed_alone`), its epochs (:func:`outside_epochs`, its process start,
    data and scoring, leave the GPU free) times its :func:`busy_share`; 0 for one planned
    from eager epochs (lanes side by side, as measured). A unit's training seconds as planned
    (a training continued from an earlier call: what it has left), split by its methods'
    planned costs (Base's too where ODIN and Maha train it again, ``units``' ``Base*``)."""
    group, train, _ = unit
    methods = list(group)
    if "Base" not in methods and all(needs_base(m) for m in methods):
        methods.insert(0, "Base")  # trained again for them
    costs = {m: train_cost(m, ccu_init, dataset, epochs) for m in methods}
    shares = {m: busy_share(m, dataset) for m in methods}
    busy = sum(max(c - round(SAFETY * outside_epochs(method_of(m), ccu_init, dataset)), 0) * shares[m]
               for m, c in costs.items() if shares[m])  # fmt: skip
    total = sum(costs.values())
    return int(round(train * busy / total)) if busy and total else 0


class Call(NamedTuple):
    """One planned device call: its methods (in lease_run.sh's order), lanes and seconds of
    work, and the methods whose training spans it and the next call (``{method: "starts" or
    "continues"}``; one that continues a training from an earlier call may also finish here,
    then it is not in ``spanning``)."""

    methods: list[str]
    lanes: list[list[str]]
    work: int
    spanning: dict[str, str]


def spannable(group: list[str]) -> bool:
    """Whether a unit's training may stop after a saved epoch and continue in the next call
    (``ccu train --stop-after``): not CCU (every other lane waits for its balls) and not DE
    (its members train to their end, each in a process of its own), and not a reduced variant
    (sized to its call: on the device it is sized anew, not continued, when it would not end)."""
    if any(epochs_of(m) is not None for m in group):  # a variant is sized to finish in its call
        return False
    return not ({"CCU", "DE"} & {method_of(m) for m in group})


def epoch_seconds(train: int, epochs: int = EPOCHS) -> float:
    """One epoch of a unit planned at ``train`` seconds for ``epochs`` epochs: the most a
    training stopped for time leaves unused (it stops when one more epoch would end past the
    stop)."""
    return train / epochs


def next_limit(left: int, timeout: int) -> int:
    """The work seconds the next call holds after a call of ``timeout`` with ``left`` seconds
    of the lease before it."""
    return call_limit(left - timeout - CALL_OVERHEAD_S)


def span_progress(limit: int, continuing: bool, train: int, epochs: int = EPOCHS) -> float:
    """How far (seconds of its training) a unit alone in its lane gets in a call planned at
    ``limit`` seconds of work: it trains until STOP_MARGIN_S before the call's hard limit,
    less its restart when it continues, less at most one epoch."""
    hard = call_timeout(limit) - HARD_MARGIN_S
    return hard - STOP_MARGIN_S - (RESUME_S if continuing else 0) - epoch_seconds(train, epochs)


def rest_of(train: int, limit: int, continuing: bool, epochs: int = EPOCHS) -> int:
    """The training seconds a unit planned at ``train`` has left for the next call after
    spanning a call of ``limit`` (:func:`span_progress`), its restart there included."""
    done = span_progress(limit, continuing, train, epochs)
    return int(round(max(train - done, 0) + RESUME_S))


def fits_a_lease(unit, budget_s: int = LEASE_S, reserve_s: int = 60, epochs: int = EPOCHS) -> bool:
    """Whether a unit finishes in a whole lease of its own: in one call, or (spannable)
    across its first two."""
    group, train, attack = unit
    limit = call_limit(budget_s - START_S - reserve_s)
    if train + attack <= limit:
        return True
    if not spannable(group):
        return False
    left = budget_s - START_S - reserve_s
    return rest_of(train, limit, False, epochs) + attack <= next_limit(left, call_timeout(limit))


class _Filling:
    """One call as :func:`plan` fills it: its lanes, the trainings that span it
    (``{method: "starts" or "continues"}``) and whether CCU trains in it (``ready``, its
    planned seconds alone: the other lanes attack once its balls are there). ``limit``: its
    seconds of work; ``after``: the next call's.

    The lanes share one GPU (:func:`gpu_seconds`): :meth:`ends` runs the call as a fluid. Each
    lane is a sequence of trainings and attacks, each with its seconds alone and the share of
    them it keeps the GPU busy (a training planned from eager epochs, and an attack whose
    utilisation call 0 did not measure: none, as the eager lanes of 2026-11-28 ran side by
    side; :func:`attack_share`). While the busy shares of what runs add up
    to more than 1, every part that uses the GPU goes that many times slower; the rest goes at
    its own pace. A lane planned from eager epochs alone ends as before."""

    def __init__(self, limit: int, jobs: int, after: int, dataset: str, epochs: int,
                 ccu_init: bool = False):  # fmt: skip
        self.limit, self.jobs, self.after = limit, jobs, after
        self.dataset, self.epochs, self.ccu_init = dataset, epochs, ccu_init
        self.lanes: list[list] = []
        self.spanning: dict[str, str] = {}
        self.ready = 0

    def gpu(self, unit) -> int:
        return gpu_seconds(unit, self.dataset, self.epochs, self.ccu_init)

    def share(self, unit) -> float:
        """The share of ``unit``'s training that keeps the GPU busy."""
        return min(self.gpu(unit) / unit[1], 1.0) if unit[1] > 0 else 0.0

    def attack_share(self, unit) -> float:
        """The share of ``unit``'s attacks that keeps the GPU busy (:func:`attack_share`)."""
        return attack_share(unit, self.dataset)

    def _graphed_spanning(self) -> bool:
        return any(lane[0][0][0] in self.spanning and self.share(lane[0]) for lane in self.lanes)

    def ends(self, lanes) -> list[int]:
        """When each of ``lanes`` ends, the GPU shared (a spanning one: 0, it trains to the
        hard limit). A lane trains and attacks its methods in turn; in CCU's call (``ready``)
        the others train all theirs first and attack once CCU's training is done."""
        ccu = next((i for i, lane in enumerate(lanes) if lane[0][0] == ["CCU"] and self.ready),
                   None)  # fmt: skip
        parts = []  # per lane: [seconds alone left, busy share, waits for CCU's balls]
        for i, lane in enumerate(lanes):
            if lane[0][0][0] in self.spanning:
                parts.append([[math.inf, self.share(lane[0]), False]])
            elif ccu is not None and i != ccu:
                attacks = [[u[2], self.attack_share(u), k == 0] for k, u in enumerate(lane)]
                parts.append([[u[1], self.share(u), False] for u in lane] + attacks)
            else:
                parts.append([p for u in lane for p in ([u[1], self.share(u), False],
                                                        [u[2], self.attack_share(u), False])])  # fmt: skip
        now, ready = 0.0, (None if ccu is not None else 0.0)
        done = [0.0] * len(lanes)
        while True:
            running = [i for i, p in enumerate(parts) if p and not (p[0][2] and ready is None)]
            finite = [i for i in running if parts[i][0][0] < math.inf]
            if not finite:
                break
            demand = sum(parts[i][0][1] for i in running)
            slow = max(demand, 1.0)
            pace = {i: 1.0 / slow if parts[i][0][1] > 0 else 1.0 for i in running}
            step = min(parts[i][0][0] / pace[i] for i in finite)
            now += step
            for i in running:
                parts[i][0][0] -= pace[i] * step
                if parts[i][0][0] <= 1e-9:
                    parts[i].pop(0)
                    if i == ccu and ready is None:  # CCU trained: its balls are there
                        ready = now
                    if not parts[i]:
                        done[i] = now
        return [
            0 if lane[0][0][0] in self.spanning else math.ceil(done[i] - 1e-6)
            for i, lane in enumerate(lanes)
        ]

    def end(self, lanes=None) -> int:
        """When the call's work ends: its last lane to end, but for a spanning one."""
        return max(self.ends(self.lanes if lanes is None else lanes), default=0)

    def place(self, unit) -> bool:
        """``unit`` into the lane where it ends first, if every lane still ends in the call
        (with a graphed training, the others' graphed ones end later too); False if none. Not
        a graphed one beside a graphed training spanning the call (its progress is planned
        alone)."""
        if (self.share(unit) or self.attack_share(unit)) and self._graphed_spanning():
            return False
        tried = []
        for i, lane in enumerate(self.lanes):
            if (lane[0][0] == ["CCU"] and self.ready) or lane[0][0][0] in self.spanning:
                continue
            tried.append((i, [*self.lanes[:i], [*lane, unit], *self.lanes[i + 1 :]]))
        if len(self.lanes) < self.jobs:
            tried.append((len(self.lanes), [*self.lanes, [unit]]))
        fits = []
        for i, trial in tried:
            ends = self.ends(trial)
            if max(ends) <= self.limit:
                fits.append((ends[i], i))
        if not fits:
            return False
        _, i = min(fits)
        if i == len(self.lanes):
            self.lanes.append([])
        self.lanes[i].append(unit)
        return True

    def span(self, unit, continuing: bool) -> bool:
        """``unit`` spanning this call and the next (:func:`_span`), if every other lane still
        ends in time. A graphed training starts spanning only in a call without other graphed
        ones (its progress, :func:`span_progress`, is planned alone); one continued from the
        last call spans beside them too (its progress would be lost; the next call is planned
        from how far it really got)."""
        graphed = self.share(unit) > 0
        if graphed and not continuing and any(self.share(u) for lane in self.lanes for u in lane):
            return False  # a continued one spans all the same: its progress is on the machine
        room = (self.lanes, self.spanning, self.jobs, self.limit, self.after)
        if not _span(unit, continuing, *room, epochs=self.epochs):
            return False
        if self.end() > self.limit:  # it slows the others too much: taken back
            self.lanes.remove([unit])
            for m in unit[0]:
                del self.spanning[m]
            return False
        return True


def plan(dataset, reference, label="paper", budget_s=900, jobs=4, reserve_s=60, ccu_init=False,
         inflight=None, assume_done=(), reduce=False, epochs=EPOCHS, data_s=0, warm=False,
         balls_on_machine=False):  # fmt: skip
    """The calls of a lease: ``[Call]``, the methods left for a later lease, those that cannot
    finish in a lease even alone (``{method: seconds}``), and a problem that stops the grid
    (None if none): CCU's part committed without the balls' metric (over 16 MiB), so no other
    method can be attacked in them in a later lease. ``ccu_init``: the calls carry CCU's
    initial fit (``prepare``), so its build is not planned. ``inflight``: ``{method:
    (epochs done, epochs)}`` of trainings stopped for time on a machine still warm (the last
    call's ``.inflight``, :func:`read_inflight`): they continue first, in lanes of their own.

    Units that finish in a call fill its lanes first (biggest first, as :func:`lanes`); a
    lane left free then takes one unit too long for the call, alone, when what remains of it
    fits the next call: it trains until just before the hard limit, stops after a saved epoch
    and continues in the next call (``lease_run.sh``).

    ``reduce``: a method too long for a lease even alone runs as the reduced variant that
    fits this lease's first call (:func:`reduced_token`, ``MCD@50``: label ``paper-e50``, its
    own folder, attacked in this label's balls); without it, such a method is only named in
    ``too_long``; ``"measured"``: only those measured on ``dataset`` (:func:`measured_on`: a
    variant's label is for good, never sized from another network's estimates). A method committed as a variant in this label's balls
    (:func:`variant_parts`) counts as done while it does not fit a lease whole. ``epochs``:
    the epochs of ``label``'s profile (a grid planned at fewer, ``plan --epochs``), by which
    every method's training is scaled; costs are ``dataset``'s (:func:`train_cost`).
    ``data_s``: the seconds a fresh machine spends on data calls before the others (data in
    several parts): a whole lease is that much shorter. ``warm``: the machine is started (its
    start, :data:`START_S`, is not planned again). ``balls_on_machine``: CCU's part is
    committed without ``balls.npz`` (:func:`balls_travel`), and its balls are on the warm
    machine that certified them (:func:`balls_left_on_machine`): the others attack there."""
    folder = reference_dir(reference, label, dataset)
    start = 0 if warm else START_S
    done = set(committed_parts(folder)) | {method_of(m) for m in assume_done}
    # a lease as long as this one, or a whole one (less its data calls on a fresh machine)
    whole = max(budget_s, LEASE_S - data_s)
    # a method committed as a reduced variant is done, unless it now fits a lease whole: then
    # it runs at the full protocol (its part goes beside the others; the variant stays)
    done |= {m for m in variant_parts(reference, label, dataset)
             if m not in done
             and not fits_a_lease(units([m], ccu_init, dataset, epochs)[0], whole,
                                  epochs=epochs)}  # fmt: skip
    todo = [m for m in ALL if m not in done]
    committed_balls = (folder / "balls.json").exists() and (folder / "balls.npz").exists()
    balls = "CCU" in assume_done or committed_balls or balls_on_machine
    problem = None
    if "CCU" in done and not balls and todo:
        problem = (
            f"{folder} holds CCU's part but not its balls' metric (balls.npz, too big for git): "
            f"{', '.join(todo)} cannot be attacked in its balls in another lease; run them in a "
            "call with CCU (move CCU's part away first)"
            + ("; the machine that certified them is still warm: plan --warm attacks there"
               if balls_left_on_machine(reference, label, dataset) else "")
        )  # fmt: skip
        return [], todo, {}, problem
    pending = units(todo, ccu_init, dataset, epochs)
    # Base with ODIN and Maha after it: when no lease holds that lane, it is cut where it
    # stops fitting, and what follows trains Base again before it (weights are not kept)
    for unit in list(pending):
        if (
            unit[0][0] == "Base"
            and len(unit[0]) > 1
            and not fits_a_lease(unit, whole, epochs=epochs)
        ):
            i = pending.index(unit)
            pending[i : i + 1] = split_base(unit[0], whole, ccu_init, dataset, epochs)
    carried = []  # (unit with its training left, started) continuing from the last call
    for unit in list(pending):
        if inflight and unit[0][0] in inflight and spannable(unit[0]) and balls:
            carried.append(continued(unit, inflight[unit[0][0]]))
            pending.remove(unit)
    too_long = {m: t + a for g, t, a in pending
                if not fits_a_lease((g, t, a), whole, epochs=epochs) for m in g}  # fmt: skip
    pending = [u for u in pending if u[0][0] not in too_long]
    if reduce:
        first = call_limit(budget_s - start - reserve_s)
        for m in list(too_long):
            if reduce == "measured" and not measured_on(m, dataset):
                continue
            token = reduced_token(m, first, inflight, dataset, epochs)
            if token is None:
                continue
            del too_long[m]
            (unit,) = units([token], ccu_init, dataset, epochs)
            if inflight and token in inflight and balls:  # stopped for time: it continues
                carried.append(continued(unit, inflight[token]))
            else:
                pending.append(unit)
    calls: list[Call] = []
    dropped = []  # continued trainings no call of this lease can finish: they start over
    left = budget_s - start - reserve_s
    while pending or carried:
        limit = call_limit(left)
        if limit <= 0:
            break
        after = next_limit(left, call_timeout(limit))
        call = _Filling(limit, jobs, after, dataset, epochs, ccu_init)
        lanes, spanning = call.lanes, call.spanning
        still = []
        # first, in lanes of their own: they finish here, or span again (a graphed one that
        # spans goes first: it slows the others, which must still end in time beside it)
        for unit in carried:
            if unit[1] + unit[2] > limit and call.share(unit) and call.span(unit, True):
                continue
            if call.end([*lanes, [unit]]) <= limit:
                lanes.insert(sum(lane[0][0][0] not in spanning for lane in lanes), [unit])
            else:
                still.append(unit)
        if not balls:  # CCU first, in a lane of its own: the others attack in its balls
            ccu = [u for u in pending if u[0] == ["CCU"]]
            if not ccu or call.end([*lanes, [ccu[0]]]) > limit:
                break
            lanes.append([ccu[0]])
            # its balls: certified in its training's process (`ccu train --balls`), whose
            # measured seconds (COST_S) include them
            call.ready = ccu[0][1]
        ready = call.ready
        rest = [u for u in pending if u[0] != ["CCU"] or balls]
        for unit in still:  # trainings continued from the last call that span this one too
            call.span(unit, True)
        # biggest first: into the lane where it ends first, if it finishes in this call; else
        # spanning it and the next in a lane of its own
        variants = [u for u in rest if epochs_of(u[0][0]) is not None and call.gpu(u)]
        taken = []  # variants placed with fewer epochs (as their smaller selves)
        for unit in sorted(rest, key=first_then_biggest):
            if unit in variants or call.place(unit):
                continue
            cut = placed_head(unit, call, ccu_init, dataset, epochs)
            if cut:  # Base here with what of its lane fits, the rest training Base again later
                i = pending.index(unit)
                pending[i : i + 1] = cut
            elif not ready:
                call.span(unit, False)  # not in CCU's call: its balls come too late for a plan
        # reduced variants from graphed epochs last, sized together: all at the same share of
        # the epochs each would have alone (a multiple of 5, down to half), else each as it fits
        variants.sort(key=lambda u: -(u[1] + u[2]))
        before = [list(lane) for lane in lanes]
        for share in VARIANT_SHARES if len(variants) > 1 else ():
            sized = [scaled(u, share, ccu_init, dataset, epochs) for u in variants]
            if all(call.place(v) for v in sized):
                taken += [u for u, v in zip(variants, sized, strict=True) if v is not u]
                break
            lanes[:] = [list(lane) for lane in before]  # one did not fit: none placed
        else:
            for unit in variants:
                for share in VARIANT_SHARES:
                    sized = scaled(unit, share, ccu_init, dataset, epochs)
                    if call.place(sized):
                        taken += [unit] if sized is not unit else []
                        break
        placed = [u for lane in lanes for u in lane]
        dropped += [u for u in still if u not in placed]  # no time left to continue: lost
        if not placed:
            break
        work = limit if spanning else call.end()
        # each lane: a continued training first, then the cheaper units first (more of them
        # finish, and come back, in a call cut short)
        order = [sorted(lane, key=lambda u: (u not in carried, u[1] + u[2])) for lane in lanes]
        named = [[m for u in lane for m in u[0]] for lane in order]
        calls.append(Call([m for lane in named for m in lane], named, work, spanning))
        nxt = []
        for lane in lanes:
            unit = lane[0]
            if unit[0][0] in spanning:
                group, train, attack = unit
                nxt.append(
                    (
                        group,
                        rest_of(train, limit, spanning[group[0]] == "continues", epochs),
                        attack,
                    )  # fmt: skip
                )
        carried = nxt
        pending = [u for u in pending if u not in placed and u not in taken]
        left -= call_timeout(work) + CALL_OVERHEAD_S  # what print_plan gives the call
        balls = True
    later = list(dict.fromkeys(m for u in pending + carried + dropped for m in u[0]))
    return calls, later, too_long, problem


def leases_needed(dataset, reference, label="paper", jobs=4, ccu_init=False, most=20,
                  reduce=False, epochs=EPOCHS, data_s=0):  # fmt: skip
    """How many whole leases (:data:`LEASE_S` each) the planner needs for the methods of the
    grid not yet committed, at today's costs, if each lease runs as planned: ``(leases, the
    methods they run, lease by lease; the methods too long for any lease)``. ``reduce``:
    those too long run as the reduced variants that fit (:func:`plan`). Where CCU's balls do
    not come back (:func:`balls_travel`), what CCU's lease leaves is never run either."""
    assumed: set[str] = set()
    runs, too_long = [], {}
    for _ in range(most):
        calls, later, too_long, problem = plan(
            dataset,
            reference,
            label,
            LEASE_S - data_s,
            jobs,
            ccu_init=ccu_init,
            assume_done=assumed,
            reduce=reduce,
            epochs=epochs,
            data_s=data_s,
        )
        ran = [m for c in calls for m in c.methods]
        if problem or not ran:
            break
        runs.append(ran)
        assumed |= set(ran)
        if not later:
            break
        if "CCU" in ran and not balls_travel(dataset):  # its balls stay on that machine
            return len(runs), runs, sorted({*too_long, *map(method_of, later)})
    return len(runs), runs, sorted(too_long)


def continued(unit, progress: tuple[int, int]):
    """``unit`` stopped for time after ``progress`` = (epochs done, epochs) on a machine still
    warm: the unit with the training it has left, its restart (:data:`RESUME_S`) included."""
    group, train, attack = unit
    epochs_done, epochs = progress
    return (group, int(round(train * (1 - epochs_done / max(epochs, 1)))) + RESUME_S, attack)


def _span(unit, continuing: bool, lanes, spanning, jobs: int, limit: int, after: int,
          epochs: int = EPOCHS) -> bool:  # fmt: skip
    """:func:`plan`: ``unit`` in a lane of its own (appended to ``lanes``, its methods to
    ``spanning``), its training continued in the next call, when a lane is free and the next
    call (``after`` seconds of work) holds the rest."""
    group, train, attack = unit
    if len(lanes) >= jobs or not spannable(group):
        return False
    if rest_of(train, limit, continuing, epochs) + attack > after:
        return False
    lanes.append([unit])
    for m in group:
        spanning[m] = "continues" if continuing else "starts"
    return True


def call_timeout(work: int) -> int:
    """A call's ``timeout_s`` for ``work`` seconds of planned work: 45 s of room past the plan
    before the hard limit (``HARD_LIMIT`` = this minus :data:`HARD_MARGIN_S`; the lease of
    2026-11-27 lost CCU's part to a plan with 20 s), within the tool's 600 s a call."""
    return min(595, int(work + HARD_MARGIN_S + ROOM_S))


#: seconds of room a call keeps past its planned work before the hard limit (call_timeout)
ROOM_S = 45


def call_limit(left: int) -> int:
    """The most work seconds a call can be planned with when ``left`` seconds of the lease
    are before it: its timeout (work + room + hard margin) and its transfers within them."""
    return min(LONGEST_WORK_S, left - CALL_OVERHEAD_S - HARD_MARGIN_S - ROOM_S)


def reduced_token(method: str, limit: int, inflight=None, dataset: str = "mnist",
                  epochs: int = EPOCHS) -> str | None:  # fmt: skip
    """The reduced variant of ``method`` that fits a call of ``limit`` seconds of work
    (training and attack): ``MCD@50`` with the most epochs that fit, a multiple of 5 (the
    labels stay few and readable); the one in flight on the warm machine, when there is one.
    None for CCU and the methods built on Base (no variants: :func:`variant`), and when
    fewer than 5 epochs would fit."""
    if method == "CCU" or needs_base(method):
        return None
    for token in inflight or {}:
        if method_of(token) == method and epochs_of(token) is not None:
            return token
    attack = attack_cost(method, dataset)
    for n in range((epochs - 1) // 5 * 5, 4, -5):
        if train_cost(f"{method}@{n}", dataset=dataset) + attack <= limit:
            return f"{method}@{n}"
    return None


#: the shares of its epochs a reduced variant of a graphed training is tried at, where the
#: variants share the call's GPU (:func:`plan`): not below half, else it waits for more room
VARIANT_SHARES = (1.0, 0.9, 0.8, 0.7, 0.6, 0.5)


def scaled(unit, share: float, ccu_init: bool = False, dataset: str = "mnist",
           epochs: int = EPOCHS):  # fmt: skip
    """``unit``, a reduced variant (``MCD@45``), at ``share`` of its epochs, a multiple of 5
    (at least 5): ``unit`` itself when that is no fewer."""
    (token,) = unit[0]
    n = epochs_of(token)
    fewer = max(5, int(n * share) // 5 * 5)
    return (
        unit if fewer >= n else units([f"{method_of(token)}@{fewer}"], ccu_init, dataset, epochs)[0]
    )


def variant_parts(reference: Path, label: str, dataset: str) -> dict[str, str]:
    """The methods committed as reduced variants attacked in ``label``'s balls: ``{method:
    variant label}`` from every folder of ``dataset`` whose ``balls.json`` names ``label``
    (``absorb`` writes it, :func:`_borrow_balls`)."""
    from ccu.store.records import CERTIFIED_IN

    found = {}
    for balls in sorted(Path(reference).glob(f"*/{dataset}/balls.json")):
        try:
            if json.loads(balls.read_text()).get(CERTIFIED_IN) != label:
                continue
        except ValueError:
            continue
        for m in committed_parts(balls.parent):
            found.setdefault(m, balls.parent.parent.name)
    return found


def reduced_epochs(method: str, epochs: int = 100, dataset: str = "mnist",
                   ccu_init: bool = False, data_s: int = 0) -> int:  # fmt: skip
    """The most epochs (fewer than ``epochs``) of ``method`` that finish in a whole lease
    alone, less its data calls (``data_s``): its reduced variant ``method@N`` in one call
    (variants never span calls); CCU's: the whole grid at N epochs (``plan --epochs``), CCU in
    one call. 0 when not even one epoch fits."""
    for n in range(epochs - 1, 0, -1):
        group = ["CCU"] if method == "CCU" else [f"{method}@{n}"]
        unit = units(group, ccu_init, dataset, n)[0]
        if fits_a_lease(unit, LEASE_S - data_s, epochs=n):
            return n
    return 0


#: the methods the paper's runs on FMNIST and CIFAR-10 want first (issue 39: CCU, Base, OE):
#: a grid reduced whole is sized so that they run in its first lease
FIRST = ("CCU", "Base", "OE")


def grid_epochs(dataset: str, reference: Path, profile: str = "paper", epochs: int = EPOCHS,
                ccu_init: bool = False, jobs: int = 4, data_s: int = 0) -> int:  # fmt: skip
    """The most epochs (a multiple of 5, fewer than ``epochs``; 0 if not even 5) of a grid
    reduced whole (``plan --epochs N``) whose first whole lease runs :data:`FIRST`: CCU
    fitting alone is not enough, since the others are attacked in its balls (in its lease
    only, where they do not come back: :func:`balls_travel`). Planned as :func:`plan` would."""
    from ccu.run.config import get_profile

    def first_lease(n: int) -> set[str]:
        label = get_profile(profile, dataset, epochs=n).label
        calls = plan(dataset, reference, label, LEASE_S - data_s, jobs, ccu_init=ccu_init,
                     epochs=n, data_s=data_s)[0]  # fmt: skip
        return {method_of(m) for c in calls for m in c.methods}

    # from the most epochs CCU alone fits down, in fives: the first whose lease runs them all
    # (not a halving: fewer epochs can plan worse, e.g. Base's lane kept whole below 25)
    top = reduced_epochs("CCU", epochs, dataset, ccu_init, data_s) // 5 * 5
    for n in range(top, 4, -5):
        if set(FIRST) <= first_lease(n):
            return n
    return 0


def first_then_biggest(unit) -> tuple[bool, int]:
    """The order units are placed in a call: those holding a method of :data:`FIRST` first
    (issue 39's order on FMNIST and CIFAR-10; on MNIST they ran first), then the biggest."""
    group, train, attack = unit
    return not {method_of(m) for m in group} & set(FIRST), -(train + attack)


def placed_head(unit, call, ccu_init: bool, dataset: str, epochs: int):
    """Base's lane (``[Base, ODIN, Maha]``) that does not fit ``call`` whole: the longest head
    of it that does, placed in the call (Base first: issue 39 runs it before the others), and
    ``[head, rest]``, the rest a unit that trains Base again (:func:`units`); None when not
    even Base alone fits, or for any other unit."""
    group = unit[0]
    if group[0] != "Base" or len(group) < 2:
        return None
    for k in range(len(group) - 1, 0, -1):
        head = units(group[:k], ccu_init, dataset, epochs)[0]
        if call.place(head):
            return [head, *units(group[k:], ccu_init, dataset, epochs)]
    return None


def split_base(group: list[str], whole: int, ccu_init: bool, dataset: str, epochs: int):
    """Base's lane (``[Base, ODIN, Maha]``) cut into units that each fit a lease of ``whole``
    seconds: Base with as many of the others as fit, then the rest together (training Base
    again, ``units``' ``Base*``) as far as they fit, and so on."""
    out, current = [], []
    for m in group:
        trial = [*current, m]
        if current and not fits_a_lease(units(trial, ccu_init, dataset, epochs)[0], whole,
                                        epochs=epochs):  # fmt: skip
            out.append(units(current, ccu_init, dataset, epochs)[0])
            trial = [m]
        current = trial
    return [*out, units(current, ccu_init, dataset, epochs)[0]]


def _shown(path: Path) -> str:
    """``path`` as printed: relative to the checkout when inside it."""
    path = Path(path)
    return path.relative_to(REPO).as_posix() if path.is_relative_to(REPO) else str(path)


def head_commit() -> str:
    """The checkout's commit (short), with ``+`` when tracked files differ from it: what the
    parts of a call made from this tree record (``CCU_COMMIT``)."""
    git = ["git", "-C", str(REPO)]
    try:
        sha = subprocess.run([*git, "rev-parse", "--short=12", "HEAD"], capture_output=True,
                             text=True, check=True).stdout.strip()  # fmt: skip
        dirty = subprocess.run([*git, "diff", "--quiet", "HEAD"]).returncode != 0
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return sha + ("+" if dirty else "")


#: the order in which call 0 times a dataset's methods (the issue's order for FMNIST and
#: CIFAR-10: CCU, Base and OE first); ODIN and Maha are post hoc on Base: never timed alone
TIME_ORDER = ("CCU", "Base", "OE", "EDL", "DE", "MCD", "GAN", "ACET", "ACET2")


def to_time(dataset: str, methods: list[str]) -> list[str]:
    """The methods of ``methods`` that call 0 times alone on ``dataset``: on MNIST those of
    :data:`ALONE` (COST_S measured the others in a lease), elsewhere those of
    :data:`TIME_ORDER` (no lease has measured a run there), in that order, less those whose
    epoch ``dataset``'s committed benchmark (:func:`epochs_bench`) already holds: a call 0 cut
    short, or failed for a method, is completed by the next. Elsewhere, while one of
    :data:`FIRST` is among ``methods`` (not committed), only those: the lease's time goes to
    running them (issue 39's order), and the rest, planned from estimates meanwhile, are timed
    by a call 0 once CCU, Base and OE are committed."""
    if dataset == "digits":
        return []
    wanted = {method_of(m) for m in methods}
    if dataset not in COST_DATASETS and wanted & set(FIRST):
        wanted &= set(FIRST)
    order = ALONE if dataset in COST_DATASETS else TIME_ORDER
    return [
        m for m in order if m in wanted and "full_epoch_s" not in _timed_alone(m, dataset=dataset)
    ]


def call_zero(
    dataset: str, too_long: dict, planned: list[str]
) -> tuple[str, str, list, list] | None:
    """The call that measures before the lease plans the long methods: each method
    :func:`to_time` names timed alone for an epoch and its attack (``bench_epochs.py``, ~150 s
    on MNIST, ~120 s for CCU, Base and OE elsewhere: :func:`zero_seconds`), while
    ``dataset``'s benchmark is missing; ACET's and ACET2's epochs there run
    as their trainings do, the whole step with its inner attack in CUDA graphs (checked
    against the eager step), so the benchmark of the inner attack's own graphs
    (``bench_acet_graphs.py``, now their fallback; :func:`graphed_train_seconds` when it is
    committed) spends no device time of a lease. ``(command, what it measures, the files it
    writes, the methods it times)``, or None when nothing is to measure."""
    steps, what, files = [], [], []
    alone = to_time(dataset, [*too_long, *planned])
    if alone:
        data = f"/tmp/ccu-devdata/{dataset}"  # where lease_run.sh gathers it: reused there
        bench = epochs_bench(dataset)
        steps.append(
            f"python3 tools/pack_data.py --gather .devdata/{dataset} --into {data} && "
            f"CCU_COMMIT={head_commit()} CCU_OFFLINE_DATA={data} PYTHONPATH=$PWD "
            "python3 benchmarks/bench_epochs.py "
            f"--dataset {dataset} --methods {' '.join(alone)} --out $OUT/{bench.name}"
        )
        what.append(f"an epoch and the attack of {', '.join(alone)}, each alone")
        files.append(bench)
    return ("; ".join(steps), "; ".join(what), files, alone) if steps else None


#: the ignored folder ``tools/pack_data.py`` packs each dataset's data into, to carry
DEVDATA = REPO / ".devdata"
#: a data call's timeout_s: one part (at most 56 MiB) copied and checked (sha256) there
DATA_CALL_S = 60


def data_parts(dataset: str) -> list[str]:
    """The packed parts of ``dataset``'s data (``tools/pack_data.py``), in order, as carried:
    ``[".devdata/fmnist/part-1", ...]``; none when it is not packed."""
    found = [p for p in (DEVDATA / dataset).glob("part-*") if p.name[5:].isdigit()]
    return [_shown(p) for p in sorted(found, key=lambda p: int(p.name[5:]))]


#: MiB a call may carry with CCU's fit, the project and the data's part included: the device's
#: 64 less 2 (the project is measured as ``pack_data.py`` measures it, tracked files and the
#: untracked ones that travel). Not ``pack_data.py``'s 56 for a part: that margin is what leaves
#: room for a fit beside the data (MNIST's, today: 8.5 + 33.8 + 14.1 = 56.4 MiB)
CARRY_MIB = 62


def fit_too_big(inits: list[Path] | int, dataset: str, parts: list[str]) -> str | None:
    """Why CCU's prepared fit (``inits``, or its predicted bytes: :func:`fit_bytes`) cannot
    travel with CCU's call, or None: with the data's one part (several parts come in data
    calls of their own) and the project it would be over :data:`CARRY_MIB` (CIFAR-10's
    metric alone, 3072 x 3072 in float64, is 75 MB)."""
    if not inits:
        return None
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import pack_data  # the project's size as the pack measures it

    fit = inits if isinstance(inits, int) else sum(f.stat().st_size for f in inits)
    part = DEVDATA / dataset / "part-1"
    data = sum(f.stat().st_size for f in part.rglob("*") if f.is_file()) if len(parts) == 1 else 0
    project = sum(pack_data.project_bytes(REPO).values())
    mib = 2**20
    if fit + data + project <= CARRY_MIB * mib:
        return None
    return (f"{fit / mib:.1f} MiB with {data / mib:.1f} MiB of data and the project's "
            f"{project / mib:.1f} MiB is over the {CARRY_MIB} MiB a call carries")  # fmt: skip


def input_dim(dataset: str) -> int:
    """The dimension d of ``dataset``'s inputs (MNIST's 784, CIFAR-10's 3072)."""
    from ccu.data.registry import get_spec

    return math.prod(get_spec(dataset).shape)


#: the d x d float64 matrices of CCU's metric (ccu.core.metric.Mahalanobis: eigenvectors,
#: whitening, unwhitening) that its prepared fit holds: MNIST's and FMNIST's 14.7 MB
FIT_MATRICES = 3


def fit_bytes(dataset: str) -> int:
    """About the bytes of CCU's prepared fit (``prepare``) on ``dataset``, before it is made:
    its metric's :data:`FIT_MATRICES` matrices (the mixtures are small beside them)."""
    return FIT_MATRICES * 8 * input_dim(dataset) ** 2


def balls_bytes(dataset: str, centres: int = 200) -> int:
    """About the bytes of CCU's ``balls.npz`` on ``dataset``: the metric's eigendecomposition
    in float64 (d x d and d) with the paper's 200 centres and radii (MNIST's 6 MB, 5.3 MiB
    committed; CIFAR-10's 80 MB)."""
    d = input_dim(dataset)
    return 8 * (d * d + d) + 8 * centres * (d + 1)


def balls_travel(dataset: str) -> bool:
    """Whether CCU's balls come back with its part (``balls.npz`` up to
    :data:`ccu.run.reference.MAX_BALLS_BYTES`, the most a call brings back in one file), so
    that a later lease attacks in them. If not (CIFAR-10, SVHN), every method is attacked in
    CCU's lease, on the machine that certified them (``lease_run.sh``: "the balls an earlier
    call certified on this machine"), or never in those balls."""
    from ccu.run.reference import MAX_BALLS_BYTES

    return balls_bytes(dataset) <= MAX_BALLS_BYTES


#: call 0's (timeout_s, expected seconds): on MNIST five methods on LeNet and VGG13 (~150 s);
#: elsewhere ZERO_FIXED_S + ZERO_METHOD_S a method, on ResNet18 (~300 s for nine; on 2 CPU
#: cores an FMNIST CCU and Base took 150 s for two batches each: not a GPU's measure, so the
#: room is generous: the timeout ZERO_ROOM times that, at most 480 s)
ZERO_S = {"mnist": (300, 150)}
ZERO_FIXED_S, ZERO_METHOD_S, ZERO_ROOM = 30, 30, 1.6


def zero_seconds(dataset: str, n_methods: int) -> tuple[int, int]:
    """Call 0's ``(timeout_s, expected seconds)`` on ``dataset`` timing ``n_methods``."""
    if dataset in ZERO_S:
        return ZERO_S[dataset]
    work = ZERO_FIXED_S + ZERO_METHOD_S * n_methods
    return min(480, int(math.ceil(work * ZERO_ROOM))), work


def grid_label(args) -> tuple[str, dict]:
    """The label a plan's calls write to and the profile fields they run with: the profile's
    own, or at ``--epochs`` (a grid reduced whole: its own label, ``paper-e70``)."""
    from ccu.run.config import get_profile

    fields = {"epochs": args.epochs} if args.epochs else {}
    prof = get_profile(args.profile, args.dataset, **fields)
    balls = reference_dir(args.reference, prof.label, args.dataset) / "balls.json"
    if fields and balls.exists():
        from ccu.store.records import CERTIFIED_IN

        home = json.loads(balls.read_text()).get(CERTIFIED_IN)
        if home:
            raise ValueError(
                f"{prof.label}/{args.dataset} holds reduced variants attacked in {home}'s balls: "
                f"a grid of {args.epochs} epochs cannot share their folder; choose other epochs"
            )
    return prof.label, fields


def print_plan(args) -> int:
    from ccu.data import REGISTRY
    from ccu.run.config import get_profile

    images = sorted(d for d, spec in REGISTRY.items() if len(spec.shape) == 3)
    if args.dataset not in images:
        what = "unknown" if args.dataset not in REGISTRY else "not an image dataset:"
        print(f"[lease] error: {what} --dataset {args.dataset!r}; a lease plans one of: "
              f"{', '.join(images)}", file=sys.stderr)  # fmt: skip
        return 2
    reference = Path(args.reference)
    if reference.exists() and not reference.is_dir():
        print(f"[lease] error: --reference {reference} is a file, not a folder of reference "
              "results (the plan starts from what it holds)", file=sys.stderr)  # fmt: skip
        return 2
    if not reference.parent.is_dir():
        print(f"[lease] error: --reference {reference}: {reference.parent} does not exist (the "
              "plan starts from what the folder holds)", file=sys.stderr)  # fmt: skip
        return 3
    if not reference.exists():  # a new folder: nothing committed (said, in case of a typo)
        print(f"({reference} does not exist yet: nothing is committed there)", file=sys.stderr)
    try:
        label, fields = grid_label(args)
    except (ValueError, TypeError) as exc:  # an unknown profile or dataset: one line
        print(f"[lease] error: {exc}", file=sys.stderr)
        return 2
    epochs = args.epochs or EPOCHS
    if args.profile != "paper" and args.epochs:
        print("[lease] error: --epochs reduces the paper's protocol: use it with --profile paper",
              file=sys.stderr)  # fmt: skip
        return 2
    folder = reference_dir(args.reference, label, args.dataset)
    done = committed_parts(folder)
    inits = sorted(init_dir(args.dataset).glob("ccu-init-*.pt"))
    parts = data_parts(args.dataset)
    too_big = fit_too_big(inits, args.dataset, parts)
    if too_big:
        print(f"(CCU's fit in {_shown(init_dir(args.dataset))} is not carried: {too_big}; CCU "
              f"fits it on the device, ~{ccu_build_s(args.dataset)} s of its call, as planned below)")  # fmt: skip
        inits = []
    record = read_inflight(label, args.dataset, resume_dir(args.reference))
    inflight = {m: (d["epochs_done"], d["epochs"]) for m, d in record.items()}
    if inflight:
        what = ", ".join(f"{m} (epoch {d} of {n})" for m, (d, n) in inflight.items())
        if args.warm:
            print(f"continued on the warm machine: {what}")
        else:
            print(f"stopped for time in the last call: {what}; with --warm (its machine still "
                  "warm: the next call starts within 30 s of the last one's end) they continue, "
                  "else they start over")  # fmt: skip

    # data in several parts: each carried by a call of its own first (64 MiB a call), unless
    # the machine is still warm and holds them gathered (--warm)
    data_calls = parts if len(parts) > 1 and not args.warm else []
    budget = args.budget_s - len(data_calls) * (DATA_CALL_S + CALL_OVERHEAD_S)
    # what every lease on a fresh machine spends on them: a whole lease is that much shorter
    data_s = (DATA_CALL_S + CALL_OVERHEAD_S) * len(parts) if len(parts) > 1 else 0

    # CCU's balls committed without their arrays by the last call: on the warm machine only
    on_machine = args.warm and balls_left_on_machine(args.reference, label, args.dataset)
    if on_machine:
        print("CCU's balls (not committed: too big to come back) are assumed on the warm "
              "machine that certified them; if it went cold, the calls stop at once (exit 3)")  # fmt: skip

    def planned(reduce):
        return plan(
            args.dataset, args.reference, label, budget, args.jobs, ccu_init=bool(inits),
            inflight=inflight if args.warm else None, reduce=reduce, epochs=epochs,
            data_s=data_s, warm=args.warm, balls_on_machine=on_machine,
        )  # fmt: skip

    calls, later, too_long, problem = planned(reduce=False)
    # call 0 measures first what a reduced variant would be sized by: variants only after it
    # (not on the machine that holds CCU's balls: its time goes to the methods attacked there)
    zero = None if on_machine else call_zero(
        args.dataset, too_long, [method_of(m) for c in calls for m in c.methods] + later
    )  # fmt: skip
    zero_left_out = None  # a call 0 the budget cannot hold: not planned, said below
    if zero and zero_seconds(args.dataset, len(zero[3]))[0] > budget:
        zero_left_out, zero = zero, None
    # reduced variants of the paper's protocol only (EPOCHS is its epochs): not in a grid
    # reduced whole (--epochs), whose label a variant's could be
    paper = args.profile == "paper" and not args.epochs
    if (not zero or args.reduce) and too_long and not problem and paper:
        # sized from measurements only, unless asked (--reduce: call 0 failed)
        calls, later, too_long, problem = planned(reduce=True if args.reduce else "measured")
        if args.reduce:
            zero = None  # the variants are sized from what is known: no call 0 before them
    if problem:
        print(f"[lease] error: {problem}", file=sys.stderr)
        return 3
    print(
        f"{label}/{args.dataset}: committed {len(done)} of {len(ALL)} ({', '.join(done) or 'none'})"
    )
    for m, vl in variant_parts(args.reference, label, args.dataset).items():
        print(f"  {m}: committed as the reduced variant {vl} (attacked in these balls)")
    carry = parts[:1] if len(parts) == 1 else []  # several: carried by the data calls
    # not packed yet: how many parts it takes (one a call, over 64 MiB) decides the calls, so
    # none is printed before it (a call that carried a part too few would stop at its gather)
    unpacked = args.dataset != "digits" and not parts
    if unpacked:
        print(f"first, here: python tools/pack_data.py --dataset {args.dataset}   (the data to "
              "carry); then plan again: the calls depend on how many parts it packs into")  # fmt: skip
    with_ccu = any("CCU" in c[0] for c in calls)
    ccu_todo = "CCU" in too_long or "CCU" in [m for c in calls for m in c[0]]
    big_fit = None if inits or too_big else fit_too_big(fit_bytes(args.dataset), args.dataset,
                                                        parts)  # fmt: skip
    if inits and with_ccu:  # checked on the device before CCU trains (lease_run.sh)
        carry.append(_shown(init_dir(args.dataset)))
    elif ccu_todo and big_fit:
        print(f"(CCU's fit on {args.dataset} would not be carried: about {big_fit}; CCU fits "
              f"it on the device, ~{ccu_build_s(args.dataset)} s of its call, as planned below)")  # fmt: skip
    elif ccu_todo and not too_big:
        given = f" --overrides '{json.dumps(fields)}'" if fields else ""
        print(
            f"first, here: python tools/lease.py prepare --dataset {args.dataset}{given}   (CCU's "
            f"initial fit, carried: ~{ccu_build_s(args.dataset)} s less of CCU's call; then plan "
            "again)"
        )
    if unpacked:
        calls, data_calls = [], []  # none before the data is packed (above), call 0 neither
    commit = head_commit()
    left = budget
    gather = (f"python3 tools/pack_data.py --gather .devdata/{args.dataset} "
              f"--into /tmp/ccu-devdata/{args.dataset}")  # fmt: skip
    for k, part in enumerate(data_calls, 1):
        print(f"data call {k} of {len(data_calls)}: command \"{gather}\", carry "
              f"{json.dumps([part])}, timeout_s {DATA_CALL_S}   (the data of {args.dataset} is "
              f"{len(parts)} parts, over the 64 MiB one call carries: one a call, gathered on "
              "the machine, which keeps them while warm; the calls below carry none; it exits "
              "3, 'incomplete', until the last part has come)")  # fmt: skip
    if len(parts) > 1 and args.warm:
        print(f"(the data of {args.dataset}, {len(parts)} parts, is assumed gathered on the warm "
              "machine; if it went cold, plan again without --warm)")  # fmt: skip
    if zero_left_out and not unpacked:
        timeout = zero_seconds(args.dataset, len(zero_left_out[3]))[0]
        print(f"call 0 ({zero_left_out[1]}) needs a timeout_s of {timeout}, more than the "
              f"{budget} s left: not in this lease")  # fmt: skip
    elif zero and not unpacked:
        command, what, files, timed = zero
        timeout, work = zero_seconds(args.dataset, len(timed))
        print(f"call 0 (first: {what}): command \"{command}\", carry {json.dumps(carry)}, "
              f"timeout_s {timeout}   (~{work} s; the benchmark is written after each method: "
              "what finished comes back if it is cut short)")  # fmt: skip
        print(
            "  then here at once (the machine is wiped after 30 s idle; the data gathered there "
            "stays for the next call): python tools/lease.py absorb <files_at> (commits "
            f"{', '.join(_shown(b) for b in files)}); and plan again with --warm and the "
            "budget_left_s it reports: the methods measured are then planned from them"
        )
    for k, call in enumerate(calls, 1):
        timeout = call_timeout(call.work)
        # the device's copy of .git may be stale: the commit the parts record, said here
        env = f"CCU_COMMIT={commit} JOBS={len(call.lanes)} HARD_LIMIT={timeout - HARD_MARGIN_S}"
        if args.profile != "paper":
            env += f" PROFILE={args.profile}"
        if fields:
            env += f" OVERRIDES='{json.dumps(fields)}'"
        lanes = " / ".join(" ".join(lane) for lane in call.lanes)  # the plan's lanes, as given
        print(
            f'call {k}: command "{env} bash tools/lease_run.sh {args.dataset} {lanes}", '
            f"carry {json.dumps(carry)}, timeout_s {timeout}   (~{call.work} s of work)"
        )
        graphed = {m: busy_share(m, args.dataset) for m in call.methods}
        graphed = {m: b for m, b in graphed.items() if b}
        if graphed:  # planned as sharing the GPU (_Filling): say with what shares
            shares = ", ".join(f"{m} {b:.0%}" for m, b in graphed.items())
            print(f"  graphed trainings take the GPU in turns, planned busy: {shares}")
        for token in call.methods:
            if epochs_of(token) is not None:
                m = method_of(token)
                full = train_cost(m, dataset=args.dataset, epochs=epochs) + attack_cost(
                    m, args.dataset
                )
                vlabel = variant(args.profile, fields, args.dataset, token, label)[0]
                print(f"  {token}: {m} as the reduced variant of {epochs_of(token)} epochs "
                      f"(label {vlabel}, its own folder, never shown as {label}): its {epochs} "
                      f"epochs, ~{full} s, do not fit a lease")  # fmt: skip
        for m, how in call.spanning.items():
            print(f"  {m}: its training {how} here, stops after a saved epoch before the hard "
                  "limit and continues in the next call: make that call at once (the machine "
                  "is wiped after 30 s idle, and the training with it)")  # fmt: skip
        nxt = calls[k] if k < len(calls) else None
        if call.spanning and nxt is not None:
            print(f"  then at once call {k + 1}; here afterwards: python tools/lease.py absorb "
                  f"<files_at of each call> --dataset {args.dataset}")  # fmt: skip
        else:
            print(
                f"  then here: python tools/lease.py absorb <files_at> --dataset {args.dataset}"
                + (
                    "; and plan again with the budget_left_s the call reports"
                    + (
                        " and --warm, at once (CCU's balls stay on that machine)"
                        if "CCU" in call.methods and not balls_travel(args.dataset)
                        else ""
                    )
                    if nxt is not None
                    else ""
                )  # fmt: skip
            )
        left -= timeout + CALL_OVERHEAD_S
    if not calls and not unpacked:
        print("no call fits the device time left" if later or too_long else "nothing left to run")
    stranded = [m for m in later if not balls_travel(args.dataset)
                and (with_ccu or on_machine) and method_of(m) != "CCU"]  # fmt: skip
    if stranded:  # CCU's balls stay on this lease's machine: attacked there or never
        print(f"not in CCU's lease: {', '.join(stranded)}: CCU's balls on {args.dataset} "
              f"(~{balls_bytes(args.dataset) / 2**20:.0f} MiB, over the 16 MiB a call brings "
              "back in a file) stay on the machine that certifies them, so a later lease cannot "
              "attack in them; to have them, reduce the grid (plan --epochs) until they fit "
              "CCU's lease")  # fmt: skip
        later = [m for m in later if m not in stranded]
    ccu_first = "CCU" in too_long and "CCU" not in done  # the others wait for its balls
    for m, s in too_long.items():
        if m == "CCU":  # the whole grid at n: CCU with the methods wanted first in its lease
            # (with CCU's fit carried where it can be: the plan at n asks for `prepare`)
            n = grid_epochs(args.dataset, args.reference, args.profile, epochs,
                            bool(inits) or not (too_big or big_fit), args.jobs, data_s)  # fmt: skip
        else:
            n = reduced_epochs(m, epochs, args.dataset, bool(inits), data_s) // 5 * 5
        if ccu_first and m != "CCU":
            continue  # said once, after CCU's line
        if m == "CCU":  # no variant: every method is attacked in the balls CCU certifies
            whole = get_profile(args.profile, args.dataset, epochs=max(n, 1)).label
            what = (
                "every other method is attacked in the balls it certifies, so none of "
                f"{label} can run before it; "
                + ("call 0 times it alone first (its cost is estimated), then plan again; if "
                   "it still does not fit, " if zero and "CCU" in zero[1] else "")
                + (f"the grid runs reduced whole: plan --dataset {args.dataset} --epochs {n} "
                   f"(label {whole}, never shown as {label}; at {n} epochs "
                   f"{', '.join(FIRST)} run in its first lease)" if n >= 5 else
                   f"no grid of at least 5 epochs runs {', '.join(FIRST)} in a lease")
            )  # fmt: skip
        elif needs_base(m):
            what = "it runs on Base, in Base's lane, and that lane is too long as a whole"
        elif args.epochs:
            what = ("a grid reduced whole has no variants (their labels could be another "
                    "grid's): " + (f"it fits a lease at {n} epochs, the grid with it" if n >= 5
                                   else "not even 5 epochs of it fit a lease"))  # fmt: skip
        elif not zero and not measured_on(m, args.dataset):
            now = (f"now it would be {m}@{n}, its own label, never shown as {label}" if n >= 5
                   else "now not even 5 epochs of it would fit a lease")  # fmt: skip
            what = (
                f"not measured on {args.dataset} yet: its reduced variant is sized once a call "
                f"0 has timed it (after CCU, Base and OE are committed), never from the "
                f"estimates ({now})"
            )
        elif n < 5:
            what = "no reduced variant of at least 5 epochs fits a lease either"
        elif zero:
            what = (
                "after call 0 and its absorb, plan again: the reduced variant that then fits is "
                f"planned (now it would be {m}@{n}, its own label, never shown as {label})"
            )

        else:
            what = (f"no reduced variant of at least 5 epochs fits this lease's first call (in a "
                    f"whole lease: {m}@{n}, its own label)")  # fmt: skip
        how = " (two calls, its training continued)" if spannable([m]) else ""
        print(f"{m}: ~{s} s, more than a lease holds even alone{how}: {what}")
    if ccu_first:
        waiting = [m for m in ALL if m != "CCU" and m not in done]
        print(f"waiting for CCU's balls: {', '.join(waiting)} (each planned once CCU fits)")
        later = [m for m in later if method_of(m) not in waiting]
    if later:
        print(f"for a later lease: {', '.join(later)}")
        if calls and len(calls[0].lanes) == args.jobs:
            print(f"  (every one of the {args.jobs} lanes is taken: with --jobs "
                  f"{args.jobs + len(later)} more of them may fit this lease; a lane is a "
                  "process on the GPU and its share of the machine's 16 cores)")  # fmt: skip
    guessed = [m for m in ALL if m not in done and not measured_on(m, args.dataset)]
    if guessed:
        timed = epochs_bench(args.dataset)
        times = zero[3] if zero else []
        rest = [m for m in guessed if m not in times and not needs_base(m)]  # ODIN, Maha: Base's
        how = (("call 0 times them" if not rest else
                f"call 0 times {', '.join(times)}; the rest once CCU, Base and OE are committed")
               if zero else f"its call 0 ({_shown(timed)}) has no numbers for them")  # fmt: skip
        print(f"(not measured on {args.dataset}: {', '.join(guessed)}, planned from MNIST's "
              f"runs scaled by {_shown(NETWORK_BENCH)}'s epochs of {args.dataset}'s network; "
              f"{how})")  # fmt: skip
    n, runs, never = leases_needed(args.dataset, args.reference, label, args.jobs, bool(inits),
                                   epochs=epochs, data_s=data_s)  # fmt: skip
    if ccu_first:
        print("the grid at these costs: none of it in a lease before CCU fits one (see CCU above)")
    elif n or never:
        each = "; ".join(f"{k}: {', '.join(r)}" for k, r in enumerate(runs, 1))
        print(f"the grid at these costs: {n} whole lease{'s' * (n != 1)} of {LEASE_S // 60} "
              f"minutes ({each or 'none'})"
              + (f"; never in a lease as they are: {', '.join(never)}" if never else ""))  # fmt: skip
        if never and "CCU" not in never and paper:
            n, runs, never = leases_needed(
                args.dataset, args.reference, label, args.jobs, bool(inits), reduce=True,
                epochs=epochs, data_s=data_s,
            )  # fmt: skip
            each = "; ".join(f"{k}: {', '.join(r)}" for k, r in enumerate(runs, 1))
            print(f"  with reduced variants for those: {n} whole lease{'s' * (n != 1)} "
                  f"({each or 'none'})" + (f"; never: {', '.join(never)}" if never else ""))  # fmt: skip
    graphed = [m for m in GRAPHED if graphed_train_seconds(m) is not None]
    if graphed and args.dataset in COST_DATASETS:
        print(f"{', '.join(graphed)}: planned with the inner attack in CUDA graphs "
              f"({_shown(GRAPHS_BENCH)})")  # fmt: skip
    return 0


# ----------------------------------------------------------------------------- prepare
def init_dir(dataset: str) -> Path:
    """The ignored folder of CCU's initial fits carried with ``dataset``'s calls."""
    return REPO / ".devinit" / dataset


def _ccu_fit_inputs(dataset: str, profile: str, seed: int, overrides: dict | None):
    """CCU (on the CPU, not built) for ``dataset`` at ``profile``, its data, the profile and
    the inputs its initial fit depends on (:func:`ccu.methods.prefit.init_inputs`)."""
    from ccu.methods import get_method, prefit
    from ccu.run.config import get_profile, train_settings
    from ccu.run.experiment import run_data

    prof = get_profile(profile, dataset, **(overrides or {}))
    data = run_data(dataset, prof, seed)
    method = get_method("CCU")(data.spec, train_settings(dataset), prof, seed=seed, device="cpu")
    return method, data, prof, prefit.init_inputs(method, data)


def prepare(dataset: str, profile: str = "paper", seed: int = 0, folder: Path | None = None,
            overrides: dict | None = None, log=print) -> Path:  # fmt: skip
    """CCU's initial fit (metric and both mixtures, :mod:`ccu.methods.prefit`) for ``dataset`` at
    ``profile``, fitted here on the CPU once and written to ``folder`` (default
    ``.devinit/<dataset>/``), which the calls carry: the device then skips the fit (~130 s of
    a call on MNIST). A fit with the same inputs already there is kept."""
    import time

    from ccu.methods import prefit

    folder = Path(folder) if folder is not None else init_dir(dataset)
    method, data, _, inputs = _ccu_fit_inputs(dataset, profile, seed, overrides)
    path = prefit.init_path(folder, prefit.init_key(inputs))
    if prefit.find_init(inputs, folder) is not None:
        log(f"{path.relative_to(REPO) if path.is_relative_to(REPO) else path}: already fitted")
        return path
    start = time.perf_counter()
    # the classifier is not saved (the device draws its own from the seed): any will do here
    method.model = method.fit_initial(method._classifier(), data)
    info = method.checkpoint_info()["densities"]
    path = prefit.save_init(folder, inputs, info, method.model)
    size = path.stat().st_size / 2**20
    shown = path.relative_to(REPO) if path.is_relative_to(REPO) else path
    log(f"{shown}: CCU's initial fit, {time.perf_counter() - start:.0f} s here, {size:.1f} MiB")
    return path


def check_init(dataset: str, profile: str = "paper", seed: int = 0, folder: Path | None = None,
               overrides: dict | None = None, log=print) -> bool:  # fmt: skip
    """Whether a carried fit in ``folder`` (default ``$CCU_INIT_DIR``, else
    ``.devinit/<dataset>/``) is the one this machine's build would load: its inputs (:func:`ccu.methods.prefit.init_inputs`: the data
    as decoded here, the settings, the code) computed here, without fitting. On the device,
    before the call that trains CCU: a decoder that differs by one grey level, another key,
    and CCU would fit again inside the call (~125 s more, more than the call holds). When no
    fit matches, says which inputs differ from each fit carried."""
    from ccu.methods import prefit

    if folder is None:  # where the build looks (tools/lease_run.sh sets it), else the default
        folder = os.environ.get(prefit.INIT_DIR_ENV) or init_dir(dataset)
    folder = Path(folder)
    _, _, prof, inputs = _ccu_fit_inputs(dataset, profile, seed, overrides)
    key = prefit.init_key(inputs)
    if prefit.find_init(inputs, folder) is not None:
        log(f"{dataset} ({prof.label}): the carried fit ccu-init-{key}.pt matches this machine")
        return True
    log(f"{dataset} ({prof.label}): no carried fit matches this machine (key {key})")
    import torch

    carried = sorted(folder.glob("ccu-init-*.pt"))
    for path in carried:
        saved = torch.load(path, map_location="cpu", weights_only=True).get("inputs", {})
        differ = sorted(k for k in set(saved) | set(inputs) if saved.get(k) != inputs.get(k))
        log(f"  {path.name}: differs in {', '.join(differ) or 'nothing (renamed by hand?)'}")
    if not carried:
        log(f"  no fit in {folder}")
    return False


def prepare_command(args) -> int:
    from ccu.data import DataNotFoundError

    try:
        overrides = json.loads(args.overrides or "{}")
        if not isinstance(overrides, dict):
            raise ValueError(
                f"--overrides must be a JSON object of profile fields, not {args.overrides}"
            )
        if args.seed < 0:
            raise ValueError(f"--seed must be a non-negative integer, not {args.seed}")
        if args.check:
            return 0 if check_init(args.dataset, args.profile, args.seed, None, overrides) else 1
        prepare(args.dataset, args.profile, args.seed, overrides=overrides)
    except DataNotFoundError as exc:
        print(f"[lease] error: {exc}", file=sys.stderr)
        return 3
    except (ValueError, TypeError) as exc:  # an unknown dataset, profile or field; bad JSON
        print(f"[lease] error: {exc}", file=sys.stderr)
        return 2
    return 0


# ----------------------------------------------------------------------------- absorb
#: a folder's sha256 sums in a call's archive (``lease_run.sh`` writes them: ``sha256sum``'s
#: format), checked by :func:`absorb` and never written to the reference
SUMS_FILE = "SHA256SUMS"


class AbsorbError(Exception):
    def __init__(self, message: str, code: int):
        super().__init__(message)
        self.code = code


def read_archive(path: Path) -> dict[str, bytes]:
    """The files of a ``.parts.tgz``: ``{"<label>/<dataset>/<name>": bytes}``, only regular
    files with the names a part may have (no links, no other paths)."""
    out = {}
    try:
        with tarfile.open(path, "r:gz") as tf:
            for member in tf.getmembers():
                name = member.name.removeprefix("./")
                if member.isdir() or name in ("", "."):
                    continue
                parts = name.split("/")
                if (not member.isfile() or len(parts) != 3 or ".." in parts
                        or not (PART_FILE.match(parts[2]) or parts[2] in BALL_FILES
                                or parts[2] in ("table1.json", "figure2.npz", SUMS_FILE))):  # fmt: skip
                    raise AbsorbError(f"{path}: unexpected member {member.name!r}", 4)
                out[name] = tf.extractfile(member).read()
    except (tarfile.TarError, EOFError, OSError) as exc:
        raise AbsorbError(f"{path} is not a whole archive ({exc}); it is not absorbed", 4) from exc
    return out


def absorb(files_at: Path, reference: Path, dataset: str | None = None, log=print) -> dict:
    """Unpack the parts a call brought back (every ``*.parts.tgz`` in ``files_at``; members
    ``<label>/<dataset>/<file>``) into ``reference/<label>/<dataset>/``: each whole part not yet
    there (a committed part is never replaced; the same part again changes nothing; a CCU part
    may gain its guarantees), the balls when none are there (other balls are refused: a table
    never mixes attacks in different balls), then ``table1.json`` and ``figure2.npz`` rebuilt
    from all the parts. Returns ``{folder: files written}``."""
    archives = sorted(Path(files_at).glob("*.parts.tgz"))
    if not archives:
        raise AbsorbError(f"no *.parts.tgz in {files_at}: nothing came back to absorb", 3)
    grouped: dict[tuple[str, str], dict[str, bytes]] = {}
    for archive in archives:
        for name, data in read_archive(archive).items():
            label, ds, file = name.split("/")
            if dataset is None or ds == dataset:
                grouped.setdefault((label, ds), {})[file] = data
    if not grouped:
        raise AbsorbError(f"no part of {dataset} in {', '.join(map(str, archives))}", 3)
    for (label, ds), files in grouped.items():  # check every folder before writing any
        _check_members(f"{label}/{ds}", files)
        _check_balls(reference_dir(reference, label, ds), files)
    # A trial first, on a copy of every folder of these datasets (a reduced variant borrows
    # another label's balls): what fails there (a part the tables cannot be rebuilt from) fails
    # before anything is written here, so a call is absorbed whole or not at all.
    with tempfile.TemporaryDirectory(prefix="ccu-absorb-") as tmp:
        trial = Path(tmp) / "reference"
        for ds in {ds for _, ds in grouped}:
            for folder in Path(reference).glob(f"*/{ds}"):
                if folder.is_dir():
                    shutil.copytree(folder, trial / folder.parent.name / ds)
        try:
            _absorb_all(trial, grouped, lambda *_: None)
        except AbsorbError as exc:
            raise AbsorbError(f"{exc} (nothing of this call is written)", exc.code) from exc
        except Exception as exc:  # a part that breaks the rebuild in another way
            raise AbsorbError(
                f"the call's parts cannot be absorbed ({type(exc).__name__}: {exc}); nothing of "
                "it is written",
                4,
            ) from exc
    return _absorb_all(Path(reference), grouped, log)


def _absorb_all(reference: Path, grouped: dict, log) -> dict:
    # the folders that bring balls first: a reduced variant's parts in the same call were
    # attacked in them (:func:`_borrow_balls`)
    order = sorted(grouped, key=lambda k: "balls.json" not in grouped[k])
    return {
        reference_dir(reference, label, ds): _absorb_folder(
            reference_dir(reference, label, ds), grouped[(label, ds)], log
        )
        for label, ds in order
    }


def _check_members(where: str, files: dict[str, bytes]) -> None:
    """Every file of a folder's share of a call readable as what its name says (a JSON object,
    an ``.npz`` whose arrays load, a UTF-8 CSV), the balls' arrays the ones ``balls.json``
    names (its ``balls_npz_sha256``) and, where the archive lists them (``SHA256SUMS``, written
    by ``lease_run.sh``), every file's sha256: :class:`AbsorbError` (4) naming the file."""
    import hashlib
    import io

    import numpy as np

    def bad(name: str, why: str) -> AbsorbError:
        return AbsorbError(f"{where}/{name} is damaged ({why}); the call is not absorbed", 4)

    sums = files.get(SUMS_FILE)
    if sums is not None:
        try:
            listed = dict(
                reversed(line.split(None, 1)) for line in sums.decode().splitlines() if line
            )
        except (UnicodeDecodeError, ValueError) as exc:
            raise bad(SUMS_FILE, f"not a list of sha256 sums: {exc}") from exc
        for name, data in files.items():
            if name == SUMS_FILE:
                continue
            want = listed.get(name.strip()) or listed.get(f"*{name}")
            if want is None:
                raise bad(name, f"not listed in {SUMS_FILE}")
            if hashlib.sha256(data).hexdigest() != want.strip():
                raise bad(name, f"its sha256 is not the one {SUMS_FILE} lists")
        for name in listed:
            if name.lstrip("*") not in files:
                raise bad(name.lstrip("*"), f"listed in {SUMS_FILE} but not in the archive")
    parsed = {}
    for name, data in files.items():
        if name == SUMS_FILE:
            continue
        try:
            if name.endswith(".json"):
                parsed[name] = json.loads(data)
                if not isinstance(parsed[name], dict):
                    raise ValueError("not a JSON object")
            elif name.endswith(".npz"):
                with np.load(io.BytesIO(data), allow_pickle=False) as z:
                    for key in z.files:
                        z[key]
            elif name.endswith(".csv"):
                data.decode("utf-8")
        except Exception as exc:  # whatever the reader raises: the file is not what it says
            raise bad(name, f"{type(exc).__name__}: {exc}") from exc
    balls = parsed.get("balls.json")
    if balls is not None and "balls.npz" in files:
        want = balls.get("balls_npz_sha256")
        if want is not None and hashlib.sha256(files["balls.npz"]).hexdigest() != want:
            raise bad("balls.npz", "its sha256 is not the one balls.json names")


def _check_balls(folder: Path, files: dict[str, bytes]) -> None:
    incoming = files.get("balls.json")
    if incoming is not None and (folder / "balls.json").exists():
        try:
            key = json.loads((folder / "balls.json").read_text())[BALLS_KEY]
        except (ValueError, KeyError) as exc:
            raise AbsorbError(
                f"the committed {folder / 'balls.json'} is damaged ({type(exc).__name__}: "
                f"{exc}); restore it from git (`git checkout -- {folder / 'balls.json'}`)",
                4,
            ) from exc
        if json.loads(incoming)[BALLS_KEY] != key:
            raise AbsorbError(
                f"the call's balls are not the committed ones in {folder}: its parts are attacks "
                "in other balls and are not absorbed (certify once: CCU's part brings the balls)",
                4,
            )


def _absorb_folder(folder: Path, files: dict[str, bytes], log) -> list[str]:
    """One folder's share of :func:`absorb`. The balls and the part of the method that
    certified them travel together: balls are taken only with that method's whole part, and a
    part only when it was attacked in the balls committed (or taken) here; anything else waits
    for a call that runs it again."""
    from ccu.store.records import BALLS_FROM, PART_BALLS_KEY
    from ccu.store.reference_results import assemble_reference
    from ccu.store.results import CorruptResultError, atomic_bytes

    by_method: dict[str, dict[str, bytes]] = {}
    for name, data in files.items():
        m = PART_FILE.match(name)
        if m:
            by_method.setdefault(m.group(1), {})[m.group(2)] = data
    needed = {"config.json", "metrics.json", "attack.json", "attack.npz"}
    whole = {}
    for method, part in sorted(by_method.items()):
        if needed <= set(part):
            whole[method] = part
        else:
            missing = ", ".join(sorted(needed - set(part)))
            log(f"{method}: incomplete part ({missing} missing); not absorbed")
    take_balls, key = False, None
    written = []
    if not (folder / "balls.json").exists() and "balls.json" not in files:
        written += _borrow_balls(folder, whole)
    if (folder / "balls.json").exists():
        key = json.loads((folder / "balls.json").read_text())[BALLS_KEY]
    elif "balls.json" in files:
        incoming = json.loads(files["balls.json"])
        owner = whole.get(incoming[BALLS_FROM])
        committed = folder / f"{incoming[BALLS_FROM]}.config.json"
        # taken with their method's part only: the balls of a part that is not taken (another
        # run of it is committed) would sit beside that run's numbers
        other_run = (
            owner is not None
            and committed.exists()
            and not _same_run(committed.read_bytes(), owner["config.json"])
        )
        differ = [
            n for n in BALL_FILES if n in files and (folder / n).exists()
            and (folder / n).read_bytes() != files[n]
        ]  # fmt: skip
        if (
            owner is not None
            and json.loads(owner["attack.json"])[PART_BALLS_KEY] == incoming[BALLS_KEY]
            and not other_run
            and not differ
        ):
            take_balls, key = True, incoming[BALLS_KEY]
        elif other_run or differ:
            log(f"the balls came with a part of another {incoming[BALLS_FROM]} run than the one "
                f"committed in {folder} ({', '.join(differ) or 'its config'} differ): not "
                "absorbed, nor the parts attacked in them")  # fmt: skip
        else:
            log(f"the balls came without the whole part of {incoming[BALLS_FROM]}: not absorbed")
    folder.mkdir(parents=True, exist_ok=True)
    if take_balls:
        for name in BALL_FILES:  # balls.json last: the marker
            if name in files and name != "balls.json":
                atomic_bytes(folder / name, files[name])
                written.append(name)
        atomic_bytes(folder / "balls.json", files["balls.json"])
        written.append("balls.json")
    for method, part in whole.items():
        if key is None or json.loads(part["attack.json"])[PART_BALLS_KEY] != key:
            log(f"{method}: attacked in balls that are not committed here (their method's part "
                "did not come back); not absorbed: run it again")  # fmt: skip
            continue
        committed = folder / f"{method}.config.json"
        if committed.exists():
            same = _same_run(committed.read_bytes(), part["config.json"])
            extra = [k for k in part if not (folder / f"{method}.{k}").exists()]
            if same and extra:  # e.g. CCU's guarantees, sent after its part
                for k in extra:
                    atomic_bytes(folder / f"{method}.{k}", part[k])
                    written.append(f"{method}.{k}")
            elif not same:
                log(f"{method}: a part of another run is committed in {folder}; it is kept")
            continue
        for k in ("metrics.json", "attack.npz", "attack.json", "guarantees.json", "config.json"):
            if k in part:  # the config last: it marks the part as whole
                atomic_bytes(folder / f"{method}.{k}", part[k])
                written.append(f"{method}.{k}")
    if written:
        try:
            assemble_reference(folder)
        except (CorruptResultError, KeyError, ValueError) as exc:
            raise AbsorbError(
                f"{folder}: the tables cannot be rebuilt from its parts ({exc})", 4
            ) from exc
    return written


def _borrow_balls(folder: Path, whole: dict[str, dict[str, bytes]]) -> list[str]:
    """A reduced variant's folder (``paper-e50/mnist``) without balls whose parts were attacked
    in the balls committed in another label's folder of the dataset (``paper/mnist``, where
    ``lease_run.sh`` took them): a copy of that ``balls.json`` naming the label
    (:data:`ccu.store.records.CERTIFIED_IN`) and of ``radii.csv`` (a few KB); the arrays and
    the certificate stay there (:func:`ccu.store.reference_results.balls_home`). The files
    written; none when no committed folder holds those balls."""
    from ccu.store.records import CERTIFIED_IN, PART_BALLS_KEY
    from ccu.store.results import atomic_bytes

    keys = {json.loads(part["attack.json"])[PART_BALLS_KEY] for part in whole.values()}
    for other in sorted(folder.parent.parent.glob(f"*/{folder.name}/balls.json")):
        record = json.loads(other.read_text())
        if other.parent == folder or CERTIFIED_IN in record or record[BALLS_KEY] not in keys:
            continue
        if not (other.parent / "radii.csv").exists():  # the tables need it: not there, not here
            continue
        folder.mkdir(parents=True, exist_ok=True)
        atomic_bytes(folder / "radii.csv", (other.parent / "radii.csv").read_bytes())
        record[CERTIFIED_IN] = other.parent.parent.name
        atomic_bytes(folder / "balls.json", (json.dumps(record, indent=1) + "\n").encode())
        return ["radii.csv", "balls.json"]
    return []


def _same_run(a: bytes, b: bytes) -> bool:
    from ccu.store import results as store

    ca, cb = (store.normalised_config(json.loads(x)) for x in (a, b))
    return store.config_key(ca) == store.config_key(cb) and ca.get("files") == cb.get("files")


#: an absolute path on the device or here (a committed log carries none: file names only)
MACHINE_PATH = re.compile(
    r"/(?:root|tmp|opt|home|work|usr|var|mnt|srv)(?:/[^\s:'\"/]+)*/([^\s:'\"/]+)"
)
#: the first line of ``tools/lease_run.sh``'s log: ``lease_run: <label>/<dataset>: ...``
LOG_HEAD = re.compile(r"^lease_run: ([A-Za-z0-9+_.-]+)/([A-Za-z0-9_-]+):")


def keep_logs(files_at: Path, reference: Path, dataset: str | None = None) -> list[Path]:
    """Every call log in ``files_at`` kept under ``reference/leases/`` (machine paths cut to
    file names), so that the lease's measurements (how long each method trained, how far a
    stopped one got: ``CCU_EPOCH_LOG``) survive even a call that brought back no part. The
    name holds the log's label, dataset and sha256: the same log twice is kept once."""
    import hashlib

    kept = []
    for log in sorted(Path(files_at).glob("*.log")):
        text = MACHINE_PATH.sub(lambda m: f"<path>/{m.group(1)}", log.read_text(errors="replace"))
        head = LOG_HEAD.match(text)
        label, ds = head.groups() if head else ("unknown", log.stem)
        if dataset is not None and ds != dataset:
            continue
        digest = hashlib.sha256(text.encode()).hexdigest()[:12]
        path = Path(reference) / "leases" / f"{label}-{ds}-{digest}.log"
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
            kept.append(path)
    return kept


def resume_dir(reference: Path) -> Path:
    """Where ``absorb`` keeps what the last call left in flight on the device (its
    ``.inflight``), read by ``plan --warm``: ``.devresume/`` beside the reference folder (the
    checkout's, ignored by git: best effort, like the machine itself)."""
    return Path(reference).resolve().parent / ".devresume"


#: seconds after an absorb within which ``plan --warm`` takes CCU's balls left on the device
#: machine to be still there: it is wiped 30 s after a call ends (the absorb and the plan here
#: take a few seconds of that; the next call must start within it anyway)
MACHINE_BALLS_S = 120


def keep_machine_balls(result: dict, folder: Path, now: float | None = None) -> list[Path]:
    """For each reference folder an absorb wrote CCU's own part and balls into without their
    ``balls.npz`` (over what a call brings back: :func:`balls_travel`), their key and the
    time kept as ``<folder>/<label>/<dataset>.balls``: the machine that certified them holds
    them while it is warm, and ``plan --warm`` plans the others there
    (:func:`balls_left_on_machine`). A reduced variant's copy of the balls' record
    (``certified_in``) is not CCU's. Returns the folders whose balls were kept; a later
    call on that machine renews the time (:func:`renew_machine_balls`)."""
    from ccu.store.records import CERTIFIED_IN

    now = time.time() if now is None else now
    kept = []
    for ref, written in result.items():
        ref = Path(ref)
        path = Path(folder) / ref.parent.name / f"{ref.name}.balls"
        try:
            record = json.loads((ref / "balls.json").read_text())
        except (OSError, ValueError):
            continue
        ccu_here = "balls.json" in written and any(w.startswith("CCU.") for w in written)
        if ccu_here and CERTIFIED_IN not in record and not (ref / "balls.npz").exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps({"key": record[BALLS_KEY], "at": now}) + "\n")
            kept.append(ref)
    return kept


#: what ``lease_run.sh`` logs when a call attacks in the balls an earlier call certified on
#: its machine (not committed with their arrays)
MACHINE_BALLS_SAID = "attacks in the balls an earlier call certified on this machine"


def renew_machine_balls(files_at: Path, folder: Path, now: float | None = None) -> list[Path]:
    """Each record of balls left on the machine (:func:`keep_machine_balls`) whose
    ``label``/``dataset`` a call's log says it attacked in on its machine
    (:data:`MACHINE_BALLS_SAID`): that call ran there, so the machine was warm at its end; its
    time renewed, whatever the call brought back (a training stopped for time, a variant's
    part in its own folder, nothing). A call on a fresh machine finds no balls and says
    nothing of the kind. An unreadable record is removed. Returns the records renewed."""
    now = time.time() if now is None else now
    renewed = []
    for log in sorted(Path(files_at).glob("*.log")):
        text = log.read_text(errors="replace")
        head = LOG_HEAD.match(text)
        if not head or MACHINE_BALLS_SAID not in text:
            continue
        path = Path(folder) / head.group(1) / f"{head.group(2)}.balls"
        if not path.exists():
            continue
        try:
            record = json.loads(path.read_text())
            record["at"] = now
            path.write_text(json.dumps(record) + "\n")
            renewed.append(path)
        except (OSError, ValueError, TypeError, KeyError):  # not a record of ours
            path.unlink(missing_ok=True)
    return renewed


def balls_left_on_machine(reference: Path, label: str, dataset: str,
                          now: float | None = None) -> bool:  # fmt: skip
    """Whether CCU's balls of ``label``/``dataset``, committed without their arrays, are
    still on the device machine that certified them: the last absorb kept their key
    (:func:`keep_machine_balls`) less than :data:`MACHINE_BALLS_S` ago, and they are still
    the committed ones."""
    now = time.time() if now is None else now
    path = resume_dir(reference) / label / f"{dataset}.balls"
    balls = reference_dir(reference, label, dataset) / "balls.json"
    try:
        record = json.loads(path.read_text())
        fresh = 0 <= now - float(record["at"]) < MACHINE_BALLS_S
        return fresh and record["key"] == json.loads(balls.read_text())[BALLS_KEY]
    except (OSError, ValueError, KeyError, TypeError):
        return False


def read_inflight(label: str, dataset: str, folder: Path) -> dict:
    """``{method: {"epochs_done", "epochs", "seconds"}}`` that the last absorbed call of
    ``label``/``dataset`` stopped for time (:func:`keep_inflight`); empty when none."""
    path = Path(folder) / label / f"{dataset}.json"
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return record if isinstance(record, dict) else {}


def keep_inflight(files_at: Path, folder: Path, dataset: str | None = None) -> dict:
    """Each call log's ``<label>-<dataset>.inflight`` (``lease_run.sh``: a header ``# label
    dataset``, then ``METHOD EPOCHS_DONE EPOCHS SECONDS`` lines) kept as
    ``<folder>/<label>/<dataset>.json``; a call that left nothing in flight clears its record.
    Returns ``{(label, dataset): methods}``. A malformed file is :class:`AbsorbError` (4)."""
    folder = Path(folder)
    found: dict[tuple[str, str], dict] = {}
    for log in sorted(Path(files_at).glob("*.log")):
        head = LOG_HEAD.match(log.read_text(errors="replace"))
        if head and (dataset is None or head.group(2) == dataset):
            found[head.groups()] = {}
    for path in sorted(Path(files_at).glob("*.inflight")):
        lines = path.read_text().splitlines()
        try:
            _, label, ds = lines[0].split()
            methods = {}
            for line in lines[1:]:
                m, epochs_done, epochs, secs = line.split()
                methods[m] = {"epochs_done": int(epochs_done), "epochs": int(epochs),
                              "seconds": int(secs)}  # fmt: skip
        except (IndexError, ValueError) as exc:
            raise AbsorbError(f"{path} is not a call's in-flight list ({exc})", 4) from exc
        if dataset is None or ds == dataset:
            found[(label, ds)] = methods
    for (label, ds), methods in found.items():
        path = folder / label / f"{ds}.json"
        if methods:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(methods, indent=1) + "\n")
        else:
            path.unlink(missing_ok=True)
    return found


#: call 0's benchmark of a dataset's epochs, as ``bench_epochs.py --out`` names it
EPOCHS_FILE = re.compile(r"^epochs_([a-z0-9][a-z0-9_-]*)_gpu\.json$")


def keep_bench(files_at: Path, targets: list[Path] | None = None) -> list[Path]:
    """The benchmarks a call 0 brought back (``benchmarks/bench_acet_graphs.py``,
    ``benchmarks/bench_epochs.py``: ``epochs_<dataset>_gpu.json`` for any dataset), each put
    where the planner reads it (:data:`GRAPHS_BENCH`, :func:`epochs_bench`; a newer
    measurement replaces the older, which git keeps). :class:`AbsorbError` (4), nothing kept,
    when one is not its benchmark's JSON."""
    if targets is None:
        came = sorted(p.name for p in Path(files_at).glob("epochs_*_gpu.json"))
        targets = [GRAPHS_BENCH, *(epochs_bench(EPOCHS_FILE.match(n).group(1))
                                   for n in came if EPOCHS_FILE.match(n))]  # fmt: skip
    targets = [Path(t) for t in targets]
    found = []
    for target in targets:
        path = Path(files_at) / target.name
        if not path.is_file():
            continue
        key = "by_method" if target.name.startswith("epochs_") else "eager_ms_per_batch"
        try:
            timed = json.loads(path.read_text())
            if not isinstance(timed, dict) or key not in timed:
                raise ValueError(f"no {key}")
        except ValueError as exc:
            raise AbsorbError(
                f"{path} is not the benchmark's JSON ({exc}): nothing kept", 4
            ) from exc
        found.append((target, timed))
    for target, timed in found:
        target.parent.mkdir(parents=True, exist_ok=True)
        if target.name.startswith("epochs_") and target.exists():
            timed = merged_epochs(json.loads(target.read_text()), timed)
        target.write_text(json.dumps(timed, indent=1) + "\n")
    return [target for target, _ in found]


def merged_epochs(old: dict, new: dict) -> dict:
    """A call 0's epochs (``new``) added to those committed (``old``): each method's numbers
    from the call that timed it last, an error never replacing a measurement; the calls'
    provenance (commit, device, torch, ...) kept in ``runs``, and each method's ``run`` the
    index of the one that timed it. (A call 0 that completes one cut short times only what is
    missing: replacing the file would lose the rest.)"""
    runs = old.get("runs") or [{k: v for k, v in old.items() if k != "by_method"}]
    by_method = {m: dict(t, run=t.get("run", 0)) for m, t in (old.get("by_method") or {}).items()}
    runs = [*runs, {k: v for k, v in new.items() if k not in ("by_method", "runs")}]
    for m, t in (new.get("by_method") or {}).items():
        if "full_epoch_s" in t or "full_epoch_s" not in by_method.get(m, {}):
            by_method[m] = dict(t, run=len(runs) - 1)
    return {**{k: v for k, v in new.items() if k != "by_method"}, "runs": runs,
            "by_method": by_method}  # fmt: skip


def _absorb_usage(args) -> tuple[str, int] | None:
    """What is wrong with ``absorb``'s arguments before anything is read or written (one line
    and its exit code), or None."""
    from ccu.data import REGISTRY

    files_at, reference = Path(args.files_at), Path(args.reference)
    if not files_at.exists():
        return f"{files_at} does not exist: pass the folder the call's files came back to", 3
    if not files_at.is_dir():
        return f"{files_at} is not a folder: pass the folder the call's files came back to", 2
    if reference.exists() and not reference.is_dir():
        return f"--reference {reference} is a file, not a folder of reference results", 2
    if args.commit and not reference.resolve().is_relative_to(REPO):
        return (
            f"--reference {reference} is outside the repository ({REPO}), so its files cannot "
            "be committed: pass --no-commit",
            2,
        )
    if args.dataset is not None and args.dataset not in REGISTRY:
        return f"unknown --dataset {args.dataset!r}; one of: {', '.join(sorted(REGISTRY))}", 2
    return None


def absorb_command(args) -> int:
    wrong = _absorb_usage(args)
    if wrong is not None:
        print(f"[lease] error: {wrong[0]}", file=sys.stderr)
        return wrong[1]
    try:
        bench = keep_bench(Path(args.files_at))
    except AbsorbError as exc:
        print(f"[lease] error: {exc}", file=sys.stderr)
        return exc.code
    for path in bench:
        print(f"kept the benchmark {_shown(path)} (plan again: the methods it measured are "
              "planned from it)")  # fmt: skip
    kept = keep_logs(Path(args.files_at), Path(args.reference), args.dataset)
    try:
        inflight = keep_inflight(Path(args.files_at), resume_dir(args.reference), args.dataset)
    except AbsorbError as exc:
        print(f"[lease] error: {exc}", file=sys.stderr)
        return exc.code
    for (label, ds), methods in inflight.items():
        for m, d in methods.items():
            print(f"{label}/{ds}: {m} stopped for time after epoch {d['epochs_done']} of "
                  f"{d['epochs']} ({d['seconds']} s so far): it continues in the next call "
                  "if that starts within 30 s of this one's end (plan --warm), else starts over")  # fmt: skip
    code = 0
    try:
        result = absorb(Path(args.files_at), Path(args.reference), args.dataset)
    except AbsorbError as exc:
        result = {}
        if exc.code == 3 and (kept or bench or any(inflight.values())):  # no part came back
            what = "the call's log is kept" if kept else "the benchmark is kept"
            print(f"[lease] no parts came back ({exc}); {what}")
        else:
            print(f"[lease] error: {exc}", file=sys.stderr)
            code = exc.code
    for path in kept:
        print(f"kept the call's log: {path}")
    renew_machine_balls(Path(args.files_at), resume_dir(args.reference))
    for folder in keep_machine_balls(result, resume_dir(args.reference)):
        print(f"{folder}: CCU's balls are committed without their arrays (balls.npz, over what "
              "a call brings back): the other methods are attacked in them on the machine that "
              "certified them, in a call made at once (plan --warm), or never")  # fmt: skip
    paths = []
    for folder, written in result.items():
        done = committed_parts(folder)
        print(f"{folder}: {len(written)} files absorbed; parts there: {', '.join(done) or 'none'}")
        if written:
            paths.append(folder)
    for log in sorted(Path(args.files_at).glob("*.log")):
        tail = log.read_text(errors="replace").splitlines()[-2:]
        print(f"{log.name}: " + " | ".join(tail))
    kept += bench
    if (paths or kept) and args.commit:
        rel = [p.resolve().relative_to(REPO).as_posix() for p in paths + kept]
        methods = sorted(
            {w.split(".")[0] for ws in result.values() for w in ws} - {"balls", "radii"}
        )
        what = ", ".join(methods) or ("balls" if paths else "no parts, the call's measurements")
        msg = f"Lease parts {', '.join(rel)}: {what}"
        subprocess.run(["git", "-C", str(REPO), "add", "--", *rel], check=True)
        subprocess.run(["git", "-C", str(REPO), "commit", "-q", "-m", msg, "--", *rel], check=True)
        print(f"committed: {msg}")
    return code


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    sub = ap.add_subparsers(dest="command", required=True)
    p = sub.add_parser(
        "call", help="on the device: a call's profile label and DE's size, then its lanes"
    )
    p.add_argument("profile")
    p.add_argument("overrides", help="JSON profile fields ('' for none)")
    p.add_argument("dataset")
    p.add_argument("--jobs", type=int, required=True)
    p.add_argument("--methods", nargs="+", required=True)
    p = sub.add_parser("prepare", help="here, before a lease: CCU's initial fit to carry")
    p.add_argument("--dataset", required=True)
    p.add_argument("--profile", default="paper")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--overrides", default="", help="JSON profile fields (a reduced variant)")
    p.add_argument("--check", action="store_true",
                   help="fit nothing: say whether a carried fit matches this machine (exit 1 if not)")  # fmt: skip
    helps = {
        "plan": "here: the device calls of a lease, from git's state and the device time left",
        "absorb": "here, after each call: unpack, check and commit what it brought back",
    }
    for name in ("plan", "absorb"):
        p = sub.add_parser(name, help=helps[name])
        if name == "absorb":
            p.add_argument("files_at", help="the folder a device call's files lie in (files_at)")
        p.add_argument("--dataset", required=name == "plan",
                       help="the dataset to plan" if name == "plan" else "only this dataset's parts")  # fmt: skip
        if name == "plan":
            p.add_argument("--profile", default="paper")
        p.add_argument("--reference", default=str(REPO / "reference-results"))
        if name == "plan":
            p.add_argument("--budget-s", type=int, default=900, help="device seconds left (status)")
            p.add_argument("--jobs", type=int, default=4, help="lanes at once on the GPU")
            p.add_argument("--warm", action="store_true",
                           help="the device machine is still warm (its last call ended under "
                           "30 s ago): trainings stopped for time in it continue")  # fmt: skip
            p.add_argument("--epochs", type=int,
                           help="plan the whole grid at this many epochs (its own label, "
                           "paper-e<N>): for a dataset whose CCU no lease holds at 100")  # fmt: skip
            p.add_argument("--reduce", action="store_true",
                           help="plan the reduced variants of the methods no lease holds now, "
                           "from the costs known, without waiting for call 0's measurements "
                           "(e.g. when call 0 failed)")  # fmt: skip
        else:
            p.add_argument("--no-commit", dest="commit", action="store_false",
                           help="unpack and rebuild the tables, do not commit")  # fmt: skip
    args = ap.parse_args(argv)
    if getattr(args, "jobs", 1) < 1 or getattr(args, "budget_s", 1) < 0:
        print("[lease] error: --jobs must be >= 1 and --budget-s >= 0", file=sys.stderr)
        return 2
    if getattr(args, "epochs", None) is not None and not 1 <= args.epochs < EPOCHS:
        print(f"[lease] error: --epochs must be 1 to {EPOCHS - 1} (fewer than the paper's "
              f"{EPOCHS}); leave it out for the paper's protocol", file=sys.stderr)  # fmt: skip
        return 2
    if args.command == "call":
        return call_command(args)
    if args.command == "prepare":
        return prepare_command(args)
    return print_plan(args) if args.command == "plan" else absorb_command(args)


if __name__ == "__main__":
    import signal

    signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # `plan | head`: no traceback
    sys.exit(main())
