"""Using a trained model: `mtt export`, `mtt eval`, and molecular dynamics in ASE through
metatomic's own calculator, in fresh processes that never import mtt."""

from __future__ import annotations

import itertools
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import ase.io
import numpy as np
import pytest
import torch
from conftest import EMT_DATA, ROOT, logged_test_errors, run_mtt, untuned_allocator_environment, write_options

STORED_CHECKPOINT = ROOT / "tests" / "data" / "checkpoint-v1.ckpt"

#: small models of each architecture: MD tests need a smooth model, not an accurate one
ARCHITECTURES = {
    "soap_bpnn": "name: soap_bpnn\n  model:\n    soap: {max_radial: 3, max_angular: 2}",
    "equivariant_mp": "name: equivariant_mp\n  model: {channels: 8, max_l: 2, correlation: 2, radial_mlp: [16]}",
}

SMALL_MODEL = """
seed: 5
architecture:
  {architecture}
  training: {{batch_size: 8, num_epochs: {epochs}}}
training_set:
  systems: {data}
  targets:
    energy: {targets}
validation_set: 0.1
test_set: 0.1
base_precision: {precision}
"""


def train(
    folder: Path, data: Path, targets: str, epochs: int = 3, precision: int = 64, architecture: str = "soap_bpnn"
) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    text = SMALL_MODEL.format(
        epochs=epochs, data=data, targets=targets, precision=precision, architecture=ARCHITECTURES[architecture]
    )
    options = write_options(folder, text)
    result = run_mtt("train", str(options), cwd=folder)
    assert result.returncode == 0, result.stderr
    return folder / "model.pt"


@pytest.fixture(scope="module")
def emt_model(tmp_path_factory) -> Path:
    return train(tmp_path_factory.mktemp("emt"), EMT_DATA, "{key: energy, unit: eV, forces: on, stress: on}", epochs=8)


def run_python(script: str, timeout: float = 600, env: dict | None = None) -> subprocess.CompletedProcess:
    """Python in a fresh process, as a simulation script would run."""
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script)], capture_output=True, text=True, timeout=timeout, env=env
    )
    assert result.returncode == 0, result.stderr
    return result


def md_drift(model: Path, structure: str, steps: int, temperature: float) -> float:
    """|E_total(end) - E_total(start)| per atom per ps of NVE MD, run without mtt."""
    output = run_python(f"""
        import sys, ase.io, numpy as np
        from ase import units
        from ase.md.verlet import VelocityVerlet
        from ase.md.velocitydistribution import MaxwellBoltzmannDistribution, Stationary
        from metatomic_ase import MetatomicCalculator
        atoms = ase.io.read({structure!r})
        atoms.calc = MetatomicCalculator({str(model)!r}, extensions_directory={str(model.parent / "extensions")!r})
        MaxwellBoltzmannDistribution(atoms, temperature_K={temperature}, rng=np.random.default_rng(0))
        Stationary(atoms)
        dynamics = VelocityVerlet(atoms, timestep=0.5 * units.fs)
        energies = []
        dynamics.attach(lambda: energies.append(atoms.get_total_energy()), interval=10)
        dynamics.run({steps})
        assert "mtt" not in sys.modules
        print(len(atoms), energies[0], energies[-1], max(energies) - min(energies))
    """)
    n_atoms, first, last, spread = output.stdout.split()
    picoseconds = steps * 0.5e-3
    return abs(float(last) - float(first)) / int(n_atoms) / picoseconds


@pytest.mark.slow
@pytest.mark.parametrize("architecture", sorted(ARCHITECTURES))
def test_nve_md_of_ethanol_conserves_energy(tmp_path, shared_data, architecture):
    model = train(
        tmp_path,
        shared_data / "ethanol_reduced_100.xyz",
        "{key: energy, unit: kcal/mol, forces: forces}",
        epochs=10,
        architecture=architecture,
    )
    first = ase.io.read(shared_data / "ethanol_reduced_100.xyz", "0")
    first.calc = None
    ase.io.write(tmp_path / "start.xyz", first)
    drift = md_drift(model, str(tmp_path / "start.xyz"), steps=1000, temperature=300)
    print(f"ethanol NVE drift: {drift * 1000:.3f} meV/atom/ps")
    assert drift < 0.005  # eV per atom per ps


