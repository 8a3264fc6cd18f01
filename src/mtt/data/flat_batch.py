"""The one input of every architecture's model: a batch of structures as flat tensors.

Training builds it from the structures of a batch (:func:`mtt.data.batching.make_batch`),
with the pair vectors computed from one positions leaf (and a strain, for stress) so that
forces and stress come from autograd; the exported model builds it from metatomic systems
(:func:`batch_of_systems`, inside TorchScript), with the pair vectors of the neighbour
lists that the simulation engine computed and linked to its positions and cell. An
architecture therefore writes one function of this input, and what it trains is what
ASE, LAMMPS and i-PI run.

No ``from __future__ import annotations`` here: TorchScript compiles these classes.
"""

from typing import Dict, List

import torch
from metatomic.torch import NeighborListOptions, System


class NeighborPairs:
    """One neighbour list of a batch: pairs of atoms numbered across the whole batch."""

    def __init__(self, first: torch.Tensor, second: torch.Tensor, vectors: torch.Tensor):
        #: (pairs,) int64: the atom each pair starts from, and the one it points to
        self.first = first
        self.second = second
        #: (pairs, 3): from ``first`` to ``second`` (with the cell shift of periodic images),
        #: differentiable with respect to the positions and the cell (or strain)
        self.vectors = vectors


class FlatBatch:
    """Several structures as flat tensors, atoms ordered structure by structure.

    ``neighbors`` holds one :class:`NeighborPairs` per neighbour list the model requested
    (``Model.requested_neighbor_lists``), in that order. ``data`` holds what the trainer
    keeps between epochs (``Model.precompute``), rows concatenated structure by
    structure; it is empty in exported models and for structures beyond the budget.
    """

    def __init__(
        self,
        types: torch.Tensor,
        structure: torch.Tensor,
        n_structures: int,
        positions: torch.Tensor,
        neighbors: List[NeighborPairs],
        data: Dict[str, torch.Tensor],
    ):
        #: (atoms,) atomic numbers
        self.types = types
        #: (atoms,) int64: the index of each atom's structure in the batch
        self.structure = structure
        self.n_structures = n_structures
        #: (atoms, 3): strained as the pair vectors are, when stress is computed
        self.positions = positions
        self.neighbors = neighbors
        self.data = data


def batch_of_systems(systems: List[System], requests: List[NeighborListOptions]) -> FlatBatch:
    """The flat batch of metatomic systems with the neighbour lists ``requests`` names."""
    device = systems[0].positions.device
    if len(systems) == 1:  # every MD step: no concatenation
        system = systems[0]
        alone: List[NeighborPairs] = []
        for options in requests:
            pairs = system.get_neighbor_list(options)
            samples = pairs.samples.values
            alone.append(NeighborPairs(samples[:, 0].long(), samples[:, 1].long(), pairs.values.reshape(-1, 3)))
        structure = torch.zeros(len(system), dtype=torch.long, device=device)
        return FlatBatch(system.types, structure, 1, system.positions, alone, {})

    n_atoms = torch.tensor([len(s) for s in systems], device=device)
    first_atom = torch.cumsum(n_atoms, 0) - n_atoms
    neighbors: List[NeighborPairs] = []
    for options in requests:
        firsts: List[torch.Tensor] = []
        seconds: List[torch.Tensor] = []
        vectors: List[torch.Tensor] = []
        for index, system in enumerate(systems):
            pairs = system.get_neighbor_list(options)
            samples = pairs.samples.values
            firsts.append(samples[:, 0].long() + first_atom[index])
            seconds.append(samples[:, 1].long() + first_atom[index])
            vectors.append(pairs.values.reshape(-1, 3))
        neighbors.append(NeighborPairs(torch.cat(firsts), torch.cat(seconds), torch.cat(vectors)))
    structure = torch.repeat_interleave(torch.arange(len(systems), device=device), n_atoms)
    types = torch.cat([s.types for s in systems])
    positions = torch.cat([s.positions for s in systems])
    return FlatBatch(types, structure, len(systems), positions, neighbors, {})
