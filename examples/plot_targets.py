"""
Learn values per atom and vectors
=================================

This example trains an equivariant message-passing model on two targets that are not an
energy: every atom's energy (a scalar per atom) and the forces learned directly, as a
vector per atom (not as derivatives of an energy), on the shipped EMT data. It then checks
what makes a vector target a vector: rotate the structure, and the predictions rotate with
it.

See :doc:`../targets` for every kind of target and the architectures that predict them.
"""

# %%
# The data
# --------
#
# ASE's EMT potential gives each atom's share of the energy. We label the structures of
# ``examples/data/emt_metals.xyz`` with it, as a per-atom column of a new extended XYZ file.

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import ase.io
import matplotlib.pyplot as plt
import numpy as np
from ase.calculators.emt import EMT
from metatomic.torch import ModelOutput
from metatomic_ase import MetatomicCalculator

HERE = Path.cwd()  # the examples/ folder, where the docs build runs the script
workdir = Path(tempfile.mkdtemp(prefix="mtt-targets-"))

frames = ase.io.read(HERE / "data" / "emt_metals.xyz", ":")
for atoms in frames:
    forces = atoms.get_forces()
    atoms.calc = EMT()
    atoms.arrays["atomic_energy"] = atoms.get_potential_energies()
    atoms.arrays["forces"] = forces
    atoms.calc = None
ase.io.write(workdir / "atomic_energies.xyz", frames)
print(f"{len(frames)} structures, {sum(len(a) for a in frames)} atoms")

# %%
# The options
# -----------
#
# ``sample_kind: atom`` reads one value per atom; ``type: {cartesian: {rank: 1}}`` makes
# the target a vector (x, y, z). SOAP-BPNN cannot predict a vector per atom (mtt says so,
# and names equivariant_mp), so this example uses equivariant_mp.
#
# .. literalinclude:: ../../../examples/targets.yaml
#    :language: yaml
#    :caption: examples/targets.yaml

shutil.copy(HERE / "targets.yaml", workdir / "targets.yaml")


def mtt(*arguments):
    """Run ``mtt`` with these arguments in ``workdir``, show what it prints."""
    result = subprocess.run([sys.executable, "-m", "mtt", *arguments], cwd=workdir, capture_output=True, text=True)
    print(result.stdout)
    if result.returncode != 0:
        raise RuntimeError(f"mtt failed:\n{result.stderr}")


mtt("train", "targets.yaml")

# %%
# Predictions
# -----------
#
# The exported model has one output per target, ``mtt::atomic_energy`` and
# ``mtt::direct_forces``, both per atom. ``MetatomicCalculator.run_model`` computes outputs
# other than the energy. We predict the test structures.

calculator = MetatomicCalculator(workdir / "model.pt", extensions_directory=workdir / "extensions")
requested = {
    "mtt::atomic_energy": ModelOutput(sample_kind="atom"),
    "mtt::direct_forces": ModelOutput(sample_kind="atom"),
}
run_folder = next((workdir / "outputs").glob("*/*"))
test = [int(line.split("\t")[1]) for line in (run_folder / "indices" / "test.txt").read_text().splitlines()]


def predict(atoms):
    """(atomic energies, forces) of the model for ``atoms``."""
    outputs = calculator.run_model(atoms, requested)
    energies = outputs["mtt::atomic_energy"].block().values[:, 0].detach().numpy()
    forces = outputs["mtt::direct_forces"].block().values[:, :, 0].detach().numpy()  # (atoms, xyz)
    return energies, forces


reference, predicted = ([], []), ([], [])
for index in test:
    atoms = frames[index]
    energies, forces = predict(atoms)
    for kept, values in zip(reference, (atoms.arrays["atomic_energy"], atoms.arrays["forces"])):
        kept.append(values.reshape(-1))
    for kept, values in zip(predicted, (energies, forces)):
        kept.append(values.reshape(-1))

fig, axes = plt.subplots(1, 2, figsize=(9, 4), constrained_layout=True)
for ax, title, unit, x, y in zip(
    axes, ("energy of each atom", "forces, learned directly"), ("eV", "eV/Å"), reference, predicted
):
    x, y = np.concatenate(x), np.concatenate(y)
    low, high = min(x.min(), y.min()), max(x.max(), y.max())
    ax.plot([low, high], [low, high], color="grey", linewidth=1)
    ax.scatter(x, y, s=6, alpha=0.5)
    rmse = np.sqrt(np.mean((x - y) ** 2))
    ax.set_title(f"{title}: RMSE {rmse:.3g} {unit}")
    ax.set_xlabel(f"EMT [{unit}]")
    ax.set_ylabel(f"predicted [{unit}]")
plt.show()

# %%
# The predictions rotate with the structure
# -----------------------------------------
#
# We rotate a structure and its cell about an arbitrary axis: the energies of its atoms do
# not change, and each predicted force vector turns by the same rotation, to rounding.

atoms = frames[test[0]].copy()
angle, axis = 0.8, np.array([1.0, 2.0, -0.5]) / np.linalg.norm([1.0, 2.0, -0.5])
cross = np.array([[0, -axis[2], axis[1]], [axis[2], 0, -axis[0]], [-axis[1], axis[0], 0]])
rotation = np.eye(3) + np.sin(angle) * cross + (1 - np.cos(angle)) * cross @ cross
rotated = atoms.copy()
rotated.positions = atoms.positions @ rotation.T
rotated.cell = atoms.cell.array @ rotation.T

energies, forces = predict(atoms)
rotated_energies, rotated_forces = predict(rotated)
print("largest change of an atom's energy:", np.abs(rotated_energies - energies).max(), "eV")
print("largest difference from the rotated forces:", np.abs(rotated_forces - forces @ rotation.T).max(), "eV/Å")

# %%
# Clean up
# --------
#
# The example leaves nothing behind.

shutil.rmtree(workdir)
