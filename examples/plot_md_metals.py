"""
Energies in kcal/mol, and molecular dynamics in ASE
===================================================

This example trains a potential on reference data whose energies and forces are in
kcal/mol, then runs molecular dynamics with it in ASE, checks that the total energy is
conserved, compares the model with the reference along the trajectory, and shows where
the model says it is unsure.

The reference is ASE's EMT potential for Cu, Au and Pt: the cells of
``examples/data/emt_metals.xyz`` (in eV), written again here in kcal/mol, as the output
of another code might be. EMT is cheap, so the example can also ask it for the energies
of the structures the dynamics visits.
"""

# %%
# Units
# -----
#
# ``unit: kcal/mol`` tells mtt the unit of the energies in the file; it converts them,
# and the forces (kcal/mol/Å), to eV and eV/Å when it reads them. The model, its metrics
# and its predictions are in eV and Å from then on.
#
# .. literalinclude:: ../../../examples/md_metals.yaml
#    :language: yaml
#    :caption: examples/md_metals.yaml

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import ase.io
import ase.units
import matplotlib.pyplot as plt
import numpy as np
from ase.build import bulk, fcc111
from ase.calculators.emt import EMT
from ase.md.velocitydistribution import Stationary, thermalize_momenta
from ase.md.verlet import VelocityVerlet
from ase.visualize.plot import plot_atoms
from metatomic.torch import ModelOutput
from metatomic_ase import MetatomicCalculator

# the examples/ folder: run the script from there, as the docs build does
HERE = Path.cwd()
kcal_per_mol = ase.units.kcal / ase.units.mol  # in eV

# %%
# The dataset in kcal/mol
# -----------------------
#
# The shipped cells, with their energies and forces divided by the size of a kcal/mol in
# eV, in a fresh folder beside a copy of the options file.

workdir = Path(tempfile.mkdtemp(prefix="mtt-example-"))
frames = ase.io.read(HERE / "data" / "emt_metals.xyz", ":")
for atoms in frames:
    energy, forces = atoms.get_potential_energy(), atoms.get_forces()
    atoms.calc = None
    atoms.info["energy"] = energy / kcal_per_mol
    atoms.arrays["forces"] = forces / kcal_per_mol
ase.io.write(workdir / "emt_kcal.xyz", frames)
shutil.copy(HERE / "md_metals.yaml", workdir)
print(f"first structure: {frames[0].info['energy']:.2f} kcal/mol, {len(frames[0])} atoms")

# %%
# Train
# -----
#
# As in the first example, ``mtt train md_metals.yaml`` runs in that folder.

