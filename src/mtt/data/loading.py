"""The structures of each batch, read (and given their neighbour lists) ahead of the step.

A set held in memory is read in the training process: its structures keep their
neighbour lists and device tensors from one epoch to the next. A set on disk is read by
torch DataLoader workers, each building whole batches of the structures this rank was
given (neighbour lists included) while the model trains on earlier ones; on CUDA they
come in pinned memory. Beyond the batches being read, only the structures that the
trainer's memory budget holds stay (:meth:`BatchLoader.batches`), so memory does not grow
with the dataset.
"""

from __future__ import annotations

import os
import time
from typing import Callable, Iterator, Sequence

import torch
from metatomic.torch import NeighborListOptions
from torch.utils.data import DataLoader, Dataset, Sampler

from ..distributed import available_cores
from ..errors import MttError
from .batching import PairList, compute_neighbor_lists
from .readers import Structure
from .structure_sets import StructureSet


class LoadedBatch:
    """The structures of one batch, as a worker hands them over."""

    def __init__(self, structures: list[Structure], error: MttError | None = None):
        self.structures = structures
        self.error = error  # a user's problem met in a worker, raised as it is in the process

    def __getstate__(self) -> dict:
        # numpy arrays travel from a worker inside the pickle; torch tensors would each take
        # a shared-memory segment, which costs far more than these small arrays
        return {"structures": [_as_arrays(s) for s in self.structures], "error": self.error}

    def __setstate__(self, state: dict) -> None:
        self.structures = [_as_structure(arrays) for arrays in state["structures"]]
        self.error = state["error"]

    def pin_memory(self) -> "LoadedBatch":
        """Page-locked copies of the tensors, so that the copies to the GPU do not wait."""
        for structure in self.structures:
            for name in ("types", "positions", "cell"):
                setattr(structure, name, getattr(structure, name).pin_memory())
            for values in (structure.values, structure.forces, structure.stress):
                for key in values:
                    values[key] = values[key].pin_memory()
        return self


def _as_arrays(structure: Structure) -> dict:
    """A structure as numpy arrays and plain values, to be sent to another process."""
    return {
        "types": structure.types.numpy(),
        "positions": structure.positions.numpy(),
        "cell": structure.cell.numpy(),
        "pbc": structure.pbc.numpy(),
        "values": {k: v.numpy() for k, v in structure.values.items()},
        "forces": {k: v.numpy() for k, v in structure.forces.items()},
        "stress": {k: v.numpy() for k, v in structure.stress.items()},
        "key": structure.key,
        "neighbors": [
            ((options.cutoff, options.full_list, options.strict), pairs.samples.numpy(), pairs.vectors.numpy())
            for options, pairs in getattr(structure, "neighbors", [])
        ],
    }


def _as_structure(arrays: dict) -> Structure:
    structure = Structure(
        types=torch.from_numpy(arrays["types"]),
        positions=torch.from_numpy(arrays["positions"]),
        cell=torch.from_numpy(arrays["cell"]),
        pbc=torch.from_numpy(arrays["pbc"]),
        values={k: torch.from_numpy(v) for k, v in arrays["values"].items()},
        forces={k: torch.from_numpy(v) for k, v in arrays["forces"].items()},
        stress={k: torch.from_numpy(v) for k, v in arrays["stress"].items()},
        key=arrays["key"],
    )
    structure.neighbors = [
        (
            NeighborListOptions(cutoff=cutoff, full_list=full_list, strict=strict),
            PairList(torch.from_numpy(samples), torch.from_numpy(vectors)),
        )
        for (cutoff, full_list, strict), samples, vectors in arrays["neighbors"]
    ]
    return structure


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


def _start_worker(_: int) -> None:
    """A worker gives way to the training process's threads on a busy core: it reads ahead
    while they wait on Python, instead of stalling their parallel regions."""
    try:
        os.nice(10)
    except OSError:  # not allowed here: as it is
        pass


def default_workers(structures: StructureSet, world_size: int) -> int:
    """No worker for a set in memory; for one on disk, a quarter of this rank's cores, from 1 to 4."""
    if structures.in_memory:
        return 0
    return max(1, min(4, available_cores() // max(1, world_size) // 4))


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
            worker_init_fn=_start_worker if workers > 0 else None,
        )
        #: seconds spent waiting for a batch that was not ready since the last reset, and
        #: structures read in each pass over the set since then
        self.waited = 0.0
        self.reads: list[int] = []
        #: index in the set -> structure read once and held in memory
        self.held: dict[int, Structure] = {}

    def batches(
        self, items: list[list[int]], hold: Callable[[Structure], bool] | None = None
    ) -> Iterator[list[Structure]]:
        """The structures of each batch of ``items`` (lists of indices in the set), in order.

        A structure read from disk that ``hold`` accepts, once its batch has been used,
        stays in memory: later passes give it without reading it again.
        """
        reading = [[index for index in batch if index not in self.held] for batch in items]
        self.plan.items = [indices for indices in reading if indices]
        iterator = iter(self.loader) if self.plan.items else None
        self.reads.append(0)
        for batch, indices in zip(items, reading):
            read: dict[int, Structure] = {}
            if indices:
                started = time.perf_counter()
                loaded = next(iterator)
                self.waited += time.perf_counter() - started
                if loaded.error is not None:
                    raise loaded.error
                self.reads[-1] += len(loaded.structures)
                read = dict(zip(indices, loaded.structures))
            yield [self.held[index] if index in self.held else read[index] for index in batch]
            if hold is not None and not self.structures.in_memory:
                for index, structure in read.items():
                    if hold(structure):
                        self.held[index] = structure

    def close(self) -> None:
        """Stop the workers."""
        self.loader = None
