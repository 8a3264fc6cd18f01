"""Turn structures into batches for the model, with neighbour lists cached.

Neighbour lists depend only on the positions, which do not change during training, so
they are computed once per structure, and each structure's tensors are converted to the
training dtype and device once. A batch comes in one of two forms:

- a :class:`~mtt.data.flat_batch.FlatBatch`, the input of every architecture's model, for
  training and validation: the atoms' types and positions and the pairs of every
  requested neighbour list, numbered across the batch. Forces and stress are taken
  against one positions leaf for all atoms and one strain leaf for all structures, from
  which the pair vectors are computed in a few operations;
- one metatomic ``System`` per structure, what exported models see (``mtt eval``). Each
  structure's system is built once and reused by every batch; when forces or stress are
  computed its positions (and a strain) are leaves that require grad, and the autograd
  link from them to the neighbour vectors is made once and kept: differentiate through a
  batch with ``torch.autograd.grad(..., retain_graph=True)``, which leaves it in place.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import torch
from metatensor.torch import Labels, TensorBlock
from metatomic.torch import NeighborListOptions, System, register_autograd_neighbors
from vesin import NeighborList

from ..errors import DataError
from .flat_batch import FlatBatch, NeighborPairs
from .readers import Structure


@dataclass
class PairList:
    """A structure's neighbour list, as the calculator gives it, sorted by first atom, second
    atom and cell shift: the calculator's order may change from one call to the next, and a
    structure read again (streamed from disk) must give the very same list as the kept
    inputs computed from it before."""

    samples: torch.Tensor  # (pairs, 5) int32: first atom, second atom, cell shift a, b, c
    vectors: torch.Tensor  # (pairs, 3): from the first atom to the second


#: the names metatomic gives the samples and components of a neighbour list
_SAMPLE_NAMES = ["first_atom", "second_atom", "cell_shift_a", "cell_shift_b", "cell_shift_c"]


def _calculator(options: NeighborListOptions) -> NeighborList:
    return NeighborList(cutoff=options.engine_cutoff("angstrom"), full_list=options.full_list)


def _pair_list(calculator: NeighborList, structure: Structure) -> PairList:
    pairs, shifts, vectors = calculator.compute(
        structure.positions.numpy(), structure.cell.numpy(), structure.pbc.numpy(), quantities="PSD"
    )
    samples = np.concatenate([pairs, shifts], axis=1).astype(np.int32)
    order = np.lexsort(samples.T[::-1])
    return PairList(torch.from_numpy(samples[order]), torch.from_numpy(vectors[order]))


def compute_neighbor_lists(structures: list[Structure], requests: list[NeighborListOptions]) -> None:
    """Compute and store on each structure the neighbour lists the model asks for."""
    calculators = [_calculator(options) for options in requests]
    for structure in structures:
        structure.neighbors = [
            (options, _pair_list(calculator, structure)) for options, calculator in zip(requests, calculators)
        ]


def check_cutoff(structures: list[Structure], requests: list[NeighborListOptions]) -> None:
    """Refuse a model whose cutoff is below every distance between atoms of the training set:
    no atom would see a neighbour, and the model would learn the composition alone."""
    if not requests or all(len(s) < 2 for s in structures):
        return
    if any(len(pairs.samples) > 0 for s in structures for _, pairs in s.neighbors):
        return
    cutoff = max(options.cutoff for options in requests)
    wide = NeighborListOptions(cutoff=max(10.0, 3 * cutoff), full_list=False, strict=True)
    calculator = _calculator(wide)
    distances = []
    for structure in structures[:100]:
        vectors = _pair_list(calculator, structure).vectors
        if len(vectors):
            distances.append(float(torch.linalg.vector_norm(vectors, dim=1).min()))
    closest = f"{min(distances):.3g} Å" if distances else f"more than {wide.cutoff:g} Å"
    raise DataError(
        f"the model's cutoff ({cutoff:g} Å) is shorter than the smallest distance between two atoms of "
        f"the training set ({closest}): no atom would see a neighbour.",
        hint="Raise the architecture's cutoff (see its hyperparameters under architecture.model), or check "
        "the length unit of the dataset (systems.length_unit).",
    )


@dataclass
class _Pairs:
    """A structure's neighbour list as flat tensors: local atom numbers and cell shifts."""

    first: torch.Tensor
    second: torch.Tensor
    shifts: torch.Tensor  # (pairs, 3) cell-shift vectors: vector = r[second] - r[first] + shift