result = subprocess.run(
    [sys.executable, "-m", "mtt", "train", "md_metals.yaml"],
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
# A copper cell the model has never seen: EMT's energy is in eV, and so is the model's,
# although it learned from kcal/mol.

calculator = MetatomicCalculator(workdir / "model.pt", extensions_directory=workdir / "extensions")
atoms = bulk("Cu", "fcc", a=3.61, cubic=True).repeat((2, 2, 2))
atoms.rattle(0.05, seed=1)
atoms.calc = EMT()
print(f"EMT: {atoms.get_potential_energy():.3f} eV = {atoms.get_potential_energy() / kcal_per_mol:.1f} kcal/mol")
atoms.calc = calculator
print(f"mtt: {atoms.get_potential_energy():.3f} eV")

# %%
# Molecular dynamics
# ------------------
#
# The same calculator drives ASE's molecular dynamics: here 0.4 ps of the 32 copper
# atoms in the microcanonical ensemble (NVE) with a 2 fs time step, starting from
# velocities drawn at 300 K. Each step asks the model for the forces.

thermalize_momenta(atoms, temperature_K=300, rng=np.random.default_rng(0))
Stationary(atoms)
dynamics = VelocityVerlet(atoms, timestep=2 * ase.units.fs)

time, potential, kinetic, snapshots = [], [], [], []


def record():
    time.append(dynamics.get_time() / (1000 * ase.units.fs))  # in ps
    potential.append(atoms.get_potential_energy())
    kinetic.append(atoms.get_kinetic_energy())
    snapshots.append(atoms.copy())


dynamics.attach(record, interval=2)
dynamics.run(200)

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
# The model against EMT along the trajectory
# ------------------------------------------
#
# Energy conservation says the forces are consistent with the model's energy, not that
# the model is right. EMT gives the reference energy of every recorded snapshot: after a
# few epochs the model follows its fluctuations, with an offset and an error of some meV
# per atom.

reference = []
for snapshot in snapshots:
    snapshot.calc = EMT()
    reference.append(snapshot.get_potential_energy())
reference = np.array(reference)

fig, ax = plt.subplots(figsize=(7, 3.2), constrained_layout=True)
ax.plot(time, 1000 * (potential - potential.mean()) / len(atoms), label="mtt")
ax.plot(time, 1000 * (reference - reference.mean()) / len(atoms), label="EMT", linestyle="--")
ax.set_xlabel("time (ps)")
ax.set_ylabel("potential - mean\n(meV/atom)")
ax.legend()
plt.show()

error = 1000 * np.sqrt(np.mean(((potential - reference) - (potential - reference).mean()) ** 2)) / len(atoms)
print(f"RMS error of the energy fluctuations along the trajectory: {error:.2f} meV/atom")

# %%
# Where the model is unsure
# -------------------------
#
# The model also predicts its own uncertainty (:doc:`/uncertainty`): ``mtt train`` fitted
# it on the training cells and calibrated it on the validation cells, and the exported
# model has metatomic's ``energy_uncertainty`` output. Along the trajectory, the predicted
# standard deviation of each snapshot's energy sits beside its actual error (the error of
# the fluctuation, as above, since the constant offset is not what the model is uncertain
# about at a given snapshot).

per_structure = {"energy_uncertainty": ModelOutput(unit="eV", sample_kind="system")}
sigma = []
for snapshot in snapshots:
    outputs = calculator.run_model(snapshot, per_structure)
    sigma.append(float(outputs["energy_uncertainty"].block().values[0, 0]))
sigma = np.array(sigma)
errors = (potential - reference) - (potential - reference).mean()

fig, ax = plt.subplots(figsize=(7, 3.2), constrained_layout=True)
ax.plot(time, 1000 * np.abs(errors) / len(atoms), label="|error| (fluctuation)")
ax.plot(time, 1000 * sigma / len(atoms), label="predicted uncertainty")
ax.set_xlabel("time (ps)")
ax.set_ylabel("meV/atom")
ax.legend()
plt.show()

# %%
# Forces have an uncertainty too, from the model's ``energy_ensemble``: last-layer
# weights sampled from the same posterior, whose forces spread where the model is
# unsure. ``examples/ensemble_calculator.py`` is an ASE calculator that takes the forces
# of the energy and of every member in one backward pass (it needs metatomic, not mtt):
#
# .. literalinclude:: ../../../examples/ensemble_calculator.py
#    :language: python
#    :pyobject: EnsembleCalculator.calculate
#
# Each snapshot's force uncertainty (RMS over its atoms) sits beside the RMS error of its
# forces against EMT's.

sys.path.insert(0, str(HERE))
from ensemble_calculator import EnsembleCalculator  # noqa: E402

ensemble = EnsembleCalculator(str(workdir / "model.pt"), extensions_directory=str(workdir / "extensions"))
force_sigma, force_error = [], []
for snapshot in snapshots:
    predicted = snapshot.copy()
    predicted.calc = ensemble
    forces = predicted.get_forces()
    force_sigma.append(ensemble.results["force_uncertainty"])
    snapshot.calc = EMT()
    force_error.append(np.sqrt(np.mean((forces - snapshot.get_forces()) ** 2)))

fig, ax = plt.subplots(figsize=(7, 3.2), constrained_layout=True)
ax.plot(time, 1000 * np.array(force_error), label="force RMSE against EMT")
ax.plot(time, 1000 * np.array(force_sigma), label="predicted force uncertainty")
ax.set_xlabel("time (ps)")
ax.set_ylabel("meV/Å")
ax.legend()
plt.show()
print(f"force RMSE along the trajectory {1000 * np.sqrt(np.mean(np.square(force_error))):.0f} meV/Å, "
      f"predicted {1000 * np.sqrt(np.mean(np.square(force_sigma))):.0f} meV/Å")  # fmt: skip

# %%
# A structure unlike the training cells has a larger uncertainty, and an atom's local
# uncertainty says which of its atoms are the reason. The training set has bulk cells
# only: in a copper slab, the atoms of its two surfaces are the ones the model has never
# seen, and their colour shows it.

slab = fcc111("Cu", size=(4, 4, 5), vacuum=6.0, periodic=True)
per_atom = {"energy_uncertainty": ModelOutput(unit="eV", sample_kind="atom")}
local = calculator.run_model(slab, per_atom)["energy_uncertainty"].block().values[:, 0].detach().numpy()
bulk_local = calculator.run_model(atoms, per_atom)["energy_uncertainty"].block().values[:, 0].detach().numpy()
layers = np.round(slab.positions[:, 2] - slab.positions[:, 2].min(), 1)
for height in np.unique(layers):
    print(f"layer at {height:4.1f} A: local uncertainty {1000 * local[layers == height].mean():6.1f} meV")
print(f"bulk cell of the MD: {1000 * bulk_local.mean():.1f} meV")

colours = plt.cm.viridis((local - local.min()) / (local.max() - local.min()))
fig, ax = plt.subplots(figsize=(7, 3.5), constrained_layout=True)
plot_atoms(slab, ax, rotation="-90x", colors=colours)
ax.set_axis_off()
bar = fig.colorbar(
    plt.cm.ScalarMappable(cmap="viridis", norm=plt.Normalize(1000 * local.min(), 1000 * local.max())), ax=ax
)
bar.set_label("local energy uncertainty (meV)")
plt.show()

# %%
# Clean up
# --------

shutil.rmtree(workdir)
