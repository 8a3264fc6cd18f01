"""
Grow a dataset where the model is unsure
========================================

This example runs ``mtt learn`` on copper with ASE's EMT potential as the reference: it
trains a small SOAP-BPNN with uncertainty on ten rattled cells, then, round by round, runs
MD with the model, labels the frames the model is least sure of with EMT (energy, forces
and stress) and fine-tunes on the grown set; after the last round, a final model trains
from scratch on everything labelled. A fixed test set of EMT's own MD frames shows what
the rounds buy. See :doc:`../active-learning` for every option.
"""

# %%
# Starting cells and a test set
# -----------------------------
#
# Ten 32-atom fcc cells, rattled and strained, labelled with EMT: the whole starting
# training set. The test set is 40 frames of EMT's own Langevin MD at 1000 K, the kind of
# structures the model will meet in an MD run.

import csv
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import ase.io
import ase.units
import matplotlib.pyplot as plt
import numpy as np
from ase.build import bulk
from ase.calculators.emt import EMT
from ase.calculators.singlepoint import SinglePointCalculator
from ase.md.langevin import Langevin
from ase.md.velocitydistribution import MaxwellBoltzmannDistribution

workdir = Path(tempfile.mkdtemp(prefix="mtt-learn-example-"))
rng = np.random.default_rng(0)


def labelled(atoms):
    """A copy of ``atoms`` with EMT's energy, forces and stress kept with it."""
    atoms = atoms.copy()
    atoms.calc = EMT()
    results = {"energy": atoms.get_potential_energy(), "forces": atoms.get_forces(), "stress": atoms.get_stress()}
    atoms.calc = SinglePointCalculator(atoms, **results)
    return atoms


cells = []
for i in range(10):
    atoms = bulk("Cu", "fcc", a=3.61, cubic=True).repeat((2, 2, 2))
    atoms.rattle(0.05 + 0.005 * i, rng=rng)
    atoms.set_cell(atoms.cell * (1 + 0.01 * rng.standard_normal()), scale_atoms=True)
    cells.append(labelled(atoms))
ase.io.write(workdir / "start.xyz", cells)

atoms = bulk("Cu", "fcc", a=3.61, cubic=True).repeat((2, 2, 2))
atoms.calc = EMT()
MaxwellBoltzmannDistribution(atoms, temperature_K=1000, rng=rng)
dynamics = Langevin(atoms, 2 * ase.units.fs, temperature_K=1000, friction=0.02, rng=rng)
dynamics.run(100)
test = []
for _ in range(40):
    dynamics.run(20)
    test.append(labelled(atoms))
ase.io.write(workdir / "test.xyz", test)

# %%
# The options
# -----------
#
# ``options.yaml`` is an ordinary training options file: its training set is where the
# loop starts (ten structures train in seconds, so the starting model gets many epochs).
# ``learn.yaml`` says how to explore, select, label and train; the calculator is given by
# its import path.

(workdir / "options.yaml").write_text("""\
seed: 0
architecture:
  name: soap_bpnn
  training: {batch_size: 5, num_epochs: 300}
training_set:
  systems: start.xyz
  targets:
    energy: {key: energy, unit: eV, forces: forces, stress: stress}
validation_set: 0.2
test_set: 0.0
""")
(workdir / "learn.yaml").write_text("""\
options: options.yaml
rounds: 2
explore: {start: start.xyz, temperature: 1000, steps: 200, timestep: 2, every: 10}
select: {max_per_round: 10}
label: {calculator: "ase.calculators.emt:EMT"}
train: {overrides: [architecture.training.num_epochs=100]}
test_set: test.xyz
""")
print((workdir / "learn.yaml").read_text())

# %%
# Run the rounds
# --------------
#
# On a terminal, this is ``mtt learn learn.yaml`` in the folder of these files. It prints
# one row per round: the structures added, how many MD frames were above the selection
# threshold, the test errors and the time of each stage. The last row, ``final``, is the
# model trained from scratch on all of them with the starting options: the loop's result,
# ``learn/final/model.pt``.

result = subprocess.run(
    [sys.executable, "-m", "mtt", "learn", "learn.yaml"], cwd=workdir, capture_output=True, text=True
)
print(result.stdout)
if result.returncode != 0:
    raise RuntimeError(f"mtt learn failed:\n{result.stderr}")

# %%
# What the rounds bought
# ----------------------
#
# ``learn/learning.csv`` has the same rows. The test force error falls as the loop adds
# the structures its MD found uncertain, and the model's own force uncertainty on the test
# set follows it. The final training, a full training on the same structures, gets more
# out of them than the fine-tuned rounds (the star).

rows = list(csv.DictReader((workdir / "learn" / "learning.csv").open()))
final = rows[-1]
rows = rows[:-1]  # the rounds
sizes = [int(row["structures"]) for row in rows]
figure, axes = plt.subplots(figsize=(5.5, 4), layout="constrained")
axes.plot(sizes, [float(row["test_force_rmse"]) for row in rows], marker="o", label="test force RMSE")
axes.plot(sizes, [float(row["test_force_uncertainty"]) for row in rows], marker="s", label="predicted")
axes.plot(int(final["structures"]), float(final["test_force_rmse"]), marker="*", markersize=12, label="final model")
axes.set_xlabel("labelled structures")
axes.set_ylabel("force error and uncertainty [eV/Å]")
axes.legend()
plt.show()

# %%
# The uncertainty along the MD
# ----------------------------
#
# Each round's ``md_trace.csv`` has the force uncertainty of every frame considered. The
# MD of later rounds, with models trained on more of what the earlier ones found, is
# surer of where it goes.

figure, axes = plt.subplots(figsize=(5.5, 4), layout="constrained")
for number in range(1, len(rows)):
    trace = list(csv.DictReader((workdir / "learn" / f"round_{number}" / "md_trace.csv").open()))
    steps = sorted({int(row["step"]) for row in trace})
    median = [
        np.median([float(row["force_uncertainty_eV_per_A"]) for row in trace if int(row["step"]) == step])
        for step in steps
    ]
    axes.plot(steps, median, label=f"round {number}")
axes.set_xlabel("MD step")
axes.set_ylabel("median force uncertainty [eV/Å]")
axes.legend()
plt.show()

# %%
# The example leaves nothing behind.

shutil.rmtree(workdir)
