"""A whole training step in CUDA graphs, checked against the eager step as it trains.

On a GPU a step of the paper's small networks is set by its launches, not its arithmetic: the
committed H200 benchmark (``benchmarks/timings/bench_gpu_h200.json``) has a LeNet Base step at
3.4 ms, and ResNet18's CCU step at 17 ms (6.8 s an epoch of CIFAR-10), no faster in bf16, where
its arithmetic takes a few milliseconds. CCU's 100 epochs on FMNIST or CIFAR-10 then take more
than a lease's calls hold. Replaying the step's kernels (forward, backward, the optimiser, CCU's
constraint) from one CUDA graph removes the launches and the Python that issues them.

:class:`GraphedStep` keeps one graph per *key*: the batch's shapes, the learning rates (the
milestones change them: a float baked into the optimiser's kernels), the epoch for an objective
that reads it (EDL's annealing; ``uses_epoch``: True, or a function of the epoch such as
ACET's warm-up, :meth:`ccu.methods.training.Objective.graph_epoch`) and the parameters'
storage. For each key:

* its first :attr:`GraphedStep.warmup` steps run eagerly (real training steps, on a side
  stream on CUDA, as PyTorch's CUDA graphs notes ask before a capture); the next one is
  captured and replayed, and so on, with the batch copied into the graph's static inputs;
* its first replay, and every :attr:`GraphedStep.check_every`-th step after it, is compared with
  the eager step from the same state: the model, the optimiser's state and the RNG are saved,
  the eager step is taken, the state is put back in place and the graph replayed; every
  tensor's distance from the eager step's result, over how far that step moved it, must be at
  most :attr:`GraphedStep.tolerance` (1e-2: a small learning rate moves little, so a distance
  relative to the tensor's own size would miss a skipped update), and the loss must agree;
* the last warm-up step runs with host syncs refused (CUDA's sync debug mode): a step that
  reads back to the host, which no capture holds, is found eagerly, not inside a capture;
* a larger difference (NaN too), or any error while capturing or replaying, turns the graphs off
  for the rest of the training: the eager step's result is kept (the state it left is put back)
  and the training goes on eagerly from there, which says why once;
* :meth:`GraphedStep.record` (the run's config, ``training_step``) says whether graphs ran,
  the steps, captures, checks that passed, their largest deviation, why they were turned off.

The graph is a statement about speed only, never about results. Only a float32 training on CUDA
without ``compile`` uses it, and only with an objective that declares ``graphable`` (ACET's
too: its 40-step inner attack inside the step's graph, ACET2's noise drawn before the step,
``Objective.prepare_out``) or GAN's step (its three networks: :class:`ccu.methods.gan.GANStep`);
``CCU_CUDA_GRAPHS=0`` turns it off. The CPU path is the eager step. Before a capture every
parameter's gradient is dropped: a step that added to a gradient an eager step left would
write, on every replay, into memory the graph does not own. Written here rather than with ``torch.compile(mode=
"reduce-overhead")``: compile would trace CCU's densities, the optimiser and the constraint
anew for each shape and learning rate, and a plain graph of the eager code replays the very
kernels the eager step launches, so the check can ask for equality to float tolerance.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from ccu.methods.cuda_graphs import replayed, rng_kept_if_capture_fails, say

#: ``(x, y, z) -> (loss, logits)``: one training step, its optimiser step and constraint included
Step = Callable[[torch.Tensor, torch.Tensor, "torch.Tensor | None"], tuple]
#: ``(step, x, y, z) -> replay``: a captured step, ``replay(x, y, z) -> (loss, logits)``
Capture = Callable[..., Callable]
#: ``(step, x, y, z) -> (loss, logits)``: an eager step run before a capture
Warmup = Callable[..., tuple]


def cuda_warmup(step: Step, x, y, z):
    """``step`` on a side stream (autograd's and cuDNN's lazy set-up before a capture)."""
    side = torch.cuda.Stream(device=x.device)
    side.wait_stream(torch.cuda.current_stream(x.device))
    try:
        with torch.cuda.stream(side):
            return step(x, y, z)
    finally:  # also when it raises (a host read): the state put back waits for its work
        torch.cuda.current_stream(x.device).wait_stream(side)


def cuda_capture(step: Step, x, y, z):
    """``step`` captured in a CUDA graph for batches shaped as ``x, y, z`` (captured, not run).
    Returns ``replay(x, y, z)``, which copies its arguments into the graph's static inputs and
    replays it; its ``(loss, logits)`` are the graph's static outputs, overwritten by the next
    replay (the trainer reads them at once)."""
    static = [None if t is None else t.detach().clone() for t in (x, y, z)]
    graph = torch.cuda.CUDAGraph()
    # a failed capture leaves the RNG usable for the eager step that takes over
    with rng_kept_if_capture_fails(x.device), torch.cuda.graph(graph):
        outputs = step(*static)

    def replay(x, y, z):
        for s, t in zip(static, (x, y, z), strict=True):
            if s is not None:
                s.copy_(t)
        graph.replay()
        return outputs

    return replay


def cuda_sync_checked(warmup: Warmup, step: Step, x, y, z):
    """The last eager step before a capture, with CUDA's sync debug mode at ``"error"``: a
    read-back to the host (which a capture cannot hold, and whose failure inside a capture can
    leave the RNG in capture mode) raises here, in an eager step, instead."""
    previous = torch.cuda.get_sync_debug_mode()
    torch.cuda.set_sync_debug_mode("error")
    try:
        return warmup(step, x, y, z)
    finally:
        torch.cuda.set_sync_debug_mode(previous)


def _rng(device: torch.device):
    return torch.cuda.get_rng_state(device) if device.type == "cuda" else torch.get_rng_state()


def _set_rng(device: torch.device, state) -> None:
    if device.type == "cuda":
        torch.cuda.set_rng_state(state, device)
    else:
        torch.set_rng_state(state)


class GraphedStep:
    """``step`` replayed from CUDA graphs, checked against the eager ``step`` (see the module).
    ``model`` and ``opt`` are what ``step`` trains (their state is saved and put back for a
    check; ``opt`` may be a sequence of optimisers, e.g. GAN's three); ``capture`` and
    ``warmup`` default to CUDA's (the tests pass their own); ``log`` (default: stderr) is told
    once when the graphs are turned off.

    >>> import torch
    >>> model = torch.nn.Linear(2, 1)
    >>> opt = torch.optim.SGD(model.parameters(), lr=0.1)
    >>> def step(x, y, z):
    ...     loss = (model(x).squeeze(1) - y).pow(2).mean()
    ...     opt.zero_grad(set_to_none=True)
    ...     loss.backward()
    ...     opt.step()
    ...     return loss, None
    >>> replay_python = lambda step, x, y, z: step  # a stand-in for a graph, on the CPU
    >>> eager = lambda step, x, y, z: step(x, y, z)
    >>> graphed = GraphedStep(step, model, opt, capture=replay_python, warmup=eager,
    ...                       sync_checked=lambda warmup, *args: warmup(*args), check_every=3)
    >>> for _ in range(6):
    ...     _ = graphed(torch.ones(4, 2), torch.zeros(4), None)
    >>> graphed.record()["cuda_graphs"], graphed.record()["checks_passed"]
    (True, 2)
    """

    #: compare with the eager step every this many steps (and at each key's first replay)
    check_every = 200
    #: eager steps of a key before it is captured (the last with host syncs refused)
    warmup_steps = 2
    #: how far the graph's step may land from the eager one, relative to how far the eager step
    #: moved each tensor (norms): float rounding and cuDNN's atomics move it by ~1e-6 of the
    #: step; a skipped or garbled update by ~1. The loss must agree to 1e-4 of itself.
    tolerance = 1e-2
    loss_tolerance = 1e-4

    def __init__(self, step: Step, model: torch.nn.Module,
                 opt: torch.optim.Optimizer | Sequence[torch.optim.Optimizer],
                 capture: Capture | None = None, warmup: Warmup | None = None, log=say,
                 check_every: int | None = None, uses_epoch: bool | Callable = False,
                 sync_checked: Callable | None = None):  # fmt: skip
        self.step, self.model = step, model
        self.opts = list(opt) if isinstance(opt, Sequence) else [opt]
        self.capture, self.warmup = capture or cuda_capture, warmup or cuda_warmup
        self.sync_checked = sync_checked or cuda_sync_checked
        self.log, self.uses_epoch = log, uses_epoch
        if check_every is not None:
            self.check_every = check_every
        self.replays: dict[tuple, Callable] = {}
        self.seen: dict[tuple, int] = {}
        self.steps = self.checks = self.captures = 0
        self.max_deviation = 0.0
        self.off: str | None = None  # why the graphs were turned off (None: on)
        #: cuDNN's deterministic algorithms at the start (``cuda_graphs.deterministic_cudnn``)
        self.cudnn_deterministic = bool(torch.backends.cudnn.deterministic)

    def __call__(self, x, y, z, epoch: int = 0):
        if self.off is not None:
            return self.step(x, y, z)
        self.steps += 1
        key = self._key(x, y, z, epoch)
        replay = self.replays.get(key)
        if replay is None:
            self.seen[key] = self.seen.get(key, 0) + 1
            if self.seen[key] < self.warmup_steps:
                return self.warmup(self.step, x, y, z)
            if self.seen[key] == self.warmup_steps:
                return self._sync_free(x, y, z)
            # a new learning rate or epoch: the graphs of the others are never used again
            self.replays = {k: r for k, r in self.replays.items() if k[2:] == key[2:]}
            # no gradient left from an eager step: a step that added to one in place would
            # write, on every replay, into memory the graph does not own
            for p in self.model.parameters():
                p.grad = None
            try:  # captured, not run: nothing of the training changed yet
                replay = self.capture(self.step, x, y, z)
            except Exception as exc:  # noqa: BLE001 - any failure of a capture: eager from here on
                self._turn_off(f"capture failed at step {self.steps}: {exc}")
                return self.step(x, y, z)
            self.replays[key] = replay
            self.captures += 1
            return self._checked(replay, x, y, z)
        if self.steps % self.check_every == 0:
            return self._checked(replay, x, y, z)
        try:  # a replay raises before it launches, if at all: the step was not taken
            return replayed(replay, x, y, z)
        except Exception as exc:  # noqa: BLE001
            self._turn_off(f"replay failed at step {self.steps}: {exc}")
            return self.step(x, y, z)

    def _sync_free(self, x, y, z):
        """A key's last warm-up step with host syncs refused (:func:`cuda_sync_checked`); one
        that syncs is taken again eagerly from the state before it, and the graphs go off."""
        tensors = self._state()
        before, rng = [t.detach().clone() for t in tensors], _rng(x.device)
        try:
            return self.sync_checked(self.warmup, self.step, x, y, z)
        except Exception as exc:  # noqa: BLE001
            self._put(tensors, before)
            _set_rng(x.device, rng)
            self._turn_off(f"the step reads back to the host (step {self.steps}): {exc}")
            return self.step(x, y, z)

    def _key(self, x, y, z, epoch: int) -> tuple:
        shapes = tuple(None if t is None else (tuple(t.shape), t.dtype) for t in (x, y, z))
        storage = tuple(p.data_ptr() for p in self.model.parameters())
        lrs = tuple(float(g["lr"]) for opt in self.opts for g in opt.param_groups)
        if callable(self.uses_epoch):  # what of the epoch the step reads (Objective.graph_epoch)
            phase = self.uses_epoch(epoch)
        else:
            phase = epoch if self.uses_epoch else None
        return (shapes, storage, lrs, phase, self.model.training)

    def _state(self) -> list[torch.Tensor]:
        """Every tensor a step changes: parameters, buffers, the optimiser's state."""
        out = [*self.model.parameters(), *self.model.buffers()]
        for opt in self.opts:
            for group in opt.param_groups:
                for p in group["params"]:
                    out += [v for v in opt.state.get(p, {}).values() if torch.is_tensor(v)]
        return out

    @staticmethod
    def _put(tensors, values) -> None:
        with torch.no_grad():
            for t, v in zip(tensors, values, strict=True):
                t.copy_(v)  # in place: the graphs read these very tensors

    def _deviation(self, tensors, before, eager, out, eager_out) -> float:
        """The largest deviation of the graph's step from the eager one: each tensor's distance
        from where the eager step left it, over how far that step moved it (norms); the loss's
        relative difference, scaled to :attr:`tolerance`. NaN counts as infinite."""
        worst = 0.0
        for t, b, e in zip(tensors, before, eager, strict=True):
            if not t.is_floating_point():  # counters (batch norm's): exactly
                if not torch.equal(t, e):
                    return float("inf")
                continue
            g64, e64, b64 = t.detach().double(), e.double(), b.double()
            moved = float(torch.linalg.vector_norm(e64 - b64))
            off = float(torch.linalg.vector_norm(g64 - e64))
            floor = 1e-7 * float(torch.linalg.vector_norm(e64)) + 1e-30
            d = off / (moved + floor)
            if d != d:
                return float("inf")
            worst = max(worst, d)
        if out[0] is not None and eager_out[0] is not None:
            gl, el = float(out[0].detach()), float(eager_out[0])
            d = abs(gl - el) / (abs(el) + 1e-6) * self.tolerance / self.loss_tolerance
            worst = max(worst, d if d == d else float("inf"))
        return worst

    def _checked(self, replay, x, y, z):
        """One step both ways from the same state (see the module): the graph's result if they
        agree, else the eager one, and the graphs off."""
        device = x.device
        tensors = self._state()
        before, rng = [t.detach().clone() for t in tensors], _rng(device)
        loss, logits = self.step(x, y, z)
        eager = [t.detach().clone() for t in tensors]
        eager_out = tuple(None if t is None else t.detach().clone() for t in (loss, logits))
        eager_rng = _rng(device)
        try:
            self._put(tensors, before)
            _set_rng(device, rng)
            out = replay(x, y, z)
            deviation = self._deviation(tensors, before, eager, out, eager_out)
        except Exception as exc:  # noqa: BLE001 - the eager step stands, as it left the state
            deviation, why = float("inf"), f"replay failed at step {self.steps}: {exc}"
        else:
            why = (f"deviation {deviation:.3g} from the eager step at step {self.steps} "
                   f"(tolerance {self.tolerance:g}; up to {self.check_every - 1} graphed steps "
                   "before it were not checked)")  # fmt: skip
        if not deviation <= self.tolerance:
            self._put(tensors, eager)
            _set_rng(device, eager_rng)
            self._turn_off(why)
            return eager_out
        self.checks += 1
        self.max_deviation = max(self.max_deviation, deviation)
        return out

    def release(self) -> None:
        """Drop the graphs and their memory (the training is over); :meth:`record` stays."""
        self.replays.clear()
        self.seen.clear()
        self.step = self.model = None
        self.opts = []

    def _turn_off(self, why: str) -> None:
        self.off = why
        self.replays.clear()
        if self.log is not None:
            self.log(f"training step: CUDA graphs off, eager from here on ({why})")

    def record(self) -> dict:
        """What the run's config keeps (``training_step``): whether graphs ran (and until
        when), the steps, captures, the checks against the eager step that passed and their
        largest deviation; whether cuDNN ran its deterministic algorithms."""
        return {
            "cuda_graphs": self.off is None,
            "cudnn_deterministic": self.cudnn_deterministic,
            "steps": self.steps,
            "captures": self.captures,
            "checks_passed": self.checks,
            "max_deviation": self.max_deviation,
            "turned_off": self.off,
        }
