"""PGD inside a ball of the metric intersected with a box (the paper's adversarial noise).

Maximises a differentiable score (for a classifier: its confidence) over
``{x : d(x, x0) <= R} ∩ [lo, hi]^D``. Steps are gradient steps in whitened
coordinates (where the ball is round), followed by the projection onto the ball, clipping to the
box and a scaling towards the seed ``x0 + t (x - x0)``: the box is convex and holds ``x0``, so
the scaled point lies in both sets. Iterates are kept feasible in the working dtype; the returned
points are then made feasible *exactly* (:func:`project_exact`): in float64, on the value the
point has in its own dtype, since float32 rounding magnified by the whitening (hundreds of times
for images) can otherwise leave the ball. Step size: start 3, x1.1 after an improving step, /2 and backtrack after a failed one
(appendix "Attack details"). A step is ``step_size`` times the gradient in whitened coordinates
as it is (``gradient="raw"``, the default: the paper's PGD, as the authors' released attack
steps), or times its unit direction (``"normalised"``, the attack of earlier versions). The
two differ in reach: in MNIST's balls (whitened radius ~1500) unit steps from 3 leave the
iterates of 100 steps near the seed, and that attack missed what the paper's found on Maha
(``reference-results/checks/attack-gradient-*.json``, chapter *Adversarial noise*).

Every restart of every seed is one independent PGD iterate; the score and its gradient are
evaluated in chunks of ``batch_size`` iterates (:func:`attack_batch_size` sizes them to the
device: the paper's 200 seeds x 50 restarts of a ResNet18 do not fit one backward pass). For a
deterministic score the chunking does not change the result (bit for bit when the score's
arithmetic per input does not depend on the batch size; matrix-product kernels chosen by batch
size can differ in the last bits). The loop reads nothing back from the device between steps.

Explained in the book chapter *Corollary 1 and the certified radius*.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from ccu.core.metric import Mahalanobis
from ccu.core.validation import as_tensor, check_finite, trusted_inputs

#: how a PGD step uses the gradient (:func:`ball_attack`): as it is (the paper's) or its direction
GRADIENTS = ("raw", "normalised")

#: Points are pulled this far inside the ball so that float rounding never leaves it.
_INSIDE = 1.0 - 1e-6

#: most iterates per score evaluation on the CPU
CPU_ATTACK_BATCH = 2048
#: memory a chunk's backward pass may take on the CPU: :data:`CPU_BACKWARD_FACTOR` x the bytes
#: autograd saves for it (:func:`cpu_attack_batch`). A constant, not the machine's free memory,
#: so that a chunk (and with it a stochastic score's draws, MCD's dropout) is the same on every
#: machine. 2,048 iterates of MCD's seven VGG13 passes save 33 GB (16 MB each: measured on
#: MNIST's ``paper`` profile, where a CPU run was killed for memory with 24 GiB); ResNet18's
#: save 12-37 MB an iterate, so the ``cpu`` profile's 1,000 did not fit a laptop either.
CPU_ATTACK_BYTES = 2 * 2**30
#: a backward pass's peak over the bytes autograd saved for it (the gradients in flight)
CPU_BACKWARD_FACTOR = 1.5
#: the two chunk sizes whose saved bytes :func:`cpu_attack_batch` counts (exact: no allocator)
CPU_PROBE_SIZES = (2, 4)
#: share of the free device memory that the chunks may take (the rest: the PGD state, slack)
MEMORY_FRACTION = 0.5
#: the two chunk sizes whose peak memory :func:`probe_batch_size` measures on a GPU
PROBE_SIZES = (16, 32)
#: iterate-sized tensors the attack's step allocates besides the chunks (x, best, gradient, ...)
STATE_COPIES = 12


@dataclass
class AttackResult:
    """Worst case per seed: the point (shape of the seeds), its score and its distance."""

    x: torch.Tensor
    score: torch.Tensor
    distance: torch.Tensor
    history: torch.Tensor  # best score per seed after each step, (steps + refine_steps + 1, N)
    #: the best point before the refinement (``refine_steps``; the point itself where there was
    #: none) and its score: what the paper's attack alone reached
    x_unrefined: torch.Tensor | None = None
    score_unrefined: torch.Tensor | None = None


def _feasible(x, x0, radius, metric, box):
    """Clip to the box, then scale towards x0 until inside the ball (whitened norm <= R)."""
    if box is not None:
        x = x.clamp(box[0], box[1])
    delta = x - x0
    norm = metric.whiten(delta).norm(dim=1)
    scale = torch.where(
        norm > radius * _INSIDE, radius * _INSIDE / norm.clamp_min(1e-30), torch.ones_like(norm)
    )
    return x0 + delta * scale[:, None]


def project_exact(x, x0, radius, metric: Mahalanobis, box=(0.0, 1.0), max_tries: int = 64):
    """Make each point of ``x`` (N, D) exactly feasible; returns ``(points, distances)``.

    The point is scaled towards its seed (``x0 + t (x - x0)``, ``t <= 1``) in float64, cast to the
    dtype of ``x``, clipped to the box, and its distance to the seed is checked in float64 on the
    cast value; while it lies outside the ball ``t`` shrinks (by ``R / d`` and a margin that
    doubles each try). A point that cannot be made feasible that way falls back to its seed
    (distance 0). Every returned point satisfies ``d(x, x0) <= radius`` exactly (for its float64
    value) and lies in the box; the distances (float64) are of the returned points.
    """
    dtype = x.dtype
    W = metric.whitening.double().to(x.device)
    seeds64 = x0.double()
    delta = x.double() - seeds64
    rad = torch.as_tensor(radius, dtype=torch.float64, device=x.device).expand(x.shape[0])

    def exact(points):
        d = (points.double() - seeds64) @ W
        return d.norm(dim=1)

    out = x0.to(dtype).clone()
    dist_out = torch.zeros(x.shape[0], dtype=torch.float64, device=x.device)
    pending = torch.ones(x.shape[0], dtype=torch.bool, device=x.device)
    t = torch.ones(x.shape[0], dtype=torch.float64, device=x.device)
    for k in range(max_tries):
        cand = (seeds64 + t[:, None] * delta).to(dtype)
        if box is not None:
            cand = cand.clamp(box[0], box[1])
        dist = exact(cand)
        ok = pending & (dist <= rad)
        out[ok] = cand[ok]
        dist_out[ok] = dist[ok]
        pending &= ~ok
        if not bool(pending.any()):
            break
        shrink = (rad / dist.clamp_min(1e-300)).clamp(max=1.0) * (1.0 - 2.0 ** (k - 40))
        t = torch.where(pending, t * shrink, t)
    # what is still pending keeps its seed (distance 0): always feasible
    if box is not None and not bool(((out >= box[0]) & (out <= box[1])).all()):
        raise RuntimeError("project_exact: a point left the box; the seeds must lie in it.")
    if not bool((dist_out <= rad).all()):  # pragma: no cover - guaranteed by construction
        raise RuntimeError("project_exact: a point left its ball.")
    return out, dist_out


def _uniform_in_unit_ball(n: int, d: int, gen: torch.Generator) -> torch.Tensor:
    """``n`` points uniform in the d-dimensional unit ball (float64): direction x radius^(1/d)."""
    u = torch.randn(n, d, generator=gen, dtype=torch.float64)
    u = u / u.norm(dim=1, keepdim=True)
    return u * torch.rand(n, 1, generator=gen, dtype=torch.float64).pow(1.0 / d)


def batch_from_memory(
    free_bytes: float,
    per_input_bytes: float,
    fixed_bytes: float,
    total: int,
    fraction: float = MEMORY_FRACTION,
    multiple: int = 64,
) -> int:
    """The largest chunk whose estimated peak ``fixed + n * per_input`` fits in ``fraction`` of
    ``free_bytes``; at most ``total`` and at least 1, rounded down to a multiple of ``multiple``
    when it is larger (fewer distinct kernel shapes; a reproducible size for small changes in
    the free memory)."""
    if total < 1:
        raise ValueError(f"total must be >= 1; got {total}.")
    per_input = max(float(per_input_bytes), 1.0)
    room = fraction * float(free_bytes) - max(float(fixed_bytes), 0.0)
    n = int(room // per_input) if room > 0 else 1
    if n > multiple:
        n -= n % multiple
    return max(1, min(n, total))


def memory_model(peak_small: float, peak_large: float, small: int, large: int):
    """``(per_input, fixed)`` bytes of the line through the peak memory of two chunk sizes.

    When the difference is not positive (allocator rounding of tiny inputs), the larger chunk's
    average is the cost per input and nothing is fixed (an over-estimate: a smaller chunk)."""
    if not 0 < small < large:
        raise ValueError(f"need 0 < small < large; got {small} and {large}.")
    per_input = (float(peak_large) - float(peak_small)) / (large - small)
    if per_input <= 0:
        return max(float(peak_large), 1.0) / large, 0.0
    return per_input, max(float(peak_large) - large * per_input, 0.0)


def _on_cuda(t: torch.Tensor) -> bool:
    return t.device.type == "cuda"


def _peak_bytes(fn, z: torch.Tensor) -> int:
    """Peak CUDA memory allocated while ``fn(z)`` runs, above what was allocated before."""
    dev = z.device
    torch.cuda.synchronize(dev)
    before = torch.cuda.memory_allocated(dev)
    torch.cuda.reset_peak_memory_stats(dev)
    fn(z)
    torch.cuda.synchronize(dev)
    return torch.cuda.max_memory_allocated(dev) - before


def _probed(measure, fn, example: torch.Tensor, sizes: tuple[int, int], devices) -> tuple:
    """``(per_input, fixed)`` bytes (:func:`memory_model`) of ``fn`` from ``measure(fn, z)``
    (:func:`_peak_bytes` on CUDA, :func:`saved_bytes` on the CPU) on copies of ``example`` at
    the two ``sizes``, under an RNG forked for ``devices`` (a stochastic ``fn``, MCD's dropout,
    draws the same numbers afterwards as without the probe)."""
    small, large = sizes
    probe = example[torch.arange(large, device=example.device) % example.shape[0]]
    with torch.random.fork_rng(devices=devices):
        at_small, at_large = measure(fn, probe[:small]), measure(fn, probe)
    return memory_model(at_small, at_large, small, large)


def probe_batch_size(
    fn: Callable[[torch.Tensor], object],
    example: torch.Tensor,
    total: int,
    cpu_default: int = CPU_ATTACK_BATCH,
    fraction: float = MEMORY_FRACTION,
    reserve_bytes: float = 0.0,
) -> int:
    """How many inputs like ``example`` (a batch (B, ...), B >= 1) one call of ``fn`` may take.

    On the CPU: ``min(total, cpu_default)``. On CUDA: ``fn`` runs on two small chunks
    (:data:`PROBE_SIZES`, made of copies of the example) and :func:`memory_model` fits a cost
    per input and a fixed cost to their peak memory; :func:`batch_from_memory` then takes the
    chunk that fits in ``fraction`` of the free memory (the driver's free memory plus what
    PyTorch's allocator holds unused) less ``reserve_bytes`` (memory the caller will still
    allocate, e.g. the attack's state). The probe resets the device's peak-memory statistics
    and runs under a forked RNG, so a stochastic ``fn`` (MCD's dropout) draws the same numbers
    afterwards as without it."""
    if not _on_cuda(example):
        return max(1, min(total, cpu_default))
    dev = example.device
    per_input, fixed = _probed(_peak_bytes, fn, example, PROBE_SIZES, [dev])
    free, _ = torch.cuda.mem_get_info(dev)
    cached = torch.cuda.memory_reserved(dev) - torch.cuda.memory_allocated(dev)
    return batch_from_memory(free + cached, per_input, fixed + reserve_bytes, total, fraction)


def _score_and_grad(score_fn, z: torch.Tensor, shape) -> tuple[torch.Tensor, torch.Tensor]:
    """``score_fn`` on the flat iterates ``z`` (B, D) reshaped to ``shape``, and its gradient."""
    z = z.detach().requires_grad_(True)
    with torch.enable_grad():
        s = score_fn(z.reshape(-1, *shape))
        if s.shape != (z.shape[0],):
            raise ValueError(f"score_fn must return one score per input; got {tuple(s.shape)}.")
        (g,) = torch.autograd.grad(s.sum(), z)
    return s.detach(), g


def attack_batch_size(score_fn, example: torch.Tensor, total: int, **kwargs) -> int:
    """The chunk of iterates for :func:`ball_attack` (``total`` of them): the memory of the
    score *and its gradient* on ``example`` inputs (a batch shaped like the seeds) measured by
    :func:`probe_batch_size`, with the PGD state of ``total`` iterates (about
    :data:`STATE_COPIES` copies of them) reserved; on the CPU :func:`cpu_attack_batch` (the
    bytes autograd saves an iterate, in a fixed budget). Keyword arguments go to
    :func:`probe_batch_size` (``cpu_default`` to :func:`cpu_attack_batch`)."""
    shape = example.shape[1:]
    flat = example.reshape(example.shape[0], -1)

    def score_and_grad(z):
        return _score_and_grad(score_fn, z, shape)

    if not _on_cuda(example):
        return cpu_attack_batch(
            score_and_grad, flat, total, kwargs.get("cpu_default", CPU_ATTACK_BATCH)
        )
    kwargs.setdefault("reserve_bytes", STATE_COPIES * total * flat[:1].nbytes)
    return probe_batch_size(score_and_grad, flat, total, **kwargs)


def cpu_attack_batch(
    fn: Callable[[torch.Tensor], object],
    example: torch.Tensor,
    total: int,
    most: int = CPU_ATTACK_BATCH,
    budget_bytes: float = CPU_ATTACK_BYTES,
) -> int:
    """The chunk of iterates whose backward pass fits in ``budget_bytes`` on the CPU.

    ``fn`` (the score and its gradient) runs on copies of ``example`` at the two sizes of
    :data:`CPU_PROBE_SIZES`; the bytes of the tensors autograd saves for the backward pass
    (:func:`saved_bytes`: exact, the same on every machine) give a cost per iterate and a fixed
    one (the weights a layer saves; :func:`memory_model`), and :func:`batch_from_memory` takes
    the chunk whose saved bytes x :data:`CPU_BACKWARD_FACTOR` fit in the budget: at most
    ``most`` and ``total``, a multiple of 64 above 64. The probe runs under a forked RNG (a
    stochastic score draws the same numbers afterwards as without it).

    >>> net = torch.nn.Sequential(torch.nn.Linear(4, 1000), torch.nn.ReLU(), torch.nn.Linear(1000, 1))
    >>> def fn(z):
    ...     return _score_and_grad(lambda x: net(x).squeeze(1), z, (4,))
    >>> saved_bytes(fn, torch.rand(4, 4)) - saved_bytes(fn, torch.rand(2, 4))  # ReLU's 1000 floats
    8032
    >>> cpu_attack_batch(fn, torch.rand(1, 4), 10_000)  # 4 kB an iterate in 2 GiB: the cap
    2048
    >>> cpu_attack_batch(fn, torch.rand(1, 4), 10_000, budget_bytes=2**20)  # 1 MiB: 169 -> 128
    128
    """
    cap = max(1, min(int(total), int(most)))
    if cap == 1:
        return 1
    per_input, fixed = _probed(saved_bytes, fn, example, CPU_PROBE_SIZES, [])
    factor = CPU_BACKWARD_FACTOR
    return batch_from_memory(budget_bytes, factor * per_input, factor * fixed, cap, fraction=1.0)


def saved_bytes(fn: Callable[[torch.Tensor], object], z: torch.Tensor) -> int:
    """Bytes of the distinct storages autograd saves for backward passes while ``fn(z)`` runs
    (a pass's memory on the CPU, where no allocator counts its peak; PyTorch's
    ``saved_tensors_hooks`` see each tensor as it is saved). Every storage seen is kept alive
    until ``fn`` returns, so that no address is reused: a score that runs an inner pass of its
    own (ODIN's and Maha's input pre-processing) frees that graph before the outer one is
    built, and its addresses would otherwise be counted again, or not, by chance; its saved
    bytes count too (an over-estimate, the same on every run)."""
    storages: dict[int, int] = {}
    alive = []

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        storages[storage.data_ptr()] = storage.nbytes()
        alive.append(storage)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn(z)
    return sum(storages.values())


def ball_attack(
    score_fn: Callable[[torch.Tensor], torch.Tensor],
    x0,
    radius,
    metric: Mahalanobis,
    steps: int = 100,
    restarts: int = 5,
    step_size: float = 3.0,
    box: tuple[float, float] | None = (0.0, 1.0),
    seed: int = 0,
    include_seed: bool = True,
    batch_size: int | None = None,
    gradient: str = "raw",
    refine_steps: int = 0,
) -> AttackResult:
    """Maximise ``score_fn`` (batch (B, ...) -> (B,)) in each ball ``d(x, x0_n) <= radius_n``.

    ``restarts`` random starting points per seed are drawn uniformly in the ball (and made
    feasible); with ``include_seed`` the first start is the seed itself. Returns the best point
    found per seed. The ``N * restarts`` iterates are scored in chunks of ``batch_size``
    (``None``: :func:`attack_batch_size`, sized to the device's free memory on a GPU); for a
    deterministic score every chunking gives the same result, up to the last bits of kernels
    that depend on the batch size (module docstring). A stochastic score (MCD's
    dropout) draws its noise per chunk: pass a fixed ``batch_size`` to repeat such an attack
    exactly. ``gradient``: a step is ``step_size`` x the whitened gradient (``"raw"``, the
    paper's) or x its unit direction (``"normalised"``). The seeds are checked once; the steps
    run inside
    :func:`ccu.core.validation.trusted_inputs` (no finiteness read-back per step).

    ``refine_steps`` (0: none, the paper's attack alone) more steps then start from each seed's
    best point: projected ascent in input space along the gradient without the pixels that sit
    on a bound and point out (:func:`_refine`). The paper's step, clipped to the box, stalls
    once most pixels sit on a bound: the clipped step then lowers the score at every size and
    backtracking halves it forever (a linear score stopped at 0.4 of the radius in MNIST's
    balls; refined, it reaches the ball's surface at 2.3-2.8 times the score). The refinement
    only ever keeps a better point; ``score_unrefined`` keeps what the paper's attack reached.
    """
    x0 = as_tensor(x0, "x0")
    if x0.ndim < 2:
        raise ValueError(f"x0 must be a batch (N, ...); got shape {tuple(x0.shape)}.")
    shape = x0.shape[1:]
    n = x0.shape[0]
    flat0 = x0.reshape(n, -1)
    check_finite(flat0, "x0")
    if flat0.shape[1] != metric.dim:
        raise ValueError(f"x0 has {flat0.shape[1]} features; the metric has {metric.dim}.")
    # The ball is that of the float64 radius: it is checked exactly at the end. The working copy
    # in the points' dtype only steers the iterates.
    radius64 = torch.as_tensor(radius, dtype=torch.float64, device=flat0.device)
    radius64 = radius64.expand(n).clone() if radius64.ndim == 0 else radius64.clone()
    if radius64.shape != (n,) or bool((radius64 < 0).any()) or bool(radius64.isnan().any()):
        raise ValueError(
            f"radius must be >= 0, a scalar or of shape ({n},), without NaN (uncertified seeds "
            "of ccu.certified_radius have no ball: select them out with ccu.certified_mask)."
        )
    radius = radius64.to(flat0.dtype)
    if box is not None and bool(((flat0 < box[0]) | (flat0 > box[1])).any()):
        raise ValueError(f"the seeds must lie inside the box {box}.")
    if steps < 0 or restarts < 1 or refine_steps < 0:
        raise ValueError("steps and refine_steps must be >= 0 and restarts >= 1.")
    if gradient not in GRADIENTS:
        raise ValueError(f"gradient must be one of {GRADIENTS}; got {gradient!r}.")
    if batch_size is not None and (isinstance(batch_size, bool) or int(batch_size) < 1):
        raise ValueError(f"batch_size must be a positive integer or None; got {batch_size!r}.")

    gen = torch.Generator().manual_seed(seed)
    R = restarts
    seeds = flat0.repeat_interleave(R, 0)  # (N*R, D), restarts of a seed are adjacent
    rad = radius.repeat_interleave(R, 0)
    d = metric.dim
    # drawn on the CPU (the same starts on every device), moved once
    w = _uniform_in_unit_ball(n * R, d, gen).to(seeds, non_blocking=True) * rad[:, None]
    if include_seed:
        w.view(n, R, d)[:, 0] = 0.0
    x = _feasible(seeds + metric.unwhiten(w), seeds, rad, metric, box)

    with trusted_inputs():  # the seeds were checked above; iterates stay in their balls
        if batch_size is None:
            batch_size = attack_batch_size(score_fn, x[:R].reshape(-1, *shape), n * R)
        chunk = int(batch_size)

        def evaluate(z):
            if z.shape[0] <= chunk:
                return _score_and_grad(score_fn, z, shape)
            parts = [_score_and_grad(score_fn, c, shape) for c in z.split(chunk)]
            return torch.cat([s for s, _ in parts]), torch.cat([g for _, g in parts])

        score, grad = evaluate(x)
        step = torch.full((n * R,), float(step_size), dtype=seeds.dtype, device=seeds.device)
        best_x, best_s = x.clone(), score.clone()
        history = [best_s.view(n, R).max(1).values]
        unwhitening = metric._matrix("unwhitening", grad)
        for _ in range(steps):
            # Steepest ascent in whitened coordinates: x = x0 + unwhiten(w) => dS/dw = g @ Winv^T
            gw = grad @ unwhitening.T
            if gradient == "normalised":
                gw = gw / gw.norm(dim=1, keepdim=True).clamp_min(1e-30)
            w_new = metric.whiten(x - seeds) + step[:, None] * gw
            x, score, grad, step, best_x, best_s = _backtracking_step(
                evaluate, w_new, (x, score, grad, step, best_x, best_s), seeds, rad, metric, box
            )
            history.append(best_s.view(n, R).max(1).values)

        per_seed = best_s.view(n, R)
        j = per_seed.argmax(1)
        pick = torch.arange(n, device=j.device) * R + j
        xb, sb = best_x[pick], per_seed.max(1).values

        def exactly_inside(xb, sb):
            xf, dist = project_exact(xb, flat0, radius64, metric, box)
            moved = (xf != xb).any(dim=1)
            if bool(moved.any()):  # the score reported is that of the point returned
                sb = sb.clone()
                sb[moved] = evaluate(xf[moved])[0]
            return xf, sb, dist

        xf, sf, dist = exactly_inside(xb, sb)
        xu, su = xf, sf
        if refine_steps:
            xb, sb = _refine(evaluate, xf, sf, flat0, radius, metric, box, refine_steps, history)
            xr, sr, dr = exactly_inside(xb, sb)
            # made exactly feasible, a refined point can score below where it started (or go
            # back to its seed): the unrefined point then stays
            keep = sr >= su
            xf = torch.where(keep[:, None], xr, xu)
            sf = torch.where(keep, sr, su)
            dist = torch.where(keep.to(dr.device), dr, dist)
    return AttackResult(
        xf.reshape(n, *shape), sf, dist, torch.stack(history), xu.reshape(n, *shape), su
    )


def _backtracking_step(evaluate, w_new, state, seeds, rad, metric, box):
    """One step of the attack's rule (appendix "Attack details"): the proposal ``w_new``
    (whitened, from the seeds) into the ball, then the box (:func:`_feasible`); taken where the
    score does not drop (step x1.1), else not (step /2). ``state``: ``(x, score, grad, step,
    best_x, best_score)``, returned updated."""
    x, score, grad, step, best_x, best_s = state
    norm = w_new.norm(dim=1)
    w_new = w_new * torch.where(norm > rad, rad / norm.clamp_min(1e-30), 1.0)[:, None]
    cand = _feasible(seeds + metric.unwhiten(w_new), seeds, rad, metric, box)
    s_new, g_new = evaluate(cand)
    ok = s_new >= score
    x = torch.where(ok[:, None], cand, x)
    score = torch.where(ok, s_new, score)
    grad = torch.where(ok[:, None], g_new, grad)
    step = torch.where(ok, step * 1.1, step / 2.0)
    better = score > best_s
    best_x = torch.where(better[:, None], x, best_x)
    best_s = torch.where(better, score, best_s)
    return x, score, grad, step, best_x, best_s


def _face_direction(grad, x, box):
    """The gradient without the pixels that sit on a bound of ``box`` and point out of it
    (``(N, D)``; unchanged without a box): the projection of the gradient onto the face of the
    box the point lies on, along which a small step goes up and stays in the box."""
    if box is None:
        return grad
    out = ((x <= box[0]) & (grad < 0)) | ((x >= box[1]) & (grad > 0))
    return grad.masked_fill(out, 0.0)


#: the first step of :func:`ball_attack`'s refinement: Euclidean length in input space
REFINE_FIRST_STEP = 1.0


def _refine(evaluate, x, score, seeds, rad, metric, box, steps, history):
    """:func:`ball_attack`'s refinement: ``steps`` projected ascent steps from the points ``x``
    (one per seed) along the unit :func:`_face_direction` in input space (Euclidean, where the
    projection onto the box is the clip: a small step goes up), then into the ball by the
    attack's own scaling towards the seed; kept only where the score does not drop (step x1.1
    then, /2 and backtrack otherwise, from :data:`REFINE_FIRST_STEP`). The paper's whitened
    step, clipped, stalls on the box's faces. Appends to ``history``; returns the best points
    and their scores."""
    s, g = evaluate(x)
    s = torch.maximum(s, score)  # the point's own score (a chunked evaluation agrees)
    step = torch.full_like(s, REFINE_FIRST_STEP)
    best_x, best_s = x.clone(), s.clone()
    for _ in range(steps):
        d = _face_direction(g, x, box)
        d = d / d.norm(dim=1, keepdim=True).clamp_min(1e-30)
        w_new = metric.whiten(x - seeds + step[:, None] * d)
        x, s, g, step, best_x, best_s = _backtracking_step(
            evaluate, w_new, (x, s, g, step, best_x, best_s), seeds, rad, metric, box
        )
        history.append(best_s)
    return best_x, best_s


def confidence_score(model) -> Callable[[torch.Tensor], torch.Tensor]:
    """``x -> max_y log p(y|x)`` for a model returning log-probabilities (like ``ccu.CCU``)."""
    return lambda x: model(x).max(dim=1).values


def confidence_surrogate(model) -> Callable[[torch.Tensor], torch.Tensor]:
    """``x -> log p(x|i) - log p(x|o) + max_y log softmax``, for a ``ccu.CCU``: what its
    confidence rises with, where the confidence itself is flat. In balls far from the data the
    confidence is 1/M to the last bit (the density ratio is e^-300000 there) and its gradient 0,
    so an attack on it never leaves its start; this one climbs towards the in-distribution."""

    def surrogate(x: torch.Tensor) -> torch.Tensor:
        log_pi, log_po = model.log_densities(x)
        return log_pi - log_po + torch.log_softmax(model.logits(x), dim=1).max(dim=1).values

    return surrogate


def sample_in_ball(x0, radius, metric: Mahalanobis, n: int, seed: int = 0, box=None):
    """``n`` points uniform in each ball (and made exactly feasible for ``box``): (N, n, D)."""
    x0 = as_tensor(x0, "x0").reshape(len(x0), -1)
    radius64 = torch.as_tensor(radius, dtype=torch.float64).expand(x0.shape[0])
    gen = torch.Generator().manual_seed(seed)
    N, d = x0.shape
    seeds = x0.repeat_interleave(n, 0)
    rad64 = radius64.to(x0.device).repeat_interleave(n, 0)
    rad = rad64.to(x0.dtype)
    w = _uniform_in_unit_ball(N * n, d, gen).to(x0) * rad[:, None]
    x = _feasible(seeds + metric.unwhiten(w), seeds, rad, metric, box)
    return project_exact(x, seeds, rad64, metric, box)[0].reshape(N, n, d)
