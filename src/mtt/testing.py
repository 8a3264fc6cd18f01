"""The test suite every architecture passes; plug-in architectures reuse it.

Subclass :class:`ArchitectureTests` in a pytest module and set ``name`` (and ``hypers``
for non-default hyperparameters)::

    from mtt.testing import ArchitectureTests

    class TestMyArchitecture(ArchitectureTests):
        name = "my_architecture"

The suite builds the model on a few EMT structures of Cu, Au and Pt (made on the fly with
ASE) and checks what the framework relies on: extensive, permutation- and
rotation-invariant energies; forces and stress equal to finite differences of the energy;
the same numbers and weight gradients in training (eager, flat batches, with or without
the kept inputs) as in the exported model (TorchScript, metatomic systems); per-atom
outputs that add up to the total; and an export that gives the same numbers in a fresh
Python process without mtt.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from .architectures import load
from .data.batching import compute_neighbor_lists, flat_batch_of, make_batch
from .data.dataset import DatasetInfo
from .data.readers import Structure, TargetInfo
from .schema import parse_options
from .training.predictions import predict


def emt_structures(count: int = 4, seed: int = 0) -> list[Structure]:
    """Small rattled and strained fcc cells labelled with ASE's EMT."""
    from ase.build import bulk
    from ase.calculators.emt import EMT

    rng = np.random.default_rng(seed)
    structures = []
    for i in range(count):
        atoms = bulk(["Cu", "Au", "Pt"][i % 3], "fcc", a=3.8, cubic=True)
        if i % 2:
            atoms.numbers[0] = 78 if atoms.numbers[0] != 78 else 29
        atoms.set_cell(atoms.cell.array @ (np.eye(3) + 0.02 * rng.standard_normal((3, 3))), scale_atoms=True)
        atoms.positions += 0.08 * rng.standard_normal(atoms.positions.shape)
        atoms.calc = EMT()
        structure = Structure(
            types=torch.tensor(atoms.numbers, dtype=torch.int32),
            positions=torch.tensor(atoms.positions),
            cell=torch.tensor(atoms.cell.array),
            pbc=torch.tensor(atoms.pbc),
        )
        structure.values["energy"] = torch.tensor([atoms.get_potential_energy()], dtype=torch.float64)
        structure.forces["energy"] = torch.tensor(atoms.get_forces())
        structure.stress["energy"] = torch.tensor(atoms.get_stress(voigt=False))
        structures.append(structure)
    return structures


