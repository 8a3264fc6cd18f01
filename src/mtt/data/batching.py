"""Turn structures into batches for the model, with neighbour lists cached.

Neighbour lists depend only on the positions, which do not change during training, so
they are computed once per structure. A batch comes in one of two forms:

- one metatomic ``System`` per structure, what exported models see. Each structure's
  system is built once (building one with its neighbour list is not cheap) and
  reused by every batch. When forces or stress are trained its positions (and a strain,
  for stress) are leaves that require grad, and the autograd link from them to the
  neighbour vectors is made once and kept: differentiate through a batch with
  ``torch.autograd.grad(..., retain_graph=True)`` or ``backward(inputs=weights)``, which
  leave that link in place;
- flat tensors of the whole batch (:class:`FlatBatch`), for models that take them
  (``Model.takes_flat_batches``): the atoms' types and the pairs of every requested
  neighbour list, numbered across the batch, with their vectors computed from the same
  leaves in a few operations. Per-structure objects are a large part of a
  force-training step of small structures; these cost nothing per structure.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Callable

import torch
from metatensor.torch import TensorBlock
from metatomic.torch import NeighborListOptions, System, register_autograd_neighbors
from vesin.metatomic import NeighborList

from .readers import Structure


def compute_neighbor_lists(structures: list[Structure], requests: list[NeighborListOptions]) -> None:
    """Compute and store on each structure the neighbour lists the model asks for."""
    calculators = [NeighborList(options, "angstrom") for options in requests]
    for structure in structures:
        system = System(structure.types, structure.positions, structure.cell, structure.pbc)
        structure.neighbors = [
            (options, calculator.compute(system)) for options, calculator in zip(requests, calculators)
        ]


@dataclass
class PairList:
    """One neighbour list of a whole batch: atoms numbered across the batch."""

    first: torch.Tensor  # (pairs,) int64
    second: torch.Tensor  # (pairs,) int64
    vectors: torch.Tensor  # (pairs, 3), from first to second, differentiable w.r.t. the leaves


@dataclass
class _Pairs:
    """A structure's neighbour list as flat tensors: local atom numbers and cell shifts."""

    first: torch.Tensor
    second: torch.Tensor
    shifts: torch.Tensor  # (pairs, 3) cell-shift vectors: vector = r[second] - r[first] + shift


@dataclass
class FlatBatch:
    """A batch as flat tensors, for models that take them (``Model.per_atom_outputs_of_batch``).

    ``positions`` (strained as the systems' positions are) and ``pairs`` (one
    :class:`PairList` per neighbour list the model requested, in its order) are made when
    first read, so a model that finds what it needs in ``data`` costs nothing for them.
    """

    types: torch.Tensor  # (atoms,) atomic numbers, structure by structure
    structure: torch.Tensor  # (atoms,) the index of each atom's structure in the batch
    n_structures: int
    leaf: torch.Tensor  # (atoms, 3) the positions that forces are taken against
    strain: torch.Tensor | None  # (structures, 3, 3) the displacements that stress is taken against
    neighbors: list[list[_Pairs]]  # per requested neighbour list, each structure's pairs
    data: dict[str, torch.Tensor] = field(default_factory=dict)  # kept inputs, rows structure by structure

    @functools.cached_property
    def positions(self) -> torch.Tensor:
        if self.strain is None:
            return self.leaf
        return self.leaf + torch.bmm(self.leaf[:, None, :], self.strain.index_select(0, self.structure))[:, 0]

    @functools.cached_property
    def pairs(self) -> list[PairList]:
        device = self.leaf.device
        n_atoms = torch.bincount(self.structure, minlength=self.n_structures)
        first_atom = torch.cumsum(n_atoms, 0) - n_atoms
        pair_lists = []
        for parts in self.neighbors:
            counts = torch.tensor([len(p.first) for p in parts], device=device)
            offsets = torch.repeat_interleave(first_atom, counts)
            first = torch.cat([p.first for p in parts]) + offsets
            second = torch.cat([p.second for p in parts]) + offsets
            shifts = torch.cat([p.shifts for p in parts])
            vectors = self.leaf.index_select(0, second) - self.leaf.index_select(0, first) + shifts
            if self.strain is not None:  # a structure's strain deforms its vectors as its cell
                owner = torch.repeat_interleave(torch.arange(self.n_structures, device=device), counts)
                vectors = vectors + torch.bmm(vectors[:, None, :], self.strain.index_select(0, owner))[:, 0]
            pair_lists.append(PairList(first, second, vectors))
        return pair_lists


@dataclass
class Batch:
    """Several structures ready for the model, and their reference values."""

    systems: list[System] | None  # one per structure, unless the batch is flat
    flat: FlatBatch | None
    # the leaves forces are taken against: concatenated, all atoms' positions (one per
    # structure, or one for a flat batch)
    positions: list[torch.Tensor]
    # the leaves stress is taken against, for stress: concatenated, (n_systems, 3, 3)
    # displacements (a (3, 3) per structure, or one for a flat batch)
    strains: list[torch.Tensor] | None
    volumes: torch.Tensor  # (n_systems,) cell volumes, for stress
    n_atoms: torch.Tensor  # (n_systems,)
    values: dict[str, torch.Tensor]  # name -> (n_systems,)
    forces: dict[str, torch.Tensor]  # name -> (n_atoms_total, 3)
    stress: dict[str, torch.Tensor]  # name -> (n_systems, 3, 3)

    def __len__(self) -> int:
        return len(self.n_atoms)