@pytest.mark.slow
@pytest.mark.parametrize("architecture", sorted(ARCHITECTURES))
def test_nve_md_of_a_periodic_metal_conserves_energy(tmp_path, emt_model, architecture):
    from ase.build import bulk

    if architecture != "soap_bpnn":
        emt_model = train(
            tmp_path / "model", EMT_DATA, "{key: energy, unit: eV, forces: on, stress: on}", 8, 64, architecture
        )
    cell = bulk("Cu", "fcc", a=3.61, cubic=True).repeat((3, 3, 3))
    ase.io.write(tmp_path / "copper.xyz", cell)
    drift = md_drift(emt_model, str(tmp_path / "copper.xyz"), steps=1000, temperature=300)
    print(f"Cu (108 atoms) NVE drift: {drift * 1000:.3f} meV/atom/ps")
    assert drift < 0.005


def test_exported_model_matches_training_predictions_and_finite_differences(tmp_path, emt_model):
    folder = emt_model.parent
    result = run_mtt("eval", str(emt_model), "eval.yaml", "-o", "predictions.xyz", cwd=_eval_options(folder))
    assert result.returncode == 0, result.stderr
    checkpoint = next(folder.glob("outputs/*/*/model.ckpt"))
    from_checkpoint = run_mtt("eval", str(checkpoint), "eval.yaml", "-o", "from_checkpoint.xyz", cwd=folder)
    assert from_checkpoint.returncode == 0, from_checkpoint.stderr
    exported = ase.io.read(folder / "predictions.xyz", ":")
    framework = ase.io.read(folder / "from_checkpoint.xyz", ":")
    for a, b in zip(exported, framework):
        assert a.get_potential_energy() == pytest.approx(b.get_potential_energy(), abs=1e-9)
        np.testing.assert_allclose(a.get_forces(), b.get_forces(), atol=1e-9)
        np.testing.assert_allclose(a.get_stress(), b.get_stress(), atol=1e-9)

    # forces and stress of the exported model in a fresh process: derivatives of its energy
    output = run_python(f"""
        import ase.io, numpy as np
        from metatomic_ase import MetatomicCalculator
        atoms = ase.io.read({str(EMT_DATA)!r}, "5")
        atoms.calc = MetatomicCalculator({str(emt_model)!r}, extensions_directory={str(folder / "extensions")!r})
        forces = atoms.get_forces()
        step, worst = 1e-4, 0.0
        for atom in range(min(3, len(atoms))):
            for axis in range(3):
                moved = atoms.positions.copy()
                moved[atom, axis] += step; atoms.positions = moved; plus = atoms.get_potential_energy()
                moved[atom, axis] -= 2 * step; atoms.positions = moved; minus = atoms.get_potential_energy()
                moved[atom, axis] += step; atoms.positions = moved
                worst = max(worst, abs(-(plus - minus) / (2 * step) - forces[atom, axis]))
        print(worst, atoms.get_stress().shape)
    """)
    worst, shape = output.stdout.split(maxsplit=1)
    assert float(worst) < 1e-6
    assert shape.strip() == "(6,)"


def _eval_options(folder: Path) -> Path:
    (folder / "eval.yaml").write_text(
        f"systems: {EMT_DATA}\ntargets:\n  energy: {{key: energy, unit: eV, forces: on, stress: on}}\n"
    )
    return folder


