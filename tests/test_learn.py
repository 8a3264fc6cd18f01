"""`mtt learn` through the command line, on EMT copper cells: rounds of MD, selection,
labelling and fine-tuning; continuing a stopped run without labelling twice; labelling
failures skipped with a count; bad input refused before anything is written."""

from __future__ import annotations

import csv
import json
import os
import sys
from pathlib import Path

import ase.io
import ase.units
import numpy as np
import pytest
import yaml
from ase.build import bulk
from ase.calculators.emt import EMT
from conftest import SMALL_SOAP, exported_outputs, run_mtt

CALCULATORS = Path(__file__).resolve().parent / "calculators"
#: the test calculators import from tests/calculators, in `mtt learn` and its labelling processes
ENVIRONMENT = {"PYTHONPATH": os.pathsep.join([str(CALCULATORS), os.environ.get("PYTHONPATH", "")])}

OPTIONS = f"""
seed: 0
architecture:
{"".join(f"  {line}" + chr(10) for line in SMALL_SOAP.splitlines())}  training: {{batch_size: 4, num_epochs: 12}}
training_set:
  systems: start.xyz
  targets:
    energy: {{key: energy, unit: eV, forces: forces, stress: stress}}
validation_set: 0.2
test_set: 0.0
"""


def copper_cells(count: int, seed: int, element: str = "Cu") -> list[ase.Atoms]:
    """Rattled, strained 8-atom fcc cells with EMT energies, forces and stress."""
    rng = np.random.default_rng(seed)
    frames = []
    for i in range(count):
        atoms = bulk(element, "fcc", a=3.61, cubic=True).repeat((2, 1, 1))
        atoms.rattle(0.05 + 0.01 * i, rng=rng)
        atoms.set_cell(atoms.cell * (1 + 0.01 * rng.standard_normal()), scale_atoms=True)
        atoms.calc = EMT()
        atoms.get_stress()
        frames.append(atoms)
    return frames


@pytest.fixture(scope="module")
def start(tmp_path_factory) -> Path:
    """Ten starting cells, a test set, and a starting model trained on the cells with uncertainty."""
    folder = tmp_path_factory.mktemp("learn_start")
    ase.io.write(folder / "start.xyz", copper_cells(10, 0))
    ase.io.write(folder / "test.xyz", copper_cells(4, 1))
    (folder / "options.yaml").write_text(OPTIONS)
    result = run_mtt("train", "options.yaml", cwd=folder)
    assert result.returncode == 0, result.stderr
    (checkpoint,) = folder.glob("outputs/*/*/model.ckpt")
    (folder / "start.ckpt").write_bytes(checkpoint.read_bytes())
    return folder


def learn_file(folder: Path, start: Path, *, label: str = "{calculator: 'ase.calculators.emt:EMT'}", **more) -> Path:
    """A learn.yaml in ``folder`` that starts from the trained model of ``start``."""
    lines = {
        "options": str(start / "options.yaml"),
        "model": str(start / "start.ckpt"),
        "rounds": 1,
        "explore": f"{{start: {start / 'start.xyz'}, temperature: 800, steps: 40, timestep: 2, every: 4}}",
        "select": "{max_per_round: 4}",
        "label": label,
        "train": "{final: none, overrides: [architecture.training.num_epochs=4]}",
        **more,
    }
    path = folder / "learn.yaml"
    path.write_text("".join(f"{key}: {value}\n" for key, value in lines.items()))
    return path


def learning_rows(folder: Path) -> list[dict]:
    return list(csv.DictReader((folder / "learn" / "learning.csv").open()))