@dataclass
class _Prepared:
    """A structure's tensors in the training dtype and device, made once and reused."""

    types: torch.Tensor
    positions: torch.Tensor
    cell: torch.Tensor
    pbc: torch.Tensor
    volume: torch.Tensor
    neighbors: list[tuple[NeighborListOptions, TensorBlock]]
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
            (
                options,
                TensorBlock(
                    block.values.to(device=device, dtype=dtype),
                    block.samples.to(device),
                    [c.to(device) for c in block.components],
                    block.properties.to(device),
                ),
            )
            for options, block in structure.neighbors
        ]
        pairs = []
        for _, block in neighbors:
            samples = block.samples.values
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
        for options, block in structure.neighbors:
            if key[0]:  # an alias, so that the cached block itself stays out of the graph
                block = TensorBlock(block.values.detach(), block.samples, block.components, block.properties)
                register_autograd_neighbors(system, block)
            system.add_neighbor_list(options, block)
        structure.systems[key] = system
    return structure.systems[key]


def plain_system(structure: Structure, dtype: torch.dtype, device: torch.device) -> System:
    """A new system of ``structure`` with its neighbour lists, outside any autograd graph."""
    prepared = _prepared(structure, dtype, device)
    system = System(prepared.types, prepared.positions, prepared.cell, prepared.pbc)
    for options, block in prepared.neighbors:
        system.add_neighbor_list(options, block)
    return system


def _flat_batch(prepared: list[_Prepared], derivatives: bool, stress: bool) -> FlatBatch:
    """The batch as flat tensors, with one positions leaf for all atoms and one strain leaf."""
    positions = torch.cat([s.positions for s in prepared])
    device, dtype = positions.device, positions.dtype
    if derivatives or stress:
        positions.requires_grad_(True)
    strain = torch.zeros((len(prepared), 3, 3), dtype=dtype, device=device, requires_grad=True) if stress else None
    n_atoms = torch.tensor([len(s.types) for s in prepared], device=device)
    structure = torch.repeat_interleave(torch.arange(len(prepared), device=device), n_atoms)
    neighbors = [[s.pairs[k] for s in prepared] for k in range(len(prepared[0].pairs))]
    types = torch.cat([s.types for s in prepared])
    return FlatBatch(types, structure, len(prepared), positions, strain, neighbors)


def make_batch(
    structures: list[Structure],
    dtype: torch.dtype,
    device: torch.device,
    forces: bool,
    stress: bool,
    attach: Callable[[Structure, System], None] | None = None,
    flat: bool = False,
    keep: Callable[[list[Structure], FlatBatch, Callable[[Structure], System]], None] | None = None,
) -> Batch:
    """A batch of ``structures``; positions (and strains) are leaves that require grad when needed.

    With ``flat`` the batch holds a :class:`FlatBatch` instead of systems, and one leaf for
    all positions (and one for all strains). ``attach`` may add data to each structure's
    system, ``keep`` to a flat batch (the trainer's kept inputs; it gets a function that
    makes a structure's system, for computing them).
    """
    prepared = [_prepared(structure, dtype, device) for structure in structures]
    systems = flat_batch = None
    if flat:
        flat_batch = _flat_batch(prepared, forces, stress)
        leaves, strains = [flat_batch.leaf], [flat_batch.strain]
        if keep is not None:
            keep(structures, flat_batch, lambda structure: plain_system(structure, dtype, device))
    else:
        leaves, strains = (list(part) for part in zip(*(_leaves(s, forces, stress) for s in prepared)))
        systems = []
        for structure, prepared_structure in zip(structures, prepared):
            system = _system(prepared_structure, forces, stress)
            if attach is not None:
                attach(structure, system)
            systems.append(system)

    return Batch(
        systems=systems,
        flat=flat_batch,
        positions=leaves,
        strains=strains if stress else None,
        volumes=torch.stack([s.volume for s in prepared]),
        n_atoms=torch.tensor([len(s.types) for s in prepared], device=device),
        values={n: torch.cat([s.values[n].reshape(-1) for s in prepared]) for n in prepared[0].values},
        forces={n: torch.cat([s.forces[n] for s in prepared]) for n in prepared[0].forces},
        stress={n: torch.stack([s.stress[n] for s in prepared]) for n in prepared[0].stress},
    )


def batch_indices(n_items: int, batch_size: int, generator: torch.Generator | None) -> list[list[int]]:
    """Indices of each batch; shuffled when a generator is given."""
    order = torch.randperm(n_items, generator=generator) if generator is not None else torch.arange(n_items)
    order = order.tolist()
    return [order[i : i + batch_size] for i in range(0, n_items, batch_size)]