def test_molecules_get_no_stress(tmp_path, shared_data):
    model = train(
        tmp_path, shared_data / "ethanol_reduced_100.xyz", "{key: energy, unit: kcal/mol, forces: forces}", epochs=1
    )
    (tmp_path / "eval.yaml").write_text(f"systems: {shared_data / 'ethanol_reduced_100.xyz'}\n")
    result = run_mtt("eval", str(model), "eval.yaml", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    frame = ase.io.read(tmp_path / "predictions.xyz", "0")
    assert set(frame.calc.results) == {"energy", "forces"}


def test_float32_model_runs_in_ase(tmp_path):
    model = train(tmp_path, EMT_DATA, "{key: energy, unit: eV, forces: on, stress: on}", epochs=1, precision=32)
    output = run_python(f"""
        import ase.io
        from metatomic_ase import MetatomicCalculator
        from metatomic.torch import load_atomistic_model
        print(load_atomistic_model({str(model)!r}, {str(tmp_path / "extensions")!r}).capabilities().dtype)
        atoms = ase.io.read({str(EMT_DATA)!r}, "0")
        atoms.calc = MetatomicCalculator({str(model)!r}, extensions_directory={str(tmp_path / "extensions")!r})
        print(atoms.get_potential_energy(), atoms.get_forces().dtype)
    """)
    assert output.stdout.startswith("float32")


# resident memory kept after a 16 MiB tensor is filled and freed, in an engine's process
# that has (or has not yet) computed forces with the exported model
KEPT_AFTER_A_STEP = """
    import sys, ase.io, torch
    from metatomic_ase import MetatomicCalculator
    def resident():
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * 4096 / 2**20
    atoms = ase.io.read({data!r}, "0")
    atoms.calc = MetatomicCalculator({model!r}, extensions_directory={extensions!r})
    if {compute}:
        atoms.get_forces()
    before = resident()
    block = torch.ones(4 * 2**20)
    del block
    assert "mtt" not in sys.modules
    print(resident() - before)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's dynamic mmap threshold is Linux's")
def test_exported_model_lets_the_engine_keep_its_step_memory(emt_model):
    """After one call of an exported model on the CPU, glibc serves tensors of up to about
    31 MiB from the heap and keeps them when freed, so that an MD step does not fault in
    their pages again; before it, a 16 MiB tensor goes back to the system when freed."""
    kept = {}
    for compute in (False, True):
        script = KEPT_AFTER_A_STEP.format(
            data=str(EMT_DATA), model=str(emt_model), extensions=str(emt_model.parent / "extensions"), compute=compute
        )
        kept[compute] = float(run_python(script, env=untuned_allocator_environment()).stdout.split()[-1])
    assert kept[False] < 4  # MiB: glibc's defaults
    assert kept[True] > 12


def test_eval_writes_predictions_table_and_plots(tmp_path, emt_model):
    _eval_options(tmp_path)
    result = run_mtt("eval", str(emt_model), "eval.yaml", "--plots", "-o", "out/predictions.xyz", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "100 structures" in result.stdout
    table = result.stdout[result.stdout.index("quantity") :]
    for row in ("energy per atom", "forces", "stress", "meV/atom", "meV/A"):
        assert row in table
    frames = ase.io.read(tmp_path / "out" / "predictions.xyz", ":")
    reference = ase.io.read(EMT_DATA, ":")
    assert len(frames) == 100
    np.testing.assert_allclose(frames[7].positions, reference[7].positions)
    assert frames[7].get_forces().shape == (len(reference[7]), 3)
    for name in ("energy", "forces", "stress"):
        image = tmp_path / "out" / f"predictions_parity_{name}.png"
        assert image.is_file() and image.stat().st_size > 10_000


def test_eval_without_targets_only_predicts(tmp_path, emt_model):
    (tmp_path / "eval.yaml").write_text(f"systems: {EMT_DATA}\n")
    result = run_mtt("eval", str(emt_model), "eval.yaml", "--plots", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "quantity" not in result.stdout
    assert "no parity plot: emt_metals.xyz gives no reference values (no targets)" in result.stdout
    assert len(ase.io.read(tmp_path / "predictions.xyz", ":")) == 100
    assert not list(tmp_path.glob("*.png"))


def _table(output: str) -> dict[str, float]:
    """RMSE by quantity from the table `mtt eval` prints."""
    rows = output[output.index("quantity") :].splitlines()[1:]
    rows = list(itertools.takewhile(lambda row: "uncertainty" not in row, rows))  # the report that follows
    return {" ".join(row.split()[:-3]): float(row.split()[-3]) for row in rows if len(row.split()) >= 4}


def test_eval_of_a_training_run_evaluates_its_test_set(tmp_path, emt_model):
    folder = emt_model.parent
    run = next(folder.glob("outputs/*/*"))
    logged = logged_test_errors(folder)  # what training printed for its test set
    expected = float(re.search(r"energy per atom rmse ([\d.]+) meV/atom", logged).group(1))

    with_options = run_mtt("eval", str(emt_model), "options.yaml", "-o", str(tmp_path / "a.xyz"), cwd=folder)
    assert with_options.returncode == 0, with_options.stderr
    assert "unknown option" not in with_options.stdout + with_options.stderr
    assert "the test set of options.yaml: 10 structures, split with its seed 5" in with_options.stdout
    from_run = run_mtt("eval", str(run.relative_to(folder)), "-o", str(tmp_path / "b.xyz"), cwd=folder)
    assert from_run.returncode == 0, from_run.stderr
    assert f"the test set of the run {run.relative_to(folder)}: 10 structures of emt_metals.xyz" in from_run.stdout
    checkpoint = run / "model.ckpt"
    from_checkpoint = run_mtt("eval", str(checkpoint), "options.yaml", "-o", str(tmp_path / "c.xyz"), cwd=folder)
    assert from_checkpoint.returncode == 0, from_checkpoint.stderr
    assert "from its indices/test.txt" in from_checkpoint.stdout
    for output in (with_options, from_run, from_checkpoint):
        assert _table(output.stdout)["energy per atom"] == pytest.approx(expected, rel=1e-3)

    # the predictions keep the reference values beside them, in eV and Å
    frames = ase.io.read(tmp_path / "b.xyz", ":")
    reference = ase.io.read(EMT_DATA, ":")
    test = [int(line.split("\t")[1]) for line in (run / "indices" / "test.txt").read_text().splitlines()]
    assert len(frames) == len(test) == 10
    for atoms, index in zip(frames, test):
        assert atoms.info["reference_energy"] == pytest.approx(reference[index].get_potential_energy())
        np.testing.assert_allclose(atoms.arrays["reference_forces"], reference[index].get_forces(), atol=1e-8)
        assert "energy" in atoms.calc.results  # the prediction


def test_eval_of_training_options_without_a_seed_asks_for_the_run(tmp_path, emt_model):
    text = (emt_model.parent / "options.yaml").read_text().replace("seed: 5\n", "")
    write_options(tmp_path, text)
    shutil.copy(emt_model, tmp_path / "copy.pt")
    result = run_mtt("eval", "copy.pt", "options.yaml", cwd=tmp_path)
    assert result.returncode == 2
    assert "sets no seed, so its test set cannot be drawn again" in result.stderr
    assert "Give the run folder" in result.stderr


def test_eval_refuses_unknown_elements_and_targets(tmp_path, emt_model):
    from ase.build import molecule

    ase.io.write(tmp_path / "water.xyz", molecule("H2O"))
    (tmp_path / "water.yaml").write_text("systems: water.xyz\n")
    result = run_mtt("eval", str(emt_model), "water.yaml", cwd=tmp_path)
    assert result.returncode != 0
    assert "H (Z=1), O (Z=8)" in result.stderr and "not trained on" in result.stderr
    assert "Cu, Pt, Au" in result.stderr or "Cu, Au, Pt" in result.stderr

    atoms = ase.io.read(EMT_DATA, "0")
    atoms.info["gap"] = 1.0
    ase.io.write(tmp_path / "gap.xyz", atoms)
    (tmp_path / "gap.yaml").write_text("systems: gap.xyz\ntargets:\n  gap: {key: gap}\n")
    result = run_mtt("eval", str(emt_model), "gap.yaml", cwd=tmp_path)
    assert result.returncode != 0
    assert "target 'gap', which the model does not predict" in result.stderr
    assert not (tmp_path / "predictions.xyz").exists()


# -- checkpoints across versions --------------------------------------------------------
def test_stored_checkpoint_still_exports_and_evaluates(tmp_path):
    result = run_mtt("export", str(STORED_CHECKPOINT), "-o", "model.pt", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "model.pt").is_file() and (tmp_path / "extensions").is_dir()
    _eval_options(tmp_path)
    result = run_mtt("eval", str(STORED_CHECKPOINT), "eval.yaml", cwd=tmp_path)
    assert result.returncode == 0, result.stderr


def test_stored_checkpoint_restarts(tmp_path):
    options = write_options(
        tmp_path,
        (ROOT / "tests" / "data" / "checkpoint-v1.yaml")
        .read_text()
        .replace("../../examples/data/emt_metals.xyz", str(EMT_DATA))
        .replace("num_epochs: 2", "num_epochs: 3"),
    )
    result = run_mtt("train", str(options), "--restart", str(STORED_CHECKPOINT), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "continuing after epoch 2" in result.stdout


def test_upgrades_run_in_order(tmp_path, monkeypatch):
    from mtt import checkpoint

    content = torch.load(STORED_CHECKPOINT, weights_only=True)
    content["version"] = 0
    content["old_name_of_spreads"] = content.pop("spreads")
    torch.save(content, tmp_path / "old.ckpt")

    def from_0_to_1(old: dict) -> dict:
        old["spreads"] = old.pop("old_name_of_spreads")
        old["version"] = 1
        return old

    monkeypatch.setitem(checkpoint.UPGRADES, 0, from_0_to_1)
    upgraded = checkpoint.load_checkpoint(tmp_path / "old.ckpt")
    assert upgraded["version"] == checkpoint.VERSION
    assert "spreads" in upgraded


@pytest.mark.parametrize("kind", ["newer", "truncated", "foreign", "text", "pickle"])
def test_export_refuses_bad_checkpoints_and_writes_nothing(tmp_path, kind):
    path = tmp_path / "bad.ckpt"
    if kind == "newer":
        content = torch.load(STORED_CHECKPOINT, weights_only=True)
        content["version"], content["mtt_version"] = 99, "9.1.0"
        torch.save(content, path)
    elif kind == "truncated":
        path.write_bytes(STORED_CHECKPOINT.read_bytes()[:5000])
    elif kind == "foreign":
        torch.save({"state_dict": {"w": torch.zeros(3)}}, path)
    elif kind == "text":
        path.write_text("not a checkpoint\n")
    else:  # arbitrary pickled code must not run
        import pickle

        class Exploit:
            def __reduce__(self):
                return (Path.touch, (tmp_path / "pwned",))

        torch.save({"format": "mtt-checkpoint", "version": 1, "payload": Exploit()}, path, pickle_module=pickle)
    result = run_mtt("export", str(path), "-o", "model.pt", cwd=tmp_path)
    assert result.returncode != 0
    assert "Traceback" not in result.stderr
    message = {
        "newer": "version 99, newer than",
        "truncated": "not a readable mtt checkpoint",
        "foreign": "is not an mtt checkpoint",
        "text": "not a readable mtt checkpoint",
        "pickle": "not a readable mtt checkpoint",
    }[kind]
    assert message in result.stderr
    if kind == "newer":  # mtt is not on the package index: no pip install --upgrade mtt
        assert "(mtt 9.1.0)" in result.stderr and "pip install" not in result.stderr
    assert not (tmp_path / "model.pt").exists()
    assert not (tmp_path / "extensions").exists()
    assert not (tmp_path / "pwned").exists()
