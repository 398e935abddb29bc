"""Batches that pair the in-distribution with the training out-distribution (128 + 128).

Seeded, every in-sample once per epoch, and no out-sample dropped: the out-set is walked through
shuffled permutations (the authors' code drops the first out-sample of every batch; this does
not). In-batches are augmented with the paper's scheme (:mod:`ccu.data.augment`) when asked.

The loader is device-resident: the training and out-sets are moved to the device once, each
epoch's plan (the index orders, crop offsets and flips) is drawn up front from a seeded CPU
generator and moved over in one copy, and every batch is gathered and augmented on the device.
Nothing goes back to the host during an epoch, and the same seed gives the same batches on every
device (the book's chapter *Training every method* uses it through :class:`ccu.Trainer`).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import torch

from ccu.data.augment import crop_flip, crop_flip_params


def epoch_indices(
    n_in: int, n_out: int, batch_size: int, gen: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """One epoch's order: a permutation of the in-set, and ``n_in`` out-indices from successive
    shuffled permutations of the out-set (empty when ``n_out`` is 0)."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1; got {batch_size}.")
    perm_in = torch.randperm(n_in, generator=gen)
    if not n_out:
        return perm_in, torch.empty(0, dtype=torch.long)
    reps = -(-n_in // n_out)
    perm_out = torch.cat([torch.randperm(n_out, generator=gen) for _ in range(reps)])
    return perm_in, perm_out[:n_in]


@dataclass(kw_only=True)
class EpochPlan:
    """Everything random about one epoch, on the device: in- and out-indices (n_in,), crop
    offsets (n_in, 2) and flips (n_in,) (None without augmentation)."""

    idx_in: torch.Tensor
    idx_out: torch.Tensor
    offsets: torch.Tensor | None
    flips: torch.Tensor | None


def host_to_device(t: torch.Tensor, device: torch.device | str) -> torch.Tensor:
    """A CPU tensor on ``device`` without a host sync: to a GPU through pinned memory. (A
    ``non_blocking`` copy from pageable memory makes CUDA wait for the stream first: a sync per
    batch where the training draws on the CPU, as GAN's latent noise and ACET's start do.)"""
    device = torch.device(device)
    if device.type == "cuda":  # pinned: the copy does not wait for the host
        return t.pin_memory().to(device, non_blocking=True)
    return t.to(device)


class PairedLoader:
    """Epochs of ``(x_in, y_in, x_out)`` batches from a :class:`ccu.data.Dataset`, on ``device``.

    ``with_out=False`` gives empty out-batches (training without an out-distribution, e.g. Base).
    ``channels_last`` returns image batches in that memory format (for convolutional networks
    on a GPU). The generator's state (``state_dict``) is what a checkpoint needs to resume.
    """

    def __init__(
        self,
        data,
        batch_size: int = 128,
        seed: int = 0,
        augment: bool = False,
        with_out: bool = True,
        device: str | torch.device = "cpu",
        channels_last: bool = False,
    ):
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1; got {batch_size}.")
        self.data = data
        self.batch_size = batch_size
        self.device = torch.device(device)
        # the whole sets live on the device (on the CPU .to() is free: no copy)
        self.train_x = data.train_x.to(self.device)
        self.train_y = data.train_y.to(self.device)
        self.with_out = with_out and len(data.out_x) > 0
        self.out_x = data.out_x.to(self.device) if self.with_out else data.out_x[:0].to(self.device)
        is_image = self.train_x.ndim == 4
        self.scheme = data.spec.augmentation if augment and is_image else None
        if augment and is_image and self.scheme is None:
            raise ValueError(
                f"augment=True, but dataset {data.name!r} has no augmentation in its record."
            )
        self.memory_format = (
            torch.channels_last if channels_last and is_image else torch.contiguous_format
        )
        self.gen = torch.Generator().manual_seed(seed)

    def __len__(self) -> int:
        return -(-len(self.train_x) // self.batch_size)

    def plan(self) -> EpochPlan:
        """Draw the next epoch (advances the generator) and move it to the device."""
        n_in = len(self.train_x)
        n_out = len(self.out_x) if self.with_out else 0
        idx_in, idx_out = epoch_indices(n_in, n_out, self.batch_size, self.gen)
        offsets = flips = None
        if self.scheme is not None:
            offsets, flips = crop_flip_params(n_in, self.scheme, self.gen)
            offsets, flips = (
                host_to_device(offsets, self.device),
                host_to_device(flips, self.device),
            )
        return EpochPlan(
            idx_in=host_to_device(idx_in, self.device),
            idx_out=host_to_device(idx_out, self.device),
            offsets=offsets,
            flips=flips,
        )

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
        p, b = self.plan(), self.batch_size
        for start in range(0, len(self.train_x), b):
            idx = p.idx_in[start : start + b]
            x = self.train_x.index_select(0, idx)
            if self.scheme is not None:
                x = crop_flip(
                    x, self.scheme, p.offsets[start : start + b], p.flips[start : start + b]
                )
            if self.with_out:
                z = self.out_x.index_select(0, p.idx_out[start : start + b])
            else:
                z = self.out_x
            if self.memory_format is torch.channels_last:
                x = x.contiguous(memory_format=self.memory_format)
                z = z.contiguous(memory_format=self.memory_format)
            yield x, self.train_y.index_select(0, idx), z

    def state_dict(self) -> dict:
        return {"gen": self.gen.get_state()}

    def load_state_dict(self, state: dict) -> None:
        self.gen.set_state(state["gen"].cpu())  # a checkpoint loaded onto a GPU holds it there
