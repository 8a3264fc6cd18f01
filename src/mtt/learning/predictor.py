"""Energies, forces and the force uncertainty of a trained model for many structures in
one pass: what the MD of a round moves with, and what the test set is scored by."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import ase
import numpy as np
import torch
from ase.data import chemical_symbols
from metatomic.torch import ModelOutput

from ..data.batching import compute_neighbor_lists, make_batch
from ..data.readers import Structure
from ..errors import CheckpointError, DataError
from ..inference import load_trained_model
from ..training.shallow_ensemble import member_gradients


@dataclass
class Prediction:
    energies: np.ndarray  # (structures,) eV
    forces: list[np.ndarray]  # (atoms, 3) eV/Å each
    uncertainty: np.ndarray  # (structures,) eV/Å: RMS over atoms and components of the members' spread


def structure_of(atoms: ase.Atoms) -> Structure:
    return Structure(
        types=torch.tensor(atoms.numbers, dtype=torch.int32),
        positions=torch.tensor(atoms.positions, dtype=torch.float64),
        cell=torch.tensor(np.asarray(atoms.cell), dtype=torch.float64),
        pbc=torch.tensor(atoms.pbc, dtype=torch.bool),
    )


def check_elements(frames: list[ase.Atoms], known: set[int], where: str) -> None:
    """Refuse structures with elements outside ``known``: the model knows nothing of them."""
    for index, atoms in enumerate(frames):
        unknown = sorted(set(atoms.numbers.tolist()) - known)
        if unknown:
            raise DataError(
                f"structure {index} of {where} contains {', '.join(chemical_symbols[z] for z in unknown)}, "
                "which the model was not trained on.",
                hint=f"The model knows {', '.join(chemical_symbols[z] for z in sorted(known))}: add structures "
                "with these elements to the training set of the options first.",
            )


class UncertainForces:
    """A model with an energy ensemble (trained with uncertainty): forces of its energy and
    of every member from one backward pass, the members' spread as the force uncertainty."""

    def __init__(self, path: str | Path):
        self.model = load_trained_model(path)
        if "energy" not in self.model.ensembles:
            raise CheckpointError(
                f"the model {path} has no force uncertainty (no energy_ensemble output).",
                hint="Train it with architecture.training.uncertainty: true, or fit one without training: "
                "`mtt calibrate model.ckpt options.yaml`.",
            )
        self.path = Path(path)
        self.requests = self.model.requested_neighbor_lists()
        self.outputs = {
            name: ModelOutput(unit="eV", sample_kind="system") for name in ("energy", self.model.ensembles["energy"])
        }

    def check_elements(self, frames: list[ase.Atoms], where: str) -> None:
        check_elements(frames, set(self.model.atomic_types), where)

    def __call__(self, structures: list[Structure], uncertainty: bool = True) -> Prediction:
        """Energies and forces; the force uncertainty too unless ``uncertainty`` is false
        (NaN then): the members' forces cost a backward pass each."""
        compute_neighbor_lists(structures, self.requests)
        batch = make_batch(structures, self.model.dtype, torch.device("cpu"), True, False, flat=False)
        outputs = self.outputs if uncertainty else {"energy": self.outputs["energy"]}
        computed = self.model(batch.systems, outputs)
        members = torch.cat([computed[name].block().values for name in outputs], 1)
        gradients = member_gradients(members, batch.positions)  # per structure: (1 + members, atoms, 3)
        energies = members[:, 0].detach().double().numpy()
        forces, spreads = [], []
        for gradient in gradients:
            gradient = gradient.detach().double()
            forces.append(-gradient[0].numpy())
            spread = gradient[1:].std(0) if uncertainty else torch.full((1,), torch.nan, dtype=torch.float64)
            spreads.append(float(torch.sqrt((spread**2).mean())))
        return Prediction(energies, forces, np.array(spreads))

    def predict_frames(self, frames: list[ase.Atoms], batch_size: int = 16, uncertainty: bool = True) -> Prediction:
        parts = [
            self([structure_of(a) for a in frames[i : i + batch_size]], uncertainty)
            for i in range(0, len(frames), batch_size)
        ]
        return Prediction(
            np.concatenate([p.energies for p in parts]),
            [f for p in parts for f in p.forces],
            np.concatenate([p.uncertainty for p in parts]),
        )
