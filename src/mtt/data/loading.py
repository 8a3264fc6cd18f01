"""The structures of each batch, read (and given their neighbour lists) ahead of the step.

A set held in memory is read in the training process: its structures keep their
neighbour lists and device tensors from one epoch to the next. A set on disk is read by
torch DataLoader workers, each building whole batches of the structures this rank was
given (neighbour lists included) while the model trains on earlier ones; on CUDA they
come in pinned memory. Only the structures of a batch are ever held, so memory does not
grow with the dataset.
"""

from __future__ import annotations

import os
import time
from typing import Iterator, Sequence

import torch
from metatomic.torch import NeighborListOptions
from torch.utils.data import DataLoader, Dataset, Sampler

from ..errors import MttError
from .batching import compute_neighbor_lists
from .readers import Structure
from .structure_sets import StructureSet


class LoadedBatch:
    """The structures of one batch, as a worker hands them over."""

    def __init__(self, structures: list[Structure], error: MttError | None = None):
        self.structures = structures
        self.error = error  # a user's problem met in a worker, raised as it is in the process

    def pin_memory(self) -> "LoadedBatch":
        """Page-locked copies of the tensors, so that the copies to the GPU do not wait."""
        for structure in self.structures:
            for name in ("types", "positions", "cell"):
                setattr(structure, name, getattr(structure, name).pin_memory())
            for values in (structure.values, structure.forces, structure.stress):
                for key in values:
                    values[key] = values[key].pin_memory()
        return self


class _Reader(Dataset):
    """Reads a batch of a set by indices (an item is a whole batch)."""

    def __init__(self, structures: StructureSet, requests: list[NeighborListOptions]):
        self.set = structures
        self.requests = requests

    def __len__(self) -> int:
        return len(self.set)

    def __getitem__(self, indices: Sequence[int]) -> LoadedBatch:
        try:
            structures = self.set.read(indices)
            if not self.set.in_memory:
                compute_neighbor_lists(structures, self.requests)
        except MttError as error:  # the message as written, not DataLoader's re-raise of it
            return LoadedBatch([], error)
        return LoadedBatch(structures)


class _Plan(Sampler):
    """The batches of the current pass, set before each pass over the loader."""

    def __init__(self) -> None:
        self.items: list[list[int]] = []

    def __iter__(self) -> Iterator[list[int]]:
        return iter(self.items)

    def __len__(self) -> int:
        return len(self.items)


def _as_they_are(batch: LoadedBatch) -> LoadedBatch:
    return batch


def default_workers(structures: StructureSet, world_size: int) -> int:
    """No worker for a set in memory; for one on disk, a quarter of this rank's cores, from 1 to 4."""
    if structures.in_memory:
        return 0
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cores = os.cpu_count() or 1
    return max(1, min(4, cores // max(1, world_size) // 4))


class BatchLoader:
    """Gives the batches of a set, in the order asked, read ahead by ``workers`` processes."""

    def __init__(
        self,
        structures: StructureSet,
        requests: list[NeighborListOptions],
        device: torch.device,
        workers: int,
    ):
        self.structures = structures
        self.plan = _Plan()
        self.workers = workers
        self.loader = DataLoader(
            _Reader(structures, requests),
            sampler=self.plan,
            batch_size=None,
            collate_fn=_as_they_are,
            num_workers=workers,
            pin_memory=workers > 0 and device.type == "cuda",
            persistent_workers=workers > 0,
            prefetch_factor=4 if workers > 0 else None,
        )
        #: seconds spent waiting for a batch that was not ready, and structures read, since the last reset
        self.waited = 0.0
        self.structures_read = 0

    def batches(self, items: list[list[int]]) -> Iterator[list[Structure]]:
        """The structures of each batch of ``items`` (lists of indices in the set), in order."""
        if not items:
            return
        self.plan.items = items
        iterator = iter(self.loader)
        for _ in range(len(items)):
            started = time.perf_counter()
            loaded = next(iterator)
            self.waited += time.perf_counter() - started
            if loaded.error is not None:
                raise loaded.error
            self.structures_read += len(loaded.structures)
            yield loaded.structures

    def close(self) -> None:
        """Stop the workers."""
        self.loader = None
