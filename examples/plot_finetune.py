"""
Fine-tune a model on a new element
==================================

This example trains a SOAP-BPNN potential on the cells of ``examples/data/emt_metals.xyz``
that have no gold (Cu, Pt and their alloys), then fine-tunes it on cells with gold: the
fine-tuned model knows Cu, Pt and Au. It reads the table in which mtt reports what
fine-tuning gained on the new data and cost on the original data, fine-tunes again with
some of the original structures to lose less, and compares the energies of the models
with the reference in ASE.

:doc:`../finetuning` describes the options and what each method trains.
"""

# %%
# The data
# --------
#
# The shipped cells, split by whether they contain gold. One in five cells with gold is
# kept apart, to compare the fine-tuned models on cells none of them was trained on. The
# files are written in a fresh folder, next to copies of the options files of this
# example.

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

workdir = Path(tempfile.mkdtemp(prefix="mtt-example-"))
frames = ase.io.read(HERE / "data" / "emt_metals.xyz", ":")
gold = [atoms for atoms in frames if "Au" in atoms.get_chemical_symbols()]
without_gold = [atoms for atoms in frames if "Au" not in atoms.get_chemical_symbols()]
ase.io.write(workdir / "without_gold.xyz", without_gold)
gold_test = gold[::5]
ase.io.write(workdir / "with_gold.xyz", [atoms for i, atoms in enumerate(gold) if i % 5 != 0])
ase.io.write(workdir / "gold_test.xyz", gold_test)
for name in ("finetune_pretrain.yaml", "finetune.yaml", "finetune_replay.yaml"):
    shutil.copy(HERE / name, workdir)
print(f"{len(without_gold)} cells without gold; {len(gold)} with gold, {len(gold_test)} of them kept apart")


def mtt(*arguments):
    """Run ``mtt`` with these arguments in ``workdir``; return what it prints."""
    command = [sys.executable, "-m", "mtt", *arguments]
    result = subprocess.run(command, cwd=workdir, capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"mtt failed:\n{result.stdout}\n{result.stderr}")
    return result.stdout


def new_run(runs):
    """The run folder under ``workdir/outputs`` that is not among ``runs``."""
    (run,) = [run for run in (workdir / "outputs").glob("*/*") if run not in runs]
    runs.append(run)
    return run


runs = []

# %%
# The original model
# ------------------
#
# An ordinary run, as in the first example, on the cells without gold:
#
# .. literalinclude:: ../../../examples/finetune_pretrain.yaml
#    :language: yaml
#    :caption: examples/finetune_pretrain.yaml
#
# ``-o`` names the exported model, so that the next runs do not take its place. We show
# the summary of the run only.

output = mtt("train", "finetune_pretrain.yaml", "-o", "pretrained.pt")
print(output[output.index("Summary") :])
pretraining = new_run(runs)

# %%
# Fine-tuning
# -----------
#
# The fine-tuning options name the checkpoint of that run in
# ``architecture.training.finetune``. The architecture and the model hyperparameters are
# the checkpoint's, and so are the starting weights (those of its best epoch); the rest
# is an options file like any other, with the new data:
#
# .. literalinclude:: ../../../examples/finetune.yaml
#    :language: yaml
#    :caption: examples/finetune.yaml
#
# ``read_from`` is relative to the options file's folder; here we copy the checkpoint
# next to it. On a terminal one would rather give the run's ``model.ckpt`` on the
# command line: ``mtt train finetune.yaml
# architecture.training.finetune.read_from=outputs/<date>/<time>/model.ckpt``.

shutil.copy(pretraining / "model.ckpt", workdir / "pretrained.ckpt")
output = mtt("train", "finetune.yaml", "-o", "finetuned.pt")
print(output)
finetuning = new_run(runs)