@dataclass
class Batch:
    """Several structures ready for the model, and their reference values."""

    systems: list[System] | None  # one per structure, unless the batch is flat
    flat: FlatBatch | None
    # the leaves forces are taken against: concatenated, all atoms' positions (one for a
    # flat batch, or one per structure)
    positions: list[torch.Tensor]
    # the leaves stress is taken against, for stress: concatenated, (n_systems, 3, 3)
    # displacements (a (3, 3) per structure, or one for a flat batch)
    strains: list[torch.Tensor] | None
    volumes: torch.Tensor  # (n_systems,) cell volumes, for stress
    n_atoms: torch.Tensor  # (n_systems,)
    values: dict[str, torch.Tensor]  # name -> (n_systems, width), or (n_atoms_total, width) per atom
    forces: dict[str, torch.Tensor]  # name -> (n_atoms_total, 3)
    stress: dict[str, torch.Tensor]  # name -> (n_systems, 3, 3)
    #: (name, "values" | "forces" | "stress") -> (n_systems,) bool, the structures that have
    #: that reference, for those that some structure of the batch lacks (the others' rows
    #: hold zeros); absent when every structure has it
    present: dict[tuple[str, str], torch.Tensor] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.n_atoms)

    def has(self, target: str, kind: str) -> torch.Tensor:
        """(n_systems,) bool: which structures of the batch have the reference ``kind``
        ("values", "forces" or "stress") of ``target``; none when the batch has no such
        reference at all."""
        references = {"values": self.values, "forces": self.forces, "stress": self.stress}[kind]
        if target not in references:
            return torch.zeros(len(self), dtype=torch.bool, device=self.n_atoms.device)
        return self.present.get((target, kind), torch.ones(len(self), dtype=torch.bool, device=self.n_atoms.device))


@dataclass
class _Prepared:
    """A structure's tensors in the training dtype and device, made once and reused."""

    types: torch.Tensor
    positions: torch.Tensor
    cell: torch.Tensor
    pbc: torch.Tensor
    volume: torch.Tensor
    neighbors: list[tuple[NeighborListOptions, PairList]]
    pairs: list[_Pairs]
    values: dict[str, torch.Tensor]
    forces: dict[str, torch.Tensor]
    stress: dict[str, torch.Tensor]
    # (forces or stress, stress) -> the positions leaf and the strain leaf
    leaves: dict[tuple[bool, bool], tuple[torch.Tensor, torch.Tensor | None]] = field(default_factory=dict)
    # (forces or stress, stress) -> the system
    systems: dict[tuple[bool, bool], System] = field(default_factory=dict)


def _prepared(structure: Structure, dtype: torch.dtype, device: torch.device) -> _Prepared:
    cache = structure.__dict__.setdefault("_prepared", {})
    key = (dtype, str(device), id(structure.neighbors))  # new neighbour lists, new tensors
    if key not in cache:
        cache.clear()  # one training dtype and device at a time
        cell = structure.cell.to(device=device, dtype=dtype)
        neighbors = [
            (options, PairList(pairs.samples.to(device), pairs.vectors.to(device=device, dtype=dtype)))
            for options, pairs in structure.neighbors
        ]
        pairs = []
        for _, pair_list in neighbors:
            samples = pair_list.samples
            pairs.append(_Pairs(samples[:, 0].long(), samples[:, 1].long(), samples[:, 2:5].to(dtype) @ cell))
        cache[key] = _Prepared(
            types=structure.types.to(device),
            positions=structure.positions.to(device=device, dtype=dtype),
            cell=cell,
            pbc=structure.pbc.to(device),
            volume=torch.abs(torch.det(cell)),
            neighbors=neighbors,
            pairs=pairs,
            values={n: v.to(device=device, dtype=dtype) for n, v in structure.values.items()},
            forces={n: v.to(device=device, dtype=dtype) for n, v in structure.forces.items()},
            stress={n: v.to(device=device, dtype=dtype) for n, v in structure.stress.items()},
        )
    return cache[key]


