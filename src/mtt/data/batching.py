"""Turn structures into batches of metatomic systems, with neighbour lists cached.

Neighbour lists depend only on the positions, which do not change during training, so
they are computed once per structure. The metatomic system of each structure is built
once too (building one with its neighbour list costs about 0.3 ms, a sixth of a small
force-training step) and reused by every batch. When forces or stress are trained its
positions (and a strain, for stress) are leaves that require grad, and the autograd link
from them to the neighbour vectors is made once and kept: differentiate through a batch
with ``torch.autograd.grad(..., retain_graph=True)`` or ``backward(inputs=weights)``,
which leave that link in place.
"""

from __future__ import annotations

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
            (options, calculator.compute(system))
            for options, calculator in zip(requests, calculators)
        ]


@dataclass
class Batch:
    """Several structures ready for the model, and their reference values."""

    systems: list[System]
    positions: list[torch.Tensor]  # the leaves forces are taken against
    strains: list[torch.Tensor] | None  # a (3, 3) displacement per system for stress, or None
    n_atoms: torch.Tensor  # (n_systems,)
    values: dict[str, torch.Tensor]  # name -> (n_systems,)
    forces: dict[str, torch.Tensor]  # name -> (n_atoms_total, 3)
    stress: dict[str, torch.Tensor]  # name -> (n_systems, 3, 3)


@dataclass
class _Prepared:
    """A structure's tensors in the training dtype and device, made once and reused."""

    types: torch.Tensor
    positions: torch.Tensor
    cell: torch.Tensor
    pbc: torch.Tensor
    neighbors: list[tuple[NeighborListOptions, TensorBlock]]
    values: dict[str, torch.Tensor]
    forces: dict[str, torch.Tensor]
    stress: dict[str, torch.Tensor]
    # (forces or stress, stress) -> the system, its positions leaf and its strain leaf
    systems: dict[tuple[bool, bool], tuple[System, torch.Tensor, torch.Tensor | None]] = field(default_factory=dict)


def _prepared(structure: Structure, dtype: torch.dtype, device: torch.device) -> _Prepared:
    cache = structure.__dict__.setdefault("_prepared", {})
    key = (dtype, str(device), id(structure.neighbors))  # new neighbour lists, new tensors
    if key not in cache:
        cache.clear()  # one training dtype and device at a time
        cache[key] = _Prepared(
            types=structure.types.to(device),
            positions=structure.positions.to(device=device, dtype=dtype),
            cell=structure.cell.to(device=device, dtype=dtype),
            pbc=structure.pbc.to(device),
            neighbors=[
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
            ],
            values={n: v.to(device=device, dtype=dtype) for n, v in structure.values.items()},
            forces={n: v.to(device=device, dtype=dtype) for n, v in structure.forces.items()},
            stress={n: v.to(device=device, dtype=dtype) for n, v in structure.stress.items()},
        )
    return cache[key]


def _system(structure: _Prepared, derivatives: bool, stress: bool) -> tuple[System, torch.Tensor, torch.Tensor | None]:
    """The structure's system for this kind of batch, its positions leaf and strain leaf."""
    key = (derivatives or stress, stress)
    if key not in structure.systems:
        positions, cell, strain = structure.positions, structure.cell, None
        leaf = positions
        if key[0]:
            leaf = positions.detach().requires_grad_(True)
            positions = leaf
        if stress:
            strain = torch.zeros((3, 3), dtype=cell.dtype, device=cell.device, requires_grad=True)
            deformation = torch.eye(3, dtype=cell.dtype, device=cell.device) + strain
            positions = leaf @ deformation
            cell = cell @ deformation
        system = System(structure.types, positions, cell, structure.pbc)
        for options, block in structure.neighbors:
            if key[0]:  # an alias, so that the cached block itself stays out of the graph
                block = TensorBlock(block.values.detach(), block.samples, block.components, block.properties)
                register_autograd_neighbors(system, block)
            system.add_neighbor_list(options, block)
        structure.systems[key] = (system, leaf, strain)
    return structure.systems[key]


def make_batch(
    structures: list[Structure],
    dtype: torch.dtype,
    device: torch.device,
    forces: bool,
    stress: bool,
    attach: Callable[[Structure, System], None] | None = None,
) -> Batch:
    """The systems of a batch; positions (and strains) are leaves that require grad when needed.

    ``attach`` may add data to each structure's system (the trainer's precomputed inputs).
    """
    prepared = [_prepared(structure, dtype, device) for structure in structures]
    systems, leaves, strains = [], [], []
    for structure, prepared_structure in zip(structures, prepared):
        system, leaf, strain = _system(prepared_structure, forces, stress)
        if attach is not None:
            attach(structure, system)
        systems.append(system)
        leaves.append(leaf)
        strains.append(strain)

    return Batch(
        systems=systems,
        positions=leaves,
        strains=strains if stress else None,
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
