"""ACET's inner attack in CUDA graphs, checked against the eager attack as it trains.

ACET (and ACET2) push every out-batch to high confidence with a 40-step PGD before each
training step (:func:`ccu.methods.trained.confidence_pgd`). On a GPU with LeNet each of those
steps is a few dozen tiny kernels: the 2026-11-28 H200 lease measured 33.7 s an ACET epoch on
full MNIST (~1.8 ms an inner step, almost all of it kernel launches), ~56 minutes for the
paper's 100 epochs, longer than a lease. Replaying the whole attack of a batch as one CUDA graph
removes the launches and leaves the GPU's own work.

:class:`GraphedPGD` captures the attack once per batch shape (an epoch's last batch is smaller:
a graph of its own) and replays it with the batch and the start copied into the graph's static
inputs. The model's parameters are read in place, so the optimiser's in-place updates reach
the graph; a parameter moved to new storage (another memory format, a reload) is noticed and
the graph captured again. The graph is a statement about speed only, never about results:

* its first replay of each shape, and every :attr:`GraphedPGD.check_every`-th call after it,
  is compared with the eager attack on the same batch and weights (a read-back only then);
* any deviation above :attr:`GraphedPGD.tolerance`, or any error while capturing or replaying,
  turns the graphs off for the rest of the training, which goes on eagerly from that batch
  (the eager result is the one used), and says why once;
* :meth:`GraphedPGD.record` (the run's config, ``inner_attack``) says whether graphs were
  used, how many checks passed, the largest deviation seen and why they were turned off.

Since the whole training step runs in CUDA graphs (:mod:`ccu.methods.graphed_step`), ACET's
step holds its inner attack in the step's graph; these graphs of the attack alone are used when
the step's are not (bf16, ``compile``, or turned off by a failed check).

Written here rather than with ``torch.compile(mode="reduce-overhead")``: the attack holds an
``autograd.grad`` per step inside a loop with data-dependent ``torch.where`` updates, which
compile would split into graph breaks and recompile per shape; a plain CUDA graph of the eager
code replays the very kernels the eager attack launches, so the check can ask for equality.
Only CUDA uses it (``CCU_CUDA_GRAPHS=0`` turns it off); the CPU path is the eager attack.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable, Iterator

import torch

#: the environment switch: ``0`` keeps ACET's inner attack eager on CUDA too
ENV = "CCU_CUDA_GRAPHS"

#: a benchmark's hook (``benchmarks/bench_epochs.py``): when set, every replay outside a check,
#: of a training step's graph or of ACET's inner attack's, runs as ``replay_timer(replay,
#: *inputs)``, which times it (the GPU's busy seconds of a graphed epoch); None: as it is
replay_timer: Callable | None = None


def replayed(replay: Callable, *inputs):
    """``replay(*inputs)``, through :data:`replay_timer` when a benchmark set one."""
    timer = replay_timer
    return replay(*inputs) if timer is None else timer(replay, *inputs)


#: ``(model, z, noise) -> points``: the attack from its start ``z + eps * noise``
Attack = Callable[[torch.nn.Module, torch.Tensor, torch.Tensor], torch.Tensor]
#: ``(attack, model, z, noise) -> replay``: a captured attack, ``replay(z, noise) -> points``
Capture = Callable[..., Callable[[torch.Tensor, torch.Tensor], torch.Tensor]]


def graphs_wanted(device: torch.device | str) -> bool:
    """Whether ACET's inner attack on ``device`` runs in CUDA graphs: on CUDA unless
    ``CCU_CUDA_GRAPHS=0``."""
    return torch.device(device).type == "cuda" and os.environ.get(ENV, "1") != "0"


@contextlib.contextmanager
def rng_kept_if_capture_fails(device: torch.device | str, generator=None) -> Iterator[None]:
    """Around a CUDA graph's capture: if it fails, the default CUDA generator of ``device``
    (or ``generator``) is given back a copy of its state from before the capture, not in
    capture mode. Why: a capture puts every registered generator's state in capture mode, and
    a capture that fails at its end (``cudaStreamEndCapture``: e.g. a read-back to the host
    inside it) raises before PyTorch takes the state out of it again, so that every random draw
    on the device afterwards (MCD's dropout, in the eager step that takes over) raises
    "Offset increment outside graph capture". No capture advances the state's offset, so the
    copy is where the eager step would be. The stream current before the capture is made
    current again too: ``torch.cuda.graph`` does not leave its capture stream when the
    capture's end raises.

    >>> class Gen:  # a stand-in for a CUDA generator
    ...     def clone_state(self): return "before"
    ...     def graphsafe_set_state(self, state): print("given back:", state)
    >>> try:
    ...     with rng_kept_if_capture_fails("cuda", Gen()):
    ...         raise RuntimeError("capture invalidated")
    ... except RuntimeError:
    ...     pass
    given back: before
    """
    stream = None
    if generator is None:
        index = torch.device(device).index
        generator = torch.cuda.default_generators[
            torch.cuda.current_device() if index is None else index
        ]
        stream = torch.cuda.current_stream(device)
    spare = generator.clone_state() if hasattr(generator, "clone_state") else None
    try:
        yield
    except BaseException:
        if spare is not None:
            generator.graphsafe_set_state(spare)
        if stream is not None:  # torch.cuda.graph leaves its capture stream current then
            torch.cuda.set_stream(stream)
        raise


@contextlib.contextmanager
def deterministic_cudnn(device: torch.device | str) -> Iterator[None]:
    """cuDNN's deterministic algorithms while a training on CUDA runs (as before after it).
    Why: the CUDA graphs are checked against the eager step as they train (here and in
    :mod:`ccu.methods.graphed_step`); cuDNN's algorithms with atomics may sum in another order
    in the eager step than in the replay, and ACET's inner attack steps by the gradient's sign,
    so that a flipped sign of a near-zero gradient sends the attack down another path: a
    deviation far above the check's tolerance, which turns the graphs off for the rest of the
    training (an ACET epoch then takes ~10x as long). With deterministic kernels the replay
    and the eager step are the same sums. Elsewhere (the CPU) it changes nothing.

    >>> import torch
    >>> with deterministic_cudnn("cuda"):
    ...     torch.backends.cudnn.deterministic
    True
    >>> with deterministic_cudnn("cpu"):
    ...     torch.backends.cudnn.deterministic
    False
    """
    if torch.device(device).type != "cuda":
        yield
        return
    before = torch.backends.cudnn.deterministic
    torch.backends.cudnn.deterministic = True
    try:
        yield
    finally:
        torch.backends.cudnn.deterministic = before


def cuda_capture(attack: Attack, model, z, noise, warmup: int = 2):
    """``attack`` captured in a CUDA graph for batches shaped as ``z``: a few eager runs on a
    side stream first (autograd's and cuDNN's lazy set-up must not happen inside the capture,
    as the CUDA graphs notes of PyTorch ask), then one capture. Returns ``replay(z, noise)``,
    which copies its arguments into the graph's static inputs, replays it and returns a copy
    of its output."""
    static_z, static_noise = z.detach().clone(), noise.detach().clone()
    side = torch.cuda.Stream(device=z.device)
    side.wait_stream(torch.cuda.current_stream(z.device))
    try:
        with torch.cuda.stream(side):
            for _ in range(warmup):
                attack(model, static_z, static_noise)
    finally:  # whatever raised: the default stream waits for the side stream's work
        torch.cuda.current_stream(z.device).wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with rng_kept_if_capture_fails(z.device), torch.cuda.graph(graph):
        static_out = attack(model, static_z, static_noise)

    def replay(z: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
        static_z.copy_(z)
        static_noise.copy_(noise)
        graph.replay()
        return static_out.clone()

    return replay


def say(message: str) -> None:
    """A line on stderr as the run's own log lines (``[ccu] ...``)."""
    print(f"[ccu] {message}", file=sys.stderr, flush=True)


def _storage(model: torch.nn.Module) -> tuple:
    return tuple(p.data_ptr() for p in model.parameters())


class GraphedPGD:
    """``attack`` replayed from CUDA graphs, one per batch shape, checked against the eager
    ``attack`` (see the module). ``capture`` makes a graph (:func:`cuda_capture`; the tests
    pass their own); ``log`` (default: stderr) is told once when the graphs are turned off.

    >>> import torch
    >>> double = lambda model, z, noise: 2 * z + noise
    >>> capture = lambda attack, model, z, noise: (lambda z, noise: attack(model, z, noise))
    >>> pgd = GraphedPGD(double, capture=capture, check_every=2)
    >>> model = torch.nn.Linear(1, 1)
    >>> [pgd(model, torch.ones(3), torch.zeros(3)).tolist() for _ in range(3)][-1]
    [2.0, 2.0, 2.0]
    >>> pgd.record()["cuda_graphs"], pgd.record()["checks_passed"]
    (True, 2)
    """

    #: compare with the eager attack every this many calls (and at each shape's first)
    check_every = 50
    #: the largest absolute difference of a point (images in [0, 1]) still taken as equal
    tolerance = 1e-5

    def __init__(self, attack: Attack, capture: Capture | None = None, log=say,
                 check_every: int | None = None):  # fmt: skip
        self.attack, self.capture, self.log = attack, capture or cuda_capture, log
        if check_every is not None:
            self.check_every = check_every
        self.replays: dict[tuple, tuple[tuple, Callable]] = {}
        self.calls = self.checks = self.captures = 0
        self.max_deviation = 0.0
        self.off: str | None = None  # why the graphs were turned off (None: on)

    def __call__(self, model: torch.nn.Module, z: torch.Tensor, noise: torch.Tensor):
        if self.off is not None:
            return self.attack(model, z, noise)
        self.calls += 1
        key = (tuple(z.shape), z.dtype, z.device)
        storage = _storage(model)
        fresh = False
        try:
            held = self.replays.get(key)
            if held is None or held[0] != storage:
                held = (storage, self.capture(self.attack, model, z, noise))
                self.replays[key] = held
                self.captures += 1
                fresh = True
            out = held[1](z, noise) if fresh else replayed(held[1], z, noise)
        except Exception as exc:  # noqa: BLE001 - any failure of the graph: eager from here on
            return self._turn_off(f"capture or replay failed at call {self.calls}: {exc}",
                                  model, z, noise)  # fmt: skip
        if fresh or self.calls % self.check_every == 0:
            eager = self.attack(model, z, noise)
            deviation = float((out - eager).abs().max()) if out.numel() else 0.0
            if not deviation <= self.tolerance:  # NaN too
                self.off = (
                    f"deviation {deviation:.3g} from the eager attack at call {self.calls} "
                    f"(tolerance {self.tolerance:g})"
                )
                self._say()
                return eager
            self.checks += 1
            self.max_deviation = max(self.max_deviation, deviation)
        return out

    def _turn_off(self, why: str, model, z, noise):
        self.off = why
        self.replays.clear()
        self._say()
        return self.attack(model, z, noise)

    def _say(self):
        if self.log is not None:
            self.log(f"inner attack: CUDA graphs off, eager from here on ({self.off})")

    def record(self) -> dict:
        """What the run's config keeps (``inner_attack``): whether graphs ran (and until when),
        the checks against the eager attack that passed, their largest deviation, captures."""
        return {
            "cuda_graphs": self.off is None,
            "calls": self.calls,
            "captures": self.captures,
            "checks_passed": self.checks,
            "max_deviation": self.max_deviation,
            "turned_off": self.off,
        }
