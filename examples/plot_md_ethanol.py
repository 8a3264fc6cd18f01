"""
Energies in kcal/mol, and molecular dynamics in ASE
===================================================

This example trains a potential for ethanol on reference data whose energies and forces
are in kcal/mol, then runs molecular dynamics with it in ASE and checks that the total
energy is conserved.

The dataset, 100 snapshots of ab initio molecular dynamics of one ethanol molecule
(from rMD17), is read from the folder ``shared/data`` beside the repository.
"""

# %%
# Units
# -----
#
# ``unit: kcal/mol`` tells mtt the unit of the energies in the file; it converts them,
# and the forces (kcal/mol/Å), to eV and eV/Å when it reads them. The model, its metrics
# and its predictions are in eV and Å from then on.
#
# .. literalinclude:: ../../../examples/md_ethanol.yaml
#    :language: yaml
#    :caption: examples/md_ethanol.yaml

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import ase.io
import ase.units
import matplotlib.pyplot as plt
import numpy as np
from ase.md.velocitydistribution import Stationary, thermalize_momenta
from ase.md.verlet import VelocityVerlet
from metatomic_ase import MetatomicCalculator

# the examples/ folder: run the script from there, as the docs build does
HERE = Path.cwd()
options = HERE / "md_ethanol.yaml"

# %%
# Train
# -----
#
# As in the first example, ``mtt train md_ethanol.yaml`` runs in a fresh folder.

workdir = Path(tempfile.mkdtemp(prefix="mtt-example-"))
result = subprocess.run(
    [sys.executable, "-m", "mtt", "train", str(options)],
    cwd=workdir,
    capture_output=True,
    text=True,
)
print(result.stdout)
if result.returncode != 0:
    raise RuntimeError(f"mtt failed:\n{result.stderr}")

# %%
# The model predicts eV
# ---------------------
#
# The reference energy of the first structure is in kcal/mol in the file; the model's
# prediction is in eV. ``ase.units`` converts between them.

calculator = MetatomicCalculator(workdir / "model.pt", extensions_directory=workdir / "extensions")

dataset = HERE / "../../shared/data/ethanol_reduced_100.xyz"
atoms = ase.io.read(dataset, index=0)
kcal_per_mol = ase.units.kcal / ase.units.mol  # in eV
reference = atoms.get_potential_energy()
in_ev = reference * kcal_per_mol
print(f"reference: {reference:.2f} kcal/mol = {in_ev:.3f} eV")
atoms.calc = calculator
print(f"mtt:       {atoms.get_potential_energy():.3f} eV")

# %%
# Molecular dynamics
# ------------------
#
# The same calculator drives ASE's molecular dynamics: here 0.2 ps in the microcanonical
# ensemble (NVE) with a 0.5 fs time step, starting from velocities drawn at 300 K. Each
# step asks the model for the forces.

thermalize_momenta(atoms, temperature_K=300, rng=np.random.default_rng(0))
Stationary(atoms)
dynamics = VelocityVerlet(atoms, timestep=0.5 * ase.units.fs)

time, potential, kinetic = [], [], []


def record():
    time.append(dynamics.get_time() / (1000 * ase.units.fs))  # in ps
    potential.append(atoms.get_potential_energy())
    kinetic.append(atoms.get_kinetic_energy())


dynamics.attach(record, interval=2)
dynamics.run(400)

# %%
# Energy conservation
# -------------------
#
# The forces of an mtt model are the exact derivatives of its energy, so in NVE the total
# energy is conserved while potential and kinetic energy exchange: it only oscillates by a
# small fraction of their fluctuations, because of the finite time step, and does not
# drift.

potential, kinetic = np.array(potential), np.array(kinetic)
total = potential + kinetic

fig, (top, bottom) = plt.subplots(2, 1, figsize=(7, 5), sharex=True, constrained_layout=True)
top.plot(time, potential - potential.mean(), label="potential")
top.plot(time, kinetic - kinetic.mean(), label="kinetic")
top.set_ylabel("energy - mean (eV)")
top.legend(loc="lower center", bbox_to_anchor=(0.5, 1), ncols=2, frameon=False)
bottom.plot(time, 1000 * (total - total[0]), color="black")
bottom.set_ylabel("total - initial\n(meV)")
bottom.set_xlabel("time (ps)")
plt.show()

print(f"fluctuation of the potential energy: {1000 * potential.std():.1f} meV")
print(f"fluctuation of the total energy: {1000 * total.std():.2f} meV")

# %%
# Clean up
# --------

shutil.rmtree(workdir)
