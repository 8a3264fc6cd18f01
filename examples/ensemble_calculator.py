"""An ASE calculator that gives, beside a model's energy and forces, its force uncertainty.

metatomic's own calculator computes forces of ``energy`` only; the spread of the forces
of the ``energy_ensemble`` members that mtt exports (last-layer weights sampled from their
posterior) is the force uncertainty. This calculator runs the model once per step and
takes the forces of the energy and of every member in one batched backward pass. It needs
metatomic and vesin, not mtt.

    atoms.calc = EnsembleCalculator("model.pt", extensions_directory="extensions")
    atoms.get_forces()
    atoms.calc.results["forces_uncertainty"]  # (atoms,): each atom's, in eV/Å
    atoms.calc.results["force_uncertainty"]  # the structure's: RMS over its atoms
"""

from __future__ import annotations

import numpy as np
import torch
from ase.calculators.calculator import Calculator, all_changes
from metatomic.torch import ModelEvaluationOptions, ModelOutput, load_atomistic_model, systems_to_torch
from vesin.metatomic import neighbor_lists_for_model

try:  # featomic's operators must be registered before a SOAP-BPNN model loads
    import featomic.torch  # noqa: F401
except ImportError:
    pass


class EnsembleCalculator(Calculator):
    implemented_properties = ["energy", "forces", "forces_uncertainty", "force_uncertainty"]

    def __init__(self, path: str, extensions_directory: str | None = None, variant: str = ""):
        super().__init__()
        self.model = load_atomistic_model(path, extensions_directory=extensions_directory)
        suffix = f"/{variant}" if variant else ""
        self.energy, self.ensemble = "energy" + suffix, "energy_ensemble" + suffix
        if self.ensemble not in self.model.capabilities().outputs:
            raise ValueError(f"{path} has no {self.ensemble} output: train it with mtt's uncertainty on")
        self.dtype = getattr(torch, self.model.capabilities().dtype)
        self.options = ModelEvaluationOptions(
            length_unit="angstrom",
            outputs={name: ModelOutput(sample_kind="system") for name in (self.energy, self.ensemble)},
        )
        self.neighbors = neighbor_lists_for_model("angstrom", self.model)

    def calculate(self, atoms=None, properties=("energy",), system_changes=all_changes) -> None:  # noqa: ANN001
        super().calculate(atoms, properties, system_changes)
        system = systems_to_torch(self.atoms, dtype=self.dtype, positions_requires_grad=True)
        for calculator in self.neighbors:
            calculator.add_neighbor_list([system])
        outputs = self.model([system], self.options, check_consistency=False)
        # column 0: the energy, then the members; row k of the gradient: column k's
        values = torch.cat([outputs[self.energy].block().values, outputs[self.ensemble].block().values], 1)
        one_hot = torch.eye(values.shape[1], dtype=values.dtype)[:, None, :]
        (gradients,) = torch.autograd.grad(values, [system.positions], grad_outputs=one_hot, is_grads_batched=True)
        forces = -gradients.detach().double().numpy()
        spread = forces[1:].std(0, ddof=1)  # (atoms, 3)
        self.results = {
            "energy": float(values[0, 0].detach()),
            "forces": forces[0],
            "forces_uncertainty": np.sqrt((spread**2).mean(1)),
            "force_uncertainty": float(np.sqrt((spread**2).mean())),
        }
