"""Batches that pair the in-distribution with the training out-distribution (128 + 128).

Seeded, every in-sample once per epoch, and no out-sample dropped: the out-set is walked through
shuffled permutations (the authors' code drops the first out-sample of every batch; this does
not). In-batches are augmented with the paper's scheme (:mod:`ccu.data.augment`) when asked.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch

from ccu.data.augment import augment as augment_batch


def paired_batches(n_in: int, n_out: int, batch_size: int, gen: torch.Generator):
    """Yield (in-indices, out-indices) of equal length covering every in-point once per epoch.

    Out-indices run through a shuffled permutation of the out-set and start a new one when it
    is used up, so no out-sample is skipped.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1; got {batch_size}.")
    perm_in = torch.randperm(n_in, generator=gen)
    pool = torch.empty(0, dtype=torch.long)
    for start in range(0, n_in, batch_size):
        idx_in = perm_in[start : start + batch_size]
        while n_out and len(pool) < len(idx_in):
            pool = torch.cat([pool, torch.randperm(n_out, generator=gen)])
        idx_out, pool = pool[: len(idx_in)], pool[len(idx_in) :]
        yield idx_in, idx_out


class PairedLoader:
    """Epochs of ``(x_in, y_in, x_out)`` batches from a :class:`ccu.data.Dataset`.

    ``with_out=False`` gives empty out-batches (training without an out-distribution, e.g. Base).
    The generator's state (``state_dict``) is what a checkpoint needs to resume mid-training.
    """

    def __init__(
        self,
        data,
        batch_size: int = 128,
        seed: int = 0,
        augment: bool = False,
        with_out: bool = True,
        device: str | torch.device = "cpu",
    ):
        self.data = data
        self.batch_size = batch_size
        self.augment = augment
        self.with_out = with_out
        self.device = torch.device(device)
        self.gen = torch.Generator().manual_seed(seed)

    def __len__(self) -> int:
        return -(-len(self.data.train_x) // self.batch_size)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
        d = self.data
        n_out = len(d.out_x) if self.with_out else 0
        for idx_in, idx_out in paired_batches(len(d.train_x), n_out, self.batch_size, self.gen):
            x = d.train_x[idx_in]
            if self.augment:
                seed = int(torch.randint(2**31, (1,), generator=self.gen))
                x = augment_batch(x, d.spec.augmentation, seed)
            z = d.out_x[idx_out] if n_out else d.out_x[:0]
            yield x.to(self.device), d.train_y[idx_in].to(self.device), z.to(self.device)

    def state_dict(self) -> dict:
        return {"gen": self.gen.get_state()}

    def load_state_dict(self, state: dict) -> None:
        self.gen.set_state(state["gen"])