# %%
# Before the first epoch mtt says what it trains: with ``method: full``, every weight.
# Gold is new: the model got a network for it, and its descriptor the features of the
# pairs of elements with gold. Methods ``heads`` and ``lora``, which leave most weights as
# they were, refuse new elements: a new element's weights outside the heads would stay at
# their random start.
#
# The table at the end is the cost of fine-tuning. Its first rows are the errors on the
# validation structures of this run (cells with gold), before and after fine-tuning:
# "before" is the starting model, whose network for gold is untrained. The last rows are
# the errors on the validation structures of the original run (cells without gold), which
# mtt split again from the checkpoint's options and seed: "before" is the original model,
# "after" the fine-tuned one. The fine-tuned model learned the cells with gold, and lost
# much of its accuracy on the energies of the cells without: nothing in its training
# data is a cell of pure copper or platinum.
#
# Keeping the original accuracy
# -----------------------------
#
# The training structures of the original run, given beside the new ones, keep the model
# trained on them. ``indices/training.txt`` of the first run says which they were (the
# file and the index of each); the validation structures of the original run must stay
# out of the fine-tuning, or the cost measured on them would be too low.
#
# .. literalinclude:: ../../../examples/finetune_replay.yaml
#    :language: yaml
#    :caption: examples/finetune_replay.yaml


def read_indices(run, name):
    """The structures listed in ``indices/<name>.txt`` of a run."""
    lines = (run / "indices" / f"{name}.txt").read_text().splitlines()
    return [ase.io.read(path, index=int(index)) for path, index in (line.split("\t") for line in lines)]


ase.io.write(workdir / "original_training.xyz", read_indices(pretraining, "training"))
output = mtt("train", "finetune_replay.yaml", "-o", "replay.pt")
print(output[output.index("  fine-tuning of") : output.index("  run folder")])
new_run(runs)

# %%
# The first rows are now on a validation set with cells of both kinds, and cannot be
# compared with those of the first fine-tuning: the plot below compares the two models on
# the same cells. On the validation structures of the original run, the errors stayed
# close to those of the original model.
#
# The models in ASE
# -----------------
#
# Every run exported its model; a fine-tuned one is a model like any other, with the
# adapters folded into its weights. We compare the energies of the three models with
# the reference on cells none of them was trained on: the cells with gold kept apart,
# which only the fine-tuned models can take, and the test set of the original run.

calculators = {
    name: MetatomicCalculator(workdir / f"{name}.pt", extensions_directory=workdir / "extensions")
    for name in ("pretrained", "finetuned", "replay")
}
labels = {"pretrained": "original", "finetuned": "fine-tuned", "replay": "fine-tuned, with original data"}


def energies_per_atom(structures, model=None):
    """The reference energies per atom of ``structures``, or those of ``model``."""
    energies = []
    for atoms in structures:
        if model is not None:
            atoms = atoms.copy()
            atoms.calc = calculators[model]
        energies.append(atoms.get_potential_energy() / len(atoms))
    return np.array(energies)


def rmse(a, b):
    return float(np.sqrt(np.mean((a - b) ** 2)))


original_test = read_indices(pretraining, "test")
panels = [
    (f"cells with gold ({len(gold_test)})", gold_test, ["finetuned", "replay"]),
    (f"cells without gold ({len(original_test)})", original_test, ["pretrained", "finetuned", "replay"]),
]
colours = {"pretrained": "C0", "finetuned": "C1", "replay": "C2"}

fig, axes = plt.subplots(1, 2, figsize=(9, 4.6), layout="compressed")
for ax, (title, structures, names) in zip(axes, panels):
    reference = energies_per_atom(structures)
    low, high = reference.min(), reference.max()
    for name in names:
        predicted = energies_per_atom(structures, name)
        error = 1000 * rmse(predicted, reference)
        print(f"{title}, {labels[name]}: energy per atom RMSE {error:.4g} meV/atom")
        ax.scatter(reference, predicted, s=14, alpha=0.7, color=colours[name], label=f"{labels[name]}: {error:.3g}")
        low, high = min(low, predicted.min()), max(high, predicted.max())
    ax.plot([low, high], [low, high], color="grey", linewidth=1, zorder=0)
    ax.set_aspect("equal")
    ax.set_xlabel("reference (eV/atom)")
    ax.set_ylabel("model (eV/atom)")
    ax.set_title(f"energy per atom, {title}")
    ax.legend(title="RMSE (meV/atom)", fontsize="small")
plt.show()

# %%
# The first fine-tuned model shifted the energies of the cells without gold, as its table
# said: the copper and platinum atoms of its training cells all have gold nearby. Trained
# with the original structures too, the model predicts both kinds of cells. How much of
# the original data is needed, and which method loses least, depends on the system and
# the data; the table of each run says what it gained and what it cost.
#
# Clean up
# --------
#
# The example leaves nothing behind.

shutil.rmtree(workdir)