def structure_bytes(structure: Structure) -> int:
    """Memory held by a structure: its tensors, neighbour lists and training copies of them
    (a tensor shared by two of these counted once)."""
    tensors = [structure.types, structure.positions, structure.cell, structure.pbc]
    neighbors = list(getattr(structure, "neighbors", []))
    parts = [structure]
    for prepared in structure.__dict__.get("_prepared", {}).values():
        tensors += [prepared.types, prepared.positions, prepared.cell, prepared.pbc, prepared.volume]
        tensors += [t for pairs in prepared.pairs for t in (pairs.first, pairs.second, pairs.shifts)]
        neighbors += prepared.neighbors
        parts.append(prepared)
    tensors += [t for _, pairs in neighbors for t in (pairs.samples, pairs.vectors)]
    tensors += [t for part in parts for kind in (part.values, part.forces, part.stress) for t in kind.values()]
    sizes = {(t.device, t.data_ptr()): t.numel() * t.element_size() for t in tensors}
    return sum(sizes.values())


def _leaves(structure: _Prepared, derivatives: bool, stress: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The structure's positions (a leaf that requires grad for derivatives) and strain leaf."""
    key = (derivatives or stress, stress)
    if key not in structure.leaves:
        positions = structure.positions
        if key[0]:
            positions = positions.detach().requires_grad_(True)
        strain = None
        if stress:
            strain = torch.zeros((3, 3), dtype=positions.dtype, device=positions.device, requires_grad=True)
        structure.leaves[key] = (positions, strain)
    return structure.leaves[key]


def _system(structure: _Prepared, derivatives: bool, stress: bool) -> System:
    """The structure's system for this kind of batch, built on its leaves."""
    key = (derivatives or stress, stress)
    if key not in structure.systems:
        positions, strain = _leaves(structure, derivatives, stress)
        cell = structure.cell
        if strain is not None:
            deformation = torch.eye(3, dtype=cell.dtype, device=cell.device) + strain
            positions = positions @ deformation
            cell = cell @ deformation
        system = System(structure.types, positions, cell, structure.pbc)
        device = positions.device
        for options, pair_list in structure.neighbors:
            block = TensorBlock(
                pair_list.vectors.reshape(-1, 3, 1),
                Labels(_SAMPLE_NAMES, pair_list.samples, assume_unique=True),
                [Labels("xyz", torch.tensor([[0], [1], [2]], device=device))],
                Labels("distance", torch.tensor([[0]], device=device)),
            )
            if key[0]:  # linked to the positions (and strain) leaves, as metatomic's engines do
                register_autograd_neighbors(system, block)
            system.add_neighbor_list(options, block)
        structure.systems[key] = system
    return structure.systems[key]


def _flat_batch(
    prepared: list[_Prepared], derivatives: bool, stress: bool
) -> tuple[FlatBatch, torch.Tensor, torch.Tensor | None]:
    """The batch as flat tensors, its positions leaf for all atoms and its strain leaf."""
    leaf = torch.cat([s.positions for s in prepared])
    device, dtype = leaf.device, leaf.dtype
    if derivatives or stress:
        leaf.requires_grad_(True)
    strain = torch.zeros((len(prepared), 3, 3), dtype=dtype, device=device, requires_grad=True) if stress else None
    n_atoms = torch.tensor([len(s.types) for s in prepared], device=device)
    structure = torch.repeat_interleave(torch.arange(len(prepared), device=device), n_atoms)
    first_atom = torch.cumsum(n_atoms, 0) - n_atoms
    positions = leaf
    if strain is not None:  # a structure's strain deforms its positions and cell
        positions = leaf + torch.bmm(leaf[:, None, :], strain.index_select(0, structure))[:, 0]
    neighbors = []
    for k in range(len(prepared[0].pairs)):
        parts = [s.pairs[k] for s in prepared]
        counts = torch.tensor([len(p.first) for p in parts], device=device)
        offsets = torch.repeat_interleave(first_atom, counts)
        first = torch.cat([p.first for p in parts]) + offsets
        second = torch.cat([p.second for p in parts]) + offsets
        shifts = torch.cat([p.shifts for p in parts])
        vectors = leaf.index_select(0, second) - leaf.index_select(0, first) + shifts
        if strain is not None:
            owner = torch.repeat_interleave(torch.arange(len(prepared), device=device), counts)
            vectors = vectors + torch.bmm(vectors[:, None, :], strain.index_select(0, owner))[:, 0]
        neighbors.append(NeighborPairs(first, second, vectors))
    types = torch.cat([s.types for s in prepared])
    return FlatBatch(types, structure, len(prepared), positions, neighbors, {}), leaf, strain


def flat_batch_of(structure: Structure, dtype: torch.dtype, device: torch.device) -> FlatBatch:
    """One structure as a flat batch, outside any autograd graph (for ``Model.precompute``)."""
    return _flat_batch([_prepared(structure, dtype, device)], False, False)[0]


def make_batch(
    structures: list[Structure],
    dtype: torch.dtype,
    device: torch.device,
    forces: bool,
    stress: bool,
    flat: bool = True,
    keep: Callable[[list[Structure], FlatBatch], None] | None = None,
) -> Batch:
    """A batch of ``structures``; positions (and strains) are leaves that require grad when needed.

    A :class:`FlatBatch` by default, with one leaf for all positions (and one for all
    strains), to which ``keep`` may add the trainer's kept inputs; with ``flat=False``,
    one metatomic system per structure instead, for exported models.
    """
    prepared = [_prepared(structure, dtype, device) for structure in structures]
    systems = flat_batch = None
    if flat:
        flat_batch, leaf, strain = _flat_batch(prepared, forces, stress)
        leaves, strains = [leaf], [strain]
        if keep is not None:
            keep(structures, flat_batch)
    else:
        leaves, strains = (list(part) for part in zip(*(_leaves(s, forces, stress) for s in prepared)))
        systems = [_system(s, forces, stress) for s in prepared]

    present: dict[tuple[str, str], torch.Tensor] = {}
    references = {}
    for kind in ("values", "forces", "stress"):
        references[kind] = {}
        for name in sorted({n for s in prepared for n in getattr(s, kind)}):
            parts = [getattr(s, kind).get(name) for s in prepared]
            has = [part is not None for part in parts]
            if not all(has):  # a structure of another dataset (variants): zeros, left out of the errors
                present[(name, kind)] = torch.tensor(has, device=device)
                example = next(part for part in parts if part is not None)
                parts = [part if part is not None else _missing(example, s, kind) for part, s in zip(parts, prepared)]
            if kind == "stress":
                references[kind][name] = torch.stack(parts)
            else:  # (structures, width) per structure, (atoms, width) for per-atom values and forces
                references[kind][name] = torch.cat([_rows(part) for part in parts])
    return Batch(
        systems=systems,
        flat=flat_batch,
        positions=leaves,
        strains=strains if stress else None,
        volumes=torch.stack([s.volume for s in prepared]),
        n_atoms=torch.tensor([len(s.types) for s in prepared], device=device),
        values=references["values"],
        forces=references["forces"],
        stress=references["stress"],
        present=present,
    )


def _missing(example: torch.Tensor, structure: _Prepared, kind: str) -> torch.Tensor:
    """Zeros in place of the reference a structure lacks, shaped as it would be."""
    per_atom = kind == "forces" or example.dim() == 2
    shape = (len(structure.types), example.shape[-1]) if per_atom else example.shape
    return torch.zeros(shape, dtype=example.dtype, device=example.device)


def _rows(values: torch.Tensor) -> torch.Tensor:
    """A structure's values as rows: one for a per-structure target's (width,), one per atom."""
    return values.reshape(1, -1) if values.dim() == 1 else values


def batch_indices(n_items: int, batch_size: int, generator: torch.Generator | None) -> list[list[int]]:
    """Indices of each batch; shuffled when a generator is given."""
    order = torch.randperm(n_items, generator=generator) if generator is not None else torch.arange(n_items)
    order = order.tolist()
    return [order[i : i + batch_size] for i in range(0, n_items, batch_size)]


def packed_batches(order: list[int], n_atoms: np.ndarray, max_atoms: int) -> list[list[int]]:
    """``order`` cut into batches of at most ``max_atoms`` atoms, in order: a batch takes the
    next structure unless that would bring it above the limit (a structure larger than the
    limit makes a batch alone)."""
    batches, current, atoms = [], [], 0
    for index in order:
        size = int(n_atoms[index])
        if current and atoms + size > max_atoms:
            batches.append(current)
            current, atoms = [], 0
        current.append(index)
        atoms += size
    if current:
        batches.append(current)
    return batches


def share_by_atoms(indices: list[int], n_atoms: np.ndarray, rank: int, world_size: int) -> list[int]:
    """This rank's contiguous part of a packed batch: cut where the running atom count
    passes each rank's equal share, so that every rank gets about as many atoms."""
    if world_size == 1:
        return indices
    running = np.cumsum(n_atoms[indices])
    total = running[-1] if len(running) else 0
    cuts = [0] + [int(np.searchsorted(running, total * k / world_size, side="left")) + 1 for k in range(1, world_size)]
    cuts = [min(c, len(indices)) for c in cuts] + [len(indices)]
    return indices[cuts[rank] : max(cuts[rank], cuts[rank + 1])]