def test_rounds_grow_the_dataset_and_continue(start, tmp_path):
    # a start with two atoms 0.3 Å apart explodes at once: said, and the other starts go on
    seeds = copper_cells(2, 2)
    broken = seeds[0].copy()
    broken.positions[1] = broken.positions[0] + [0.3, 0, 0]
    ase.io.write(tmp_path / "seeds.xyz", [broken, *seeds])
    options = learn_file(
        tmp_path,
        start,
        rounds=2,
        test_set=str(start / "test.xyz"),
        explore=f"{{start: {tmp_path / 'seeds.xyz'}, temperature: 800, steps: 40, timestep: 2, every: 4}}",
        train="{overrides: [architecture.training.num_epochs=4]}",  # and the final training, by default
    )
    result = run_mtt("learn", str(options), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "the MD from start 0 stopped at its start: atoms 0.30 Å apart" in result.stdout
    rows = learning_rows(tmp_path)
    assert [row["round"] for row in rows] == ["0", "1", "2", "final"]
    assert all(float(row["test_force_rmse"]) > 0 for row in rows)
    learned = tmp_path / "learn"
    for number in (1, 2):
        folder = learned / f"round_{number}"
        labelled = ase.io.read(folder / "labelled.xyz", ":")
        assert 1 <= len(labelled) == int(rows[number]["added"]) <= 4
        for atoms in labelled:  # EMT's own labels, stress included, on the frames the MD selected
            reference = atoms.copy()
            reference.calc = EMT()
            np.testing.assert_allclose(atoms.get_forces(), reference.get_forces(), atol=1e-8)
            np.testing.assert_allclose(atoms.get_stress(), reference.get_stress(), atol=1e-8)
        assert (folder / "md_trace.csv").read_text().startswith("start,step,time_fs")
        # the round trained on everything labelled so far, fine-tuned from the round before
        round_options = (folder / "options.yaml").read_text()
        assert "round_1/labelled.xyz" in round_options
        assert f"round_{number - 1}" in round_options or str(start / "start.ckpt") in round_options
    assert "energy_ensemble" in exported_outputs(learned / "round_2" / "model.pt")
    # the final model: from scratch, on every labelled structure, with the starting epochs
    final_options = yaml.safe_load((learned / "final" / "options.yaml").read_text())
    assert "finetune" not in final_options["architecture"]["training"]
    assert final_options["architecture"]["training"]["num_epochs"] == 12
    assert "--restart" not in (learned / "final" / "train.log").read_text()
    assert [block["systems"]["read_from"] for block in final_options["training_set"][1:]] == [
        str(learned / f"round_{n}" / "labelled.xyz") for n in (1, 2)
    ]
    assert rows[-1]["structures"] == rows[-2]["structures"]
    assert f"the final model is {learned / 'final' / 'model.pt'}" in result.stdout
    assert "energy_ensemble" in exported_outputs(learned / "final" / "model.pt")
    assert (learned / "learning.png").stat().st_size > 0
    total = sum(int(row["added"]) for row in rows)
    assert len(ase.io.read(learned / "dataset.xyz", ":")) == total

    # the same command again would mix two runs: refused, nothing touched
    before = (learned / "learning.csv").read_text()
    again = run_mtt("learn", str(options), cwd=tmp_path)
    assert again.returncode != 0
    assert "already holds an mtt learn run" in again.stderr and "--restart auto" in again.stderr
    assert (learned / "learning.csv").read_text() == before

    # continued for one more round: the rounds done are read back, not run again
    stamps = {path: path.stat().st_mtime_ns for path in learned.glob("round_[12]/labelled/*.xyz")}
    more = run_mtt("learn", str(options), "--restart", "auto", "rounds=3", cwd=tmp_path)
    assert more.returncode == 0, more.stderr
    assert [row["round"] for row in learning_rows(tmp_path)] == ["0", "1", "2", "3", "final"]
    assert {path: path.stat().st_mtime_ns for path in stamps} == stamps
    # the final model of two rounds would be stale: trained anew, on the third round's structures too
    assert "round_3/labelled.xyz" in (learned / "final" / "options.yaml").read_text()
    assert "--restart" not in (learned / "final" / "train.log").read_text()


def test_auto_max_uncertainty_follows_a_model_unsure_everywhere(start, tmp_path):
    # a threshold far below the model's own uncertainty at its training structures: a
    # limit of 5 x threshold alone would stop every MD at its start; auto takes 3 x the
    # model's median at the starts instead, and the MD explores
    options = learn_file(tmp_path, start, select="{max_per_round: 4, threshold: 0.0001}")
    result = run_mtt("learn", str(options), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    explored = json.loads((tmp_path / "learn" / "round_1" / "round.json").read_text())["explore"]
    assert f"round 1: the MD stops above {explored['max_uncertainty']:.3g} eV/Å" in result.stdout
    assert explored["max_uncertainty"] > 0.0005
    assert explored["stopped_early"] < 10 and "stopped at its start" not in result.stdout
    # the force uncertainty is computed on the frames considered (every 4 steps), and on all of them
    trace = list(csv.DictReader((tmp_path / "learn" / "round_1" / "md_trace.csv").open()))
    assert {int(row["step"]) % 4 for row in trace} == {0}
    assert all(np.isfinite(float(row["force_uncertainty_eV_per_A"])) for row in trace)
    assert max(int(row["step"]) for row in trace) == 40


def test_rounds_train_distributed_with_a_launcher(start, tmp_path):
    launcher = f"{sys.executable} -m torch.distributed.run --nproc-per-node 2 --no-python"
    options = learn_file(
        tmp_path, start, train=f"{{launcher: '{launcher}', overrides: [architecture.training.num_epochs=2]}}"
    )
    result = run_mtt("learn", str(options), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    log = (tmp_path / "learn" / "round_1" / "train.log").read_text()
    assert "torch.distributed.run --nproc-per-node 2" in log and "distributed=true" in log
    assert "2 ranks on 1 node(s), launched by torchrun" in log
    assert int(learning_rows(tmp_path)[1]["added"]) >= 1
    assert "energy_ensemble" in exported_outputs(tmp_path / "learn" / "round_1" / "model.pt")


def test_interrupted_labelling_continues_without_labelling_twice(start, tmp_path):
    log = tmp_path / "calls.log"
    label = f"{{calculator: 'flaky_emt:FlakyEMT', parameters: {{log: {log}, interrupt_at: 3}}}}"
    options = learn_file(tmp_path, start, label=label)
    stopped = run_mtt("learn", str(options), cwd=tmp_path, env=ENVIRONMENT)
    assert stopped.returncode == 130, stopped.stderr
    assert "--restart auto" in stopped.stderr
    labelled = tmp_path / "learn" / "round_1" / "labelled"
    assert len(list(labelled.glob("*.xyz"))) == 2
    assert not (tmp_path / "learn" / "round_1" / "labelled.xyz").exists()

    more = run_mtt(
        "learn", str(options), "--restart", "auto", "label.parameters.interrupt_at=0", cwd=tmp_path, env=ENVIRONMENT
    )
    assert more.returncode == 0, more.stderr
    selected = len(ase.io.read(tmp_path / "learn" / "round_1" / "selected.xyz", ":"))
    calls = log.read_text().splitlines()
    # each selected structure computed once, but the one the interruption stopped in
    assert len(calls) == selected + 1 and len(set(calls)) == selected
    assert int(learning_rows(tmp_path)[1]["added"]) == selected


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full, whose writes fail with ENOSPC")
def test_a_full_disk_stops_with_a_clear_error_and_continues_without_labelling_twice(start, tmp_path):
    # the round's labels are written to a file of a full disk: the kernel's own ENOSPC
    log = tmp_path / "calls.log"
    options = learn_file(tmp_path, start, label=f"{{calculator: 'flaky_emt:FlakyEMT', parameters: {{log: {log}}}}}")
    round_folder = tmp_path / "learn" / "round_1"
    round_folder.mkdir(parents=True)
    (round_folder / "labelled.xyz.tmp").symlink_to("/dev/full")
    full = run_mtt("learn", str(options), cwd=tmp_path, env=ENVIRONMENT)
    assert full.returncode != 0
    assert "the disk is full" in full.stderr and "--restart auto" in full.stderr, full.stderr
    assert "internal error" not in full.stderr
    assert not (round_folder / "labelled.xyz").exists()
    labelled = sorted(round_folder.glob("labelled/*.xyz"))
    assert labelled and len(log.read_text().splitlines()) == len(labelled)

    (round_folder / "labelled.xyz.tmp").unlink()  # space freed
    more = run_mtt("learn", str(options), "--restart", "auto", cwd=tmp_path, env=ENVIRONMENT)
    assert more.returncode == 0, more.stderr
    assert len(log.read_text().splitlines()) == len(labelled)  # nothing labelled twice
    assert len(ase.io.read(round_folder / "labelled.xyz", ":")) == int(learning_rows(tmp_path)[1]["added"])


def test_failed_labels_are_skipped_and_counted(start, tmp_path):
    log = tmp_path / "calls.log"
    label = (
        f"{{calculator: 'flaky_emt:FlakyEMT', parameters: {{log: {log}, raise_every: 2, nan_every: 3}}, processes: 2}}"
    )
    options = learn_file(tmp_path, start, label=label, select="{max_per_round: 6}")
    result = run_mtt("learn", str(options), cwd=tmp_path, env=ENVIRONMENT)
    assert result.returncode == 0, result.stderr
    assert "was not labelled: RuntimeError: SCF did not converge" in result.stdout
    assert "was not labelled: the calculator gave NaN or infinite values" in result.stdout
    row = learning_rows(tmp_path)[1]
    selected = len(ase.io.read(tmp_path / "learn" / "round_1" / "selected.xyz", ":"))
    assert int(row["label_failed"]) >= 2 and int(row["added"]) + int(row["label_failed"]) == selected
    assert len(ase.io.read(tmp_path / "learn" / "round_1" / "labelled.xyz", ":")) == int(row["added"])


@pytest.fixture(scope="module")
def model_without_uncertainty(start, tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("no_uncertainty")
    (folder / "start.xyz").write_bytes((start / "start.xyz").read_bytes())
    (folder / "options.yaml").write_text(OPTIONS.replace("num_epochs: 12", "num_epochs: 1, uncertainty: false"))
    result = run_mtt("train", "options.yaml", cwd=folder)
    assert result.returncode == 0, result.stderr
    return next(folder.glob("outputs/*/*/model.ckpt"))


def _bad_inputs(start: Path, folder: Path, model_without_uncertainty: Path) -> dict[str, tuple[dict, str]]:
    ase.io.write(folder / "gold.xyz", copper_cells(1, 3, element="Au"))
    bare = copper_cells(1, 4)[0]
    bare.calc = None
    ase.io.write(folder / "no_forces.xyz", [bare])
    (folder / "off.yaml").write_text(OPTIONS.replace("num_epochs: 12", "num_epochs: 12, uncertainty: false"))
    (folder / "start.xyz").write_bytes((start / "start.xyz").read_bytes())
    return {
        "calculator": ({"label": "{calculator: 'nosuchpackage.ase:Calculator'}"}, "pip install nosuchpackage"),
        "class": ({"label": "{calculator: 'ase.calculators.emt:NoSuchClass'}"}, "has no class 'NoSuchClass'"),
        "options without uncertainty": (
            {"options": str(folder / "off.yaml"), "model": "null"},
            "uncertainty: false",
        ),
        "model without uncertainty": ({"model": str(model_without_uncertainty)}, "mtt calibrate"),
        "elements": (
            {"explore": f"{{start: {folder / 'gold.xyz'}}}"},
            "structure 0 of " + str(folder / "gold.xyz") + " contains Au",
        ),
        "test set": ({"test_set": str(folder / "no_forces.xyz")}, "has no reference energy and forces"),
        "unknown option": ({"rouns": 3}, "unknown option 'rouns'"),
    }


@pytest.mark.parametrize(
    "case",
    [
        "calculator",
        "class",
        "options without uncertainty",
        "model without uncertainty",
        "elements",
        "test set",
        "unknown option",
    ],
)
def test_bad_input_is_refused_before_anything_is_written(case, start, tmp_path, model_without_uncertainty):
    changes, message = _bad_inputs(start, tmp_path, model_without_uncertainty)[case]
    options = learn_file(tmp_path, start, **changes)
    result = run_mtt("learn", str(options), cwd=tmp_path)
    assert result.returncode != 0
    assert message in result.stderr, result.stderr
    assert "internal error" not in result.stderr
    assert not (tmp_path / "learn").exists()


def test_ethanol_with_tblite(shared_data, tmp_path):
    """The reference method of the issue, GFN2-xTB, labelling in two processes."""
    pytest.importorskip("tblite.ase", reason="tblite is not installed (pip install tblite)")
    frames = ase.io.read(shared_data / "ethanol_xtb_2000.xyz", ":")
    ase.io.write(tmp_path / "start.xyz", frames[::100])
    (tmp_path / "options.yaml").write_text(
        OPTIONS.replace("stress: stress", "stress: off").replace("{batch_size: 4, num_epochs: 12}", "{num_epochs: 3}")
    )
    (tmp_path / "learn.yaml").write_text(
        "options: options.yaml\nrounds: 1\n"
        "explore: {start: start.xyz, temperature: 500, steps: 20, every: 5}\n"
        "select: {max_per_round: 4}\n"
        "label: {calculator: 'tblite.ase:TBLite', parameters: {method: GFN2-xTB, verbosity: 0}, processes: 2}\n"
        "train: {overrides: [architecture.training.num_epochs=2]}\n"
    )
    result = run_mtt("learn", "learn.yaml", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    labelled = ase.io.read(tmp_path / "learn" / "round_1" / "labelled.xyz", ":")
    assert labelled and int(learning_rows(tmp_path)[1]["label_failed"]) == 0
    from tblite.ase import TBLite

    check = labelled[0].copy()
    check.calc = TBLite(method="GFN2-xTB", verbosity=0)
    np.testing.assert_allclose(labelled[0].get_forces(), check.get_forces(), atol=1e-6)


if sys.platform == "win32":  # fcntl, for the test calculators' shared log
    pytestmark = pytest.mark.skip(reason="the test calculators need fcntl")


def test_frames_of_different_md_runs_of_a_cell_are_not_near_duplicates():
    """A bulk cell's sorted distances hardly change between thermal frames: frames of two
    MD runs are both taken, a frame its own run barely moved from is not."""
    from ase.md.langevin import Langevin
    from ase.md.velocitydistribution import MaxwellBoltzmannDistribution

    from mtt.learning.select import select

    frames = []
    for start in (0, 1):
        atoms = bulk("Cu", "fcc", a=3.61, cubic=True).repeat((2, 2, 2))
        atoms.calc = EMT()
        rng = np.random.default_rng(start)
        MaxwellBoltzmannDistribution(atoms, temperature_K=1000, rng=rng)
        Langevin(atoms, 2 * ase.units.fs, temperature_K=1000, friction=0.02, rng=rng).run(100)
        frame = atoms.copy()
        frame.info.update(start=start, force_uncertainty=1.0 - start / 10)
        frames.append(frame)
    nearly = frames[0].copy()
    nearly.positions += np.random.default_rng(2).normal(scale=0.01, size=nearly.positions.shape)
    nearly.info.update(start=0, force_uncertainty=0.95)
    chosen = select([*frames, nearly], threshold=0.1, max_count=3, min_difference=0.05)
    assert [a.info["force_uncertainty"] for a in chosen] == [1.0, 0.9]
