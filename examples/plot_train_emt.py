"""
Train a potential and look at its errors
========================================

This example trains a SOAP-BPNN potential for Cu, Au and Pt with ``mtt train``, plots its
learning curve from the metrics of the run, and loads the exported model in ASE to compare
its predictions on the test set with the reference energies and forces.

The dataset, ``examples/data/emt_metals.xyz``, holds 100 strained and rattled cells, bulk
and alloys and slabs, labelled with ASE's EMT potential (the script next to it made it).
"""

# %%
# The options file
# ----------------
#
# ``train_emt.yaml``, next to this script, is ``options.yaml`` of the quick start made
# quicker: a smaller SOAP descriptor, 15 epochs, and no stress.
#
# .. literalinclude:: ../../../examples/train_emt.yaml
#    :language: yaml
#    :caption: examples/train_emt.yaml

import csv
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import ase.io
import matplotlib.pyplot as plt
import numpy as np
from metatomic_ase import MetatomicCalculator

# the examples/ folder: run the script from there, as the docs build does
HERE = Path.cwd()
options = HERE / "train_emt.yaml"

# %%
# Train
# -----
#
# We train in a new, empty folder, as one would for a real run: ``mtt train`` writes its
# run folder under ``outputs/`` of the current folder and the model to ``model.pt``. Paths
# in the options file are taken from the folder of that file, so it can stay where it is.
#
# On a terminal, this is ``mtt train /path/to/examples/train_emt.yaml``; here we call
# the same command from Python.

workdir = Path(tempfile.mkdtemp(prefix="mtt-example-"))


def mtt(*arguments):
    """Run ``mtt`` with these arguments in ``workdir``, show what it prints."""
    command = [sys.executable, "-m", "mtt", *arguments]
    result = subprocess.run(command, cwd=workdir, capture_output=True, text=True)
    print(result.stdout)
    if result.returncode != 0:
        raise RuntimeError(f"mtt failed:\n{result.stderr}")


mtt("train", str(options))

# %%
# The run folder
# --------------
#
# Everything about the run is in ``outputs/<date>/<time>/`` (here without the files of
# ``extensions/``, the compiled code beside the model):

run_folder = next((workdir / "outputs").glob("*/*"))
for path in sorted(run_folder.rglob("*")):
    if "extensions" not in path.parts:
        print(path.relative_to(workdir))

# %%
# Learning curve
# --------------
#
# ``metrics.csv`` has one row per epoch. Its column names carry the units; energies are
# shown per atom and in meV, as in the lines printed during training. mtt draws it into
# ``learning_curve.png`` in the run folder; here we plot two of its columns ourselves.

with open(run_folder / "metrics.csv") as file:
    metrics = list(csv.DictReader(file))
print("\n".join(metrics[0]))

epochs = [int(row["epoch"]) for row in metrics]
fig, axes = plt.subplots(1, 2, figsize=(9, 3.6), constrained_layout=True)
for ax, quantity, unit in [
    (axes[0], "energy_per_atom_rmse", "meV/atom"),
    (axes[1], "forces_rmse", "meV/A"),
]:
    for split in ("train", "validation"):
        column = f"{split}_{quantity} [{unit}]"
        values = [float(row[column]) for row in metrics]
        ax.plot(epochs, values, marker="o", markersize=3, label=split)
    ax.set_xlabel("epoch")
    ax.set_ylabel(f"RMSE ({unit.replace('A', 'Å')})")
    ax.set_yscale("log")
    ax.legend()
axes[0].set_title("energy")
axes[1].set_title("forces")
plt.show()

# %%
# The exported model in ASE
# -------------------------
#
# ``model.pt`` is a metatomic model, and ``extensions/`` holds the compiled code it needs.
# ``metatomic_ase.MetatomicCalculator`` makes an ASE calculator of it: the same model can
# drive molecular dynamics in ASE, LAMMPS or i-PI.

calculator = MetatomicCalculator(workdir / "model.pt", extensions_directory=workdir / "extensions")

# %%
# ``indices/test.txt`` says which structures went to the test set: the file and the
# index of each structure in it. The model never saw them during training.

lines = (run_folder / "indices" / "test.txt").read_text().splitlines()
print("\n".join(lines[:3]), "...", sep="\n")
test = [line.split("\t") for line in lines]

reference_energy, predicted_energy = [], []
reference_forces, predicted_forces = [], []
for path, index in test:
    atoms = ase.io.read(path, index=int(index))
    reference_energy.append(atoms.get_potential_energy() / len(atoms))
    reference_forces.append(atoms.get_forces())
    atoms.calc = calculator
    predicted_energy.append(atoms.get_potential_energy() / len(atoms))
    predicted_forces.append(atoms.get_forces())

reference_energy = np.array(reference_energy)
predicted_energy = np.array(predicted_energy)
reference_forces = np.concatenate(reference_forces).reshape(-1)
predicted_forces = np.concatenate(predicted_forces).reshape(-1)


def rmse(a, b):
    return float(np.sqrt(np.mean((a - b) ** 2)))


energy_rmse = 1000 * rmse(predicted_energy, reference_energy)
forces_rmse = 1000 * rmse(predicted_forces, reference_forces)
print(f"energy per atom RMSE: {energy_rmse:.4g} meV/atom")
print(f"forces RMSE: {forces_rmse:.4g} meV/Å")

# %%
# These are the test-set errors ``mtt train`` printed at the end of training: the
# exported model computes exactly what was evaluated.
#
# Parity plot
# -----------

fig, axes = plt.subplots(1, 2, figsize=(9, 4.2), constrained_layout=True)
panels = [
    ("energy per atom", "eV/atom", reference_energy, predicted_energy, f"{energy_rmse:.3g} meV/atom"),
    ("force components", "eV/Å", reference_forces, predicted_forces, f"{forces_rmse:.3g} meV/Å"),
]
for ax, (label, unit, reference, predicted, error) in zip(axes, panels):
    low = min(reference.min(), predicted.min())
    high = max(reference.max(), predicted.max())
    ax.plot([low, high], [low, high], color="grey", linewidth=1, zorder=0)
    ax.scatter(reference, predicted, s=8, alpha=0.6)
    ax.set_aspect("equal")
    ax.set_xlabel(f"reference ({unit})")
    ax.set_ylabel(f"mtt ({unit})")
    ax.set_title(f"{label}, test set\nRMSE {error}")
plt.show()

# %%
# With 15 epochs the model is far from converged: the forces are already close to the
# diagonal, the energies less so. Raise ``num_epochs`` in the options file (the quick
# start's ``options.yaml`` trains 30 epochs, with the stress as well) to see both improve.
#
# Clean up
# --------
#
# The example leaves nothing behind.

shutil.rmtree(workdir)

# sphinx_gallery_thumbnail_number = 2