class ArchitectureTests:
    """Contract tests for one architecture; subclasses set ``name`` and ``hypers``."""

    name: str = ""
    hypers: dict[str, Any] = {}

    @pytest.fixture
    def info(self) -> DatasetInfo:
        target = TargetInfo(name="energy", quantity="energy", unit="eV", forces=True, stress=True)
        return DatasetInfo(atomic_types=[29, 78, 79], targets={"energy": target})

    @pytest.fixture
    def model(self, info) -> torch.nn.Module:
        torch.manual_seed(0)
        architecture = load(self.name)
        hypers = parse_options(architecture.hypers_class, self.hypers, "architecture.model")
        model = architecture.model_class(hypers, info).to(torch.float64)
        # a non-trivial baseline, so the checks also cover it
        model.composition.weights[:, 0] = torch.tensor([-0.5, -1.0, -1.5], dtype=torch.float64)
        return model

    def _predict(self, model, info, structures):
        compute_neighbor_lists(structures, model.requested_neighbor_lists())
        batch = make_batch(structures, torch.float64, torch.device("cpu"), True, True)
        return predict(model, batch, info, create_graph=False)

    def test_batch_equals_single_structures(self, model, info):
        structures = emt_structures()
        together = self._predict(model, info, structures)
        for i, structure in enumerate(structures):
            alone = self._predict(model, info, [structure])
            torch.testing.assert_close(alone.values["energy"], together.values["energy"][i : i + 1])

    def test_energy_is_invariant(self, model, info):
        structure = emt_structures(1)[0]
        reference = self._predict(model, info, [structure]).values["energy"]
        permutation = torch.randperm(len(structure), generator=torch.Generator().manual_seed(1))
        rotation = _rotation(axis=(1.0, 2.0, 3.0), angle=0.7)
        moved = Structure(
            types=structure.types[permutation],
            positions=structure.positions[permutation] @ rotation.T,
            cell=structure.cell @ rotation.T,
            pbc=structure.pbc,
        )
        torch.testing.assert_close(self._predict(model, info, [moved]).values["energy"], reference)

    def test_forces_and_stress_are_energy_derivatives(self, model, info):
        structure = emt_structures(1)[0]
        predicted = self._predict(model, info, [structure])
        step = 1e-5

        def energy(positions, cell):
            moved = Structure(structure.types, positions, cell, structure.pbc)
            return float(self._predict(model, info, [moved]).values["energy"].detach())

        for atom, axis in [(0, 0), (1, 2)]:
            plus, minus = structure.positions.clone(), structure.positions.clone()
            plus[atom, axis] += step
            minus[atom, axis] -= step
            finite = -(energy(plus, structure.cell) - energy(minus, structure.cell)) / (2 * step)
            assert abs(finite - float(predicted.forces["energy"][atom, axis])) < 1e-6
        strain = torch.zeros(3, 3, dtype=torch.float64)
        strain[0, 1] = strain[1, 0] = step
        deformed = [
            energy(
                structure.positions @ (torch.eye(3) + sign * strain).T.to(torch.float64),
                structure.cell @ (torch.eye(3) + sign * strain).T.to(torch.float64),
            )
            for sign in (1, -1)
        ]
        volume = abs(float(torch.det(structure.cell)))
        finite = (deformed[0] - deformed[1]) / (2 * step) / volume / 2
        assert abs(finite - float(predicted.stress["energy"][0, 0, 1])) < 1e-6

    def test_precomputed_inputs_change_nothing(self, model, info):
        """What the trainer keeps from ``Model.precompute`` gives the same values and derivatives,
        also when the budget keeps only some structures of a batch."""
        from .training.cache import PrecomputedInputs

        structures = emt_structures(3)
        compute_neighbor_lists(structures, model.requested_neighbor_lists())

        def flat(structure):
            return flat_batch_of(structure, torch.float64, torch.device("cpu"))

        for derivatives in (False, True):
            target = TargetInfo("energy", "energy", "eV", forces=derivatives, stress=derivatives)
            targets = DatasetInfo(info.atomic_types, {"energy": target})

            def run(keep, derivatives=derivatives, targets=targets):
                batch = make_batch(structures, torch.float64, torch.device("cpu"), derivatives, derivatives, keep=keep)
                predictions = predict(model, batch, targets, create_graph=derivatives)
                loss = predictions.values["energy"].square().sum()
                if derivatives:
                    loss = (
                        loss + predictions.forces["energy"].square().sum() + predictions.stress["energy"].square().sum()
                    )
                weights = [p for p in model.parameters() if p.requires_grad]
                gradients = torch.autograd.grad(loss, weights, allow_unused=True) if weights else []
                return predictions, [g for g in gradients if g is not None]

            kept = PrecomputedInputs(model, derivatives, 100, flat)
            results = [run(None), run(kept.keep), run(kept.keep)]  # computed, then kept, then reused
            # a budget for one structure: the others' data are computed at every step
            one = model.precompute(flat(structures[0]), derivatives)
            size = sum(values.numel() * values.element_size() for values in one.values()) if one else 0
            partial = PrecomputedInputs(model, derivatives, 1.5 * size / 1024**2, flat)
            results += [run(partial.keep), run(partial.keep)]
            assert len(partial.kept) == (1 if one else 0)
            for predictions, gradients in results[1:]:
                torch.testing.assert_close(predictions.values, results[0][0].values, rtol=1e-12, atol=1e-12)
                torch.testing.assert_close(predictions.forces, results[0][0].forces, rtol=1e-12, atol=1e-12)
                torch.testing.assert_close(predictions.stress, results[0][0].stress, rtol=1e-12, atol=1e-12)
                torch.testing.assert_close(gradients, results[0][1], rtol=1e-10, atol=1e-12)

    def test_training_equals_the_exported_model(self, model, info):
        """The model as trained (eager, on the trainer's flat batches) and as exported
        (TorchScript, on metatomic systems) give the same values, forces and stress, and
        the same gradients of a force and stress loss with respect to the weights."""
        structures = emt_structures(3)
        compute_neighbor_lists(structures, model.requested_neighbor_lists())
        scripted = torch.jit.script(model)
        results = []
        for module, flat in ((model, True), (scripted, False)):
            batch = make_batch(structures, torch.float64, torch.device("cpu"), True, True, flat=flat)
            predictions = predict(module, batch, info, create_graph=True)
            loss = (
                predictions.values["energy"].square().sum()
                + predictions.forces["energy"].square().sum()
                + predictions.stress["energy"].square().sum()
            )
            weights = [p for p in module.parameters() if p.requires_grad]
            gradients = torch.autograd.grad(loss, weights, allow_unused=True) if weights else []
            results.append((predictions, [g for g in gradients if g is not None]))
        (trained, gradients), (exported, expected) = results
        torch.testing.assert_close(trained.values, exported.values, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(trained.forces, exported.forces, rtol=1e-10, atol=1e-12)
        torch.testing.assert_close(trained.stress, exported.stress, rtol=1e-10, atol=1e-12)
        torch.testing.assert_close(gradients, expected, rtol=1e-9, atol=1e-12)

    def test_per_atom_outputs_add_up(self, model, info):
        from metatomic.torch import ModelOutput

        structures = emt_structures(2)
        compute_neighbor_lists(structures, model.requested_neighbor_lists())
        systems = make_batch(structures, torch.float64, torch.device("cpu"), False, False, flat=False).systems
        total = model(systems, {"energy": ModelOutput(sample_kind="system")})["energy"].block().values
        atoms = model(systems, {"energy": ModelOutput(sample_kind="atom")})["energy"].block()
        per_system = torch.zeros_like(total).index_add(0, atoms.samples.column("system"), atoms.values)
        torch.testing.assert_close(per_system, total)
        for k, system in enumerate(systems):  # one system, as in every MD step, takes a shorter path
            alone = model([system], {"energy": ModelOutput(sample_kind="system")})["energy"].block()
            assert alone.samples.values.tolist() == [[0]]
            torch.testing.assert_close(alone.values, total[k : k + 1])

        # engines that hand out atoms to ranks ask for some of them (selected_atoms)
        from metatensor.torch import Labels

        chosen = torch.tensor([[0, 1], [1, 0], [1, 2]], dtype=torch.int32)
        selected = model(systems, {"energy": ModelOutput(sample_kind="atom")}, Labels(["system", "atom"], chosen))
        block = selected["energy"].block()
        assert block.samples.values.tolist() == chosen.tolist()
        rows = [int(i) for i, sample in enumerate(atoms.samples.values.tolist()) if sample in chosen.tolist()]
        torch.testing.assert_close(block.values, atoms.values[rows])

    def test_export_runs_in_a_fresh_process(self, model, info, tmp_path: Path):
        from .export import export_model

        path = export_model(model, info, load(self.name), tmp_path / "model.pt")
        structure = emt_structures(1)[0]
        expected = self._predict(model, info, [structure])
        script = textwrap.dedent(
            f"""
            import sys, ase, numpy as np
            from metatomic_ase import MetatomicCalculator
            atoms = ase.Atoms(numbers={structure.types.tolist()}, positions={structure.positions.tolist()},
                              cell={structure.cell.tolist()}, pbc=True)
            atoms.calc = MetatomicCalculator({str(path)!r}, extensions_directory={str(tmp_path / "extensions")!r})
            print(atoms.get_potential_energy())
            print(*atoms.get_forces().reshape(-1))
            assert "mtt" not in sys.modules
            """
        )
        result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
        assert result.returncode == 0, result.stderr
        lines = result.stdout.split("\n")
        assert abs(float(lines[0]) - float(expected.values["energy"].detach())) < 1e-8
        forces = np.array(lines[1].split(), dtype=float)
        np.testing.assert_allclose(forces, expected.forces["energy"].reshape(-1).numpy(), atol=1e-8)


def _rotation(axis: tuple[float, float, float], angle: float) -> torch.Tensor:
    """Rotation matrix about ``axis`` (Rodrigues' formula)."""
    x, y, z = np.asarray(axis) / np.linalg.norm(axis)
    cross = np.array([[0.0, -z, y], [z, 0.0, -x], [-y, x, 0.0]])
    return torch.tensor(np.eye(3) + np.sin(angle) * cross + (1 - np.cos(angle)) * cross @ cross)
