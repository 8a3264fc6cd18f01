"""Turn structures into batches of metatomic systems, with neighbour lists cached.

Neighbour lists depend only on the positions, which do not change during training, so
they are computed once per structure and re-attached (with autograd registered, so that
forces and stress flow through them) every time the structure is used.
"""

from __future__ import annotations

from dataclasses import dataclass
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
    strains: torch.Tensor | None  # (n_systems, 3, 3) displacement for stress, or None
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
    system: System | None = None  # reused by every batch that needs no derivatives


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


def make_batch(
    structures: list[Structure],
    dtype: torch.dtype,
    device: torch.device,
    forces: bool,
    stress: bool,
    attach: Callable[[Structure, System], None] | None = None,
) -> Batch:
    """Build the systems of a batch; positions (and a strain) require grad when needed.

    ``attach`` may add data to each structure's system (the trainer's precomputed inputs).
    """
    strains = None
    if stress:
        strains = torch.zeros((len(structures), 3, 3), dtype=dtype, device=device, requires_grad=True)
    prepared = [_prepared(structure, dtype, device) for structure in structures]
    systems, leaves = [], []
    for i, structure in enumerate(prepared):
        if not (forces or stress) and structure.system is not None:
            if attach is not None:
                attach(structures[i], structure.system)
            systems.append(structure.system)
            leaves.append(structure.positions)
            continue
        positions, cell = structure.positions.detach(), structure.cell
        if forces or stress:
            positions.requires_grad_(True)
        leaves.append(positions)
        if strains is not None:
            deformation = torch.eye(3, dtype=dtype, device=device) + strains[i]
            positions = positions @ deformation
            cell = cell @ deformation
        system = System(structure.types, positions, cell, structure.pbc)
        for options, block in structure.neighbors:
            if forces or stress:  # a fresh alias: the autograd link is made anew for each batch
                block = TensorBlock(block.values.detach(), block.samples, block.components, block.properties)
                register_autograd_neighbors(system, block)
            system.add_neighbor_list(options, block)
        if attach is not None:
            attach(structures[i], system)
        if not (forces or stress):
            structure.system = system
        systems.append(system)

    return Batch(
        systems=systems,
        positions=leaves,
        strains=strains,
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
