"""Last-layer uncertainties: fitted at the end of `mtt train`, exported as metatomic's
``energy_uncertainty`` and ``energy_ensemble`` and read in fresh processes without mtt
(the force uncertainty through examples/ensemble_calculator.py), reported by `mtt eval`."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import ase.io
import numpy as np
import pytest
import torch
from conftest import EMT_DATA, SMALL_SOAP, emt_options, run_mtt, torchrun_train, write_options

from mtt.training.uncertainty import binned_calibration, calibration_figures

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
SMALL_MP = "name: equivariant_mp\nmodel: {channels: 8, max_l: 1, hidden_l: 1, correlation: 2, num_layers: 2}"
TRAINING = "{batch_size: 8, num_epochs: 4}"


def _train(folder: Path, architecture: str, training: str = TRAINING, seed: int = 3) -> subprocess.CompletedProcess:
    folder.mkdir(parents=True, exist_ok=True)
    # float64, as SOAP-BPNN's default: ASE, metatomic and mtt eval agree to 1e-6 there
    options = write_options(folder, emt_options(architecture, training, seed=seed, precision=64))
    result = run_mtt("train", str(options), cwd=folder)
    assert result.returncode == 0, result.stderr
    return result


@pytest.fixture(scope="module", params=["soap_bpnn", "equivariant_mp"])
def trained(request, tmp_path_factory) -> tuple[Path, str]:
    folder = tmp_path_factory.mktemp(request.param)
    result = _train(folder, SMALL_SOAP if request.param == "soap_bpnn" else SMALL_MP)
    return folder, result.stdout


def _uncertainties(model: Path) -> dict:
    """What the exported model says, in a process that never imports mtt: per-structure and
    per-atom uncertainties of a structure, rotated and rattled, and its energy with and
    without the uncertainty requested (only the outputs of a model that declares none)."""
    script = textwrap.dedent(f"""
        import json, sys
        import ase.io, numpy as np
        from metatomic.torch import ModelOutput
        from metatomic_ase import MetatomicCalculator

        calculator = MetatomicCalculator({str(model)!r}, extensions_directory={str(model.parent / "extensions")!r})
        outputs = sorted(calculator._model.capabilities().outputs)
        if "energy_uncertainty" not in outputs:
            print(json.dumps({{"outputs": outputs, "mtt imported": "mtt" in sys.modules}}))
            sys.exit(0)

        def run(atoms, names):
            kinds = {{"energy": "system", "energy_uncertainty": "system", "energy_uncertainty@atom": "atom",
                      "energy_ensemble": "system"}}
            requests = {{n.split("@")[0]: ModelOutput(unit="eV", sample_kind=kinds[n]) for n in names}}
            result = calculator.run_model(atoms, requests)
            return {{n: result[n].block().values.detach().numpy().ravel().tolist() for n in result}}

        atoms = ase.io.read({str(EMT_DATA)!r}, 0)
        rotated = atoms.copy()
        rotation = np.linalg.qr(np.random.default_rng(1).normal(size=(3, 3)))[0]
        rotated.positions = rotated.positions @ rotation.T
        rotated.cell = rotated.cell[:] @ rotation.T
        rattled = atoms.copy()
        rattled.rattle(0.3, seed=2)
        moved = atoms.copy()
        moved.positions[1] += [0.4, 0.2, 0.0]
        figures = {{
            "outputs": outputs,
            "moved atoms": run(moved, ["energy_uncertainty@atom"])["energy_uncertainty"],
            "energy alone": run(atoms, ["energy"])["energy"],
            "both": run(atoms, ["energy", "energy_uncertainty"]),
            "ensemble": run(atoms, ["energy", "energy_ensemble"]),
            "atoms": run(atoms, ["energy_uncertainty@atom"])["energy_uncertainty"],
            "rotated": run(rotated, ["energy_uncertainty"])["energy_uncertainty"],
            "rattled": run(rattled, ["energy_uncertainty"])["energy_uncertainty"],
            "n_atoms": len(atoms),
            "mtt imported": "mtt" in sys.modules,
        }}
        print(json.dumps(figures))
    """)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_training_fits_an_uncertainty_that_leaves_mtt(trained):
    folder, stdout = trained
    summary = stdout[stdout.index("Summary") :]
    assert "uncertainty: energy from" in summary and "calibrated" in summary
    figures = _uncertainties(folder / "model.pt")
    assert not figures["mtt imported"]
    assert "energy_uncertainty" in figures["outputs"]
    (structure,) = figures["both"]["energy_uncertainty"]
    assert structure > 0
    # the energy is the same whether or not the uncertainty is asked for
    assert figures["both"]["energy"] == pytest.approx(figures["energy alone"], rel=1e-12)
    # an atom's local uncertainty, one per atom; invariant under rotations
    assert len(figures["atoms"]) == figures["n_atoms"] and min(figures["atoms"]) > 0
    # the atoms' local variances add up to about the structure's, and an atom moved off its
    # site is less certain than it was
    assert 1 / 4 < np.sqrt(np.sum(np.square(figures["atoms"]))) / structure < 4
    assert figures["moved atoms"][1] > 1.2 * figures["atoms"][1]
    # the sampled members spread around the model's own energy: their mean is it
    members, (energy,) = figures["ensemble"]["energy_ensemble"], figures["ensemble"]["energy"]
    assert len(members) == 16 and np.std(members) > 0
    assert np.mean(members) == pytest.approx(energy, abs=1e-9 * np.std(members) * len(members) + 1e-12)
    assert figures["rotated"][0] == pytest.approx(structure, rel=1e-6)
    # a structure far from the training data is less certain
    assert figures["rattled"][0] > structure


def _force_uncertainties(model: Path) -> dict:
    """The example's ensemble calculator, in a process that never imports mtt: the force
    uncertainty of a structure, rotated and rattled, and its forces beside metatomic's."""
    script = textwrap.dedent(f"""
        import json, sys
        import ase.io, numpy as np
        sys.path.insert(0, {str(EXAMPLES)!r})
        from ensemble_calculator import EnsembleCalculator
        from metatomic_ase import MetatomicCalculator

        extensions = {str(model.parent / "extensions")!r}
        calculator = EnsembleCalculator({str(model)!r}, extensions_directory=extensions)
        reference = MetatomicCalculator({str(model)!r}, extensions_directory=extensions, uncertainty_threshold=None)
        atoms = ase.io.read({str(EMT_DATA)!r}, 0)
        rotation = np.linalg.qr(np.random.default_rng(1).normal(size=(3, 3)))[0]
        rotated = atoms.copy()
        rotated.positions = rotated.positions @ rotation.T
        rotated.cell = rotated.cell[:] @ rotation.T
        rattled = atoms.copy()
        rattled.rattle(0.3, seed=2)
        figures = {{}}
        for name, structure in (("atoms", atoms), ("rotated", rotated), ("rattled", rattled)):
            structure.calc = calculator
            forces = structure.get_forces()
            figures[name] = calculator.results["force_uncertainty"]
            figures[name + " per atom"] = calculator.results["forces_uncertainty"].tolist()
            figures[name + " forces"] = forces.tolist()
        atoms.calc = reference
        figures["metatomic forces"] = atoms.get_forces().tolist()
        figures["mtt imported"] = "mtt" in sys.modules
        print(json.dumps(figures))
    """)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_the_training_forces_gram_matrix_is_sketched_close_to_its_sum(trained, monkeypatch):
    """The training forces' sum of ``j j^T`` over all force components (one backward pass a
    feature) and its estimate from a few random displacements of each structure, which the
    fit uses: close on this small set, and closer with more displacements (unbiased)."""
    from mtt import distributed
    from mtt.config import load_options
    from mtt.data.batching import compute_neighbor_lists
    from mtt.data.dataset import load_splits
    from mtt.export import model_from_state
    from mtt.training import uncertainty
    from mtt.training.state import TrainingState
    from mtt.training.trainer import Trainer

    folder, _ = trained
    options = load_options(str(folder / "options.yaml"), [])
    (checkpoint,) = folder.glob("outputs/*/*/model.ckpt")
    model, _, architecture = model_from_state(TrainingState.load(str(checkpoint)))
    dtype = next(v.dtype for v in model.state_dict().values() if v.is_floating_point())
    splits = load_splits(options.raw, folder, options.run.seed)
    compute_neighbor_lists(splits.train.structures, model.requested_neighbor_lists())
    environment = distributed.setup(False, options.run.distributed.port, 60, "cpu")
    trainer = Trainer(options.trainer_hypers, architecture, splits.info, environment, dtype, options.run.seed)
    assert trainer.info.needs_forces
    columns = uncertainty.energy_columns(model)
    exact = 0
    for jacobian, _, present in uncertainty._force_jacobians(trainer, model, splits.train, columns):
        exact = exact + jacobian[present.any(1)].T @ jacobian[present.any(1)]
    assert float(exact.trace()) > 0
    errors = []
    for probes in (uncertainty.FORCE_PROBES, 128):
        monkeypatch.setattr(uncertainty, "FORCE_PROBES", probes)
        sketched = uncertainty._force_gram(trainer, model, splits.train, columns)
        errors.append(float(torch.linalg.norm(sketched - exact) / torch.linalg.norm(exact)))
    trainer.close()
    assert errors[0] < 0.2 and errors[1] < 0.05, errors


def test_force_uncertainty_from_the_exported_ensemble(trained, tmp_path):
    folder, stdout = trained
    # with forces, the members are sampled from the posterior of the energies and forces
    summary = " ".join(stdout.split())
    assert "an ensemble of 16 sampled from the posterior of the energies and forces (forces' share" in summary
    assert "its spread calibrated on the validation forces" in summary
    figures = _force_uncertainties(folder / "model.pt")
    assert not figures["mtt imported"]
    # the calculator's forces are metatomic's; the uncertainty is invariant, larger far from the data
    np.testing.assert_allclose(figures["atoms forces"], figures["metatomic forces"], rtol=1e-6, atol=1e-9)
    assert figures["atoms"] > 0 and min(figures["atoms per atom"]) > 0
    assert figures["rotated"] == pytest.approx(figures["atoms"], rel=1e-6)
    assert figures["rattled"] > figures["atoms"]
    # mtt eval computes the same force uncertainty from the same members
    result = run_mtt("eval", str(folder / "model.pt"), str(EMT_DATA), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    first = ase.io.read(tmp_path / "predictions.xyz", 0)
    assert first.info["forces_uncertainty"] == pytest.approx(figures["atoms"], rel=1e-6)
    np.testing.assert_allclose(first.arrays["forces_uncertainty"], figures["atoms per atom"], rtol=1e-6)


def test_eval_reports_calibration_and_writes_the_uncertainty(trained, tmp_path):
    folder, _ = trained
    result = run_mtt("eval", str(folder / "model.pt"), str(EMT_DATA), "--plots", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "energy uncertainty on 100 structures: rank correlation with |error| (Spearman)" in result.stdout
    assert "forces uncertainty on 100 structures: rank correlation with |error| (Spearman)" in result.stdout
    assert "per force component" in result.stdout
    assert "miscalibration area" in result.stdout
    for quantity in ("energy", "forces"):
        assert (tmp_path / f"predictions_calibration_{quantity}.png").stat().st_size > 0
    first = (tmp_path / "predictions.xyz").read_text().splitlines()[1]
    assert "energy_uncertainty=" in first and "forces_uncertainty=" in first


def test_an_ensemble_of_fewer_than_two_members_is_refused(tmp_path):
    options = write_options(tmp_path, emt_options(SMALL_SOAP, "{num_epochs: 1, uncertainty_ensemble_size: 0}", seed=3))
    result = run_mtt("train", str(options), cwd=tmp_path)
    assert result.returncode != 0
    assert "'architecture.training.uncertainty_ensemble_size' must be >= 2 (a spread needs two members)" in " ".join(
        result.stderr.split()
    )
    assert not (tmp_path / "outputs").exists() and not (tmp_path / "model.pt").exists()


def test_checkpoint_exports_with_its_uncertainty(trained, tmp_path):
    folder, _ = trained
    (checkpoint,) = folder.glob("outputs/*/*/model.ckpt")
    result = run_mtt("export", str(checkpoint), "-o", str(tmp_path / "again.pt"), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "energy_uncertainty" in _uncertainties(tmp_path / "again.pt")["outputs"]


def test_uncertainty_can_be_turned_off(tmp_path):
    _train(tmp_path, SMALL_SOAP, "{batch_size: 8, num_epochs: 1, uncertainty: false}")
    assert "energy_uncertainty" not in _uncertainties(tmp_path / "model.pt")["outputs"]


def test_the_ensemble_can_be_drawn_from_the_energies_posterior_alone(tmp_path):
    training = "{batch_size: 8, num_epochs: 1, uncertainty_forces: false}"
    summary = " ".join(_train(tmp_path, SMALL_SOAP, training).stdout.split())
    assert "an ensemble of 16 sampled from it, its spread calibrated on the validation forces" in summary
    assert "posterior of the energies and forces" not in summary


def test_uncertainty_asked_of_an_architecture_without_features_is_refused(tmp_path):
    options = write_options(tmp_path, emt_options("name: composition", "{num_epochs: 1, uncertainty: true}"))
    result = run_mtt("train", str(options), cwd=tmp_path)
    assert result.returncode != 0
    assert "uncertainty is true, but the 'composition' architecture offers no last-layer features" in result.stderr
    assert not (tmp_path / "outputs").exists() and not (tmp_path / "model.pt").exists()


def test_two_ranks_fit_the_uncertainty_of_one_process(tmp_path):
    """The covariance is summed over ranks: 2 ranks with batch 4 fit what one process with batch 8 fits."""
    states = []
    for ranks, batch in [(1, 8), (2, 4)]:
        folder = tmp_path / f"ranks{ranks}"
        folder.mkdir()
        options = write_options(folder, emt_options(SMALL_SOAP, f"{{batch_size: {batch}, num_epochs: 2}}", seed=4))
        if ranks == 1:
            result = run_mtt("train", str(options), cwd=folder)
        else:
            result = torchrun_train(options, folder, ranks)
        assert result.returncode == 0, result.stderr
        (checkpoint,) = folder.glob("outputs/*/*/model.ckpt")
        states.append(torch.load(checkpoint, weights_only=True)["best_model_state"])
    one, two = states
    assert float(one["uncertainty.factors"][0]) > 0
    torch.testing.assert_close(two["uncertainty.factors"], one["uncertainty.factors"], rtol=1e-6, atol=0)
    torch.testing.assert_close(two["uncertainty.inverse"], one["uncertainty.inverse"], rtol=1e-5, atol=1e-9)
    # the atoms' local posterior too
    assert float(one["uncertainty.local_factors"][0]) > 0
    torch.testing.assert_close(two["uncertainty.local_factors"], one["uncertainty.local_factors"], rtol=1e-6, atol=0)
    torch.testing.assert_close(two["uncertainty.local_inverse"], one["uncertainty.local_inverse"], rtol=1e-5, atol=1e-9)
    # the same members, their spread scaled on the forces of both ranks' validation structures
    assert one["uncertainty.ensemble"].shape[-1] == 16  # the default size
    assert float(one["uncertainty.ensemble"].abs().max()) > 0
    torch.testing.assert_close(two["uncertainty.ensemble"], one["uncertainty.ensemble"], rtol=1e-5, atol=1e-9)


def test_calibration_figures_of_known_distributions():
    generator = torch.Generator().manual_seed(0)
    deviations = torch.rand(20000, generator=generator, dtype=torch.float64) + 0.1
    errors = torch.randn(20000, generator=generator, dtype=torch.float64) * deviations
    calibrated = calibration_figures(errors, deviations)
    assert calibrated["miscalibration_area"] < 0.01
    assert calibrated["spearman"] > 0.3
    overconfident = calibration_figures(errors, deviations / 3)
    assert overconfident["miscalibration_area"] > 0.2 and overconfident["nll"] > calibrated["nll"]
    assert calibration_figures(errors, torch.full_like(deviations, 0.6))["spearman"] == pytest.approx(0, abs=0.05)
    for predicted, observed, count in binned_calibration(errors, deviations):
        assert count == 2000 and observed == pytest.approx(predicted, rel=0.1)


def _without_uncertainty(checkpoint: Path, to: Path) -> Path:
    """The checkpoint as an mtt from before uncertainties wrote it: no uncertainty entries."""
    content = torch.load(checkpoint, weights_only=True)
    for key in ("best_model_state", "model_state"):
        content[key] = {name: value for name, value in content[key].items() if not name.startswith("uncertainty.")}
    torch.save(content, to)
    return to


def test_calibrate_fits_a_trained_model_as_its_training_would_have(tmp_path):
    """`mtt calibrate` of a checkpoint of an earlier mtt, with the options of its run, fits
    the uncertainty its training fits today, bit for bit, and leaves the checkpoint alone."""
    trained = tmp_path / "trained"
    _train(trained, SMALL_SOAP, "{batch_size: 8, num_epochs: 2}")
    (checkpoint,) = trained.glob("outputs/*/*/model.ckpt")
    old = _without_uncertainty(checkpoint, tmp_path / "old.ckpt")
    before = old.read_bytes()
    result = run_mtt("calibrate", str(old), "options.yaml", "-o", str(tmp_path / "calibrated.pt"), cwd=trained)
    assert result.returncode == 0, result.stderr
    assert "uncertainty: energy from 99 last-layer features" in result.stdout
    assert old.read_bytes() == before
    fitted = torch.load(checkpoint, weights_only=True)["best_model_state"]
    (new,) = [p for p in trained.glob("outputs/*/*/model.ckpt") if p != checkpoint]
    calibrated = torch.load(new, weights_only=True)["best_model_state"]
    for name in (
        "uncertainty.inverse",
        "uncertainty.factors",
        "uncertainty.ensemble",
        "uncertainty.local_inverse",
        "uncertainty.local_factors",
    ):
        torch.testing.assert_close(calibrated[name], fitted[name], rtol=1e-9, atol=0)
    for name, value in fitted.items():  # the weights are the checkpoint's
        if not name.startswith("uncertainty."):
            assert torch.equal(calibrated[name], value), name
    figures = _uncertainties(tmp_path / "calibrated.pt")
    assert figures["both"]["energy_uncertainty"] == _uncertainties(trained / "model.pt")["both"]["energy_uncertainty"]
    assert "energy_ensemble" in figures["outputs"]


@pytest.mark.parametrize(
    "problem, message",
    [
        ("element", "the datasets contain Ag, which the model of"),
        ("target", "the datasets give target 'charge', which the model of"),
        ("architecture", "holds a 'soap_bpnn' model, but the options' architecture.name is 'equivariant_mp'"),
    ],
)
def test_calibrate_refuses_what_it_cannot_fit(tmp_path, problem, message):
    """With the options of a run trained without uncertainty, changed in one way each."""
    trained = tmp_path / "trained"
    _train(trained, SMALL_SOAP, "{batch_size: 8, num_epochs: 1, uncertainty: false}")
    (checkpoint,) = trained.glob("outputs/*/*/model.ckpt")
    options = (trained / "options.yaml").read_text()
    folder = tmp_path / "calibrate"
    folder.mkdir()
    overrides = []
    if problem == "element":
        frames = ase.io.read(EMT_DATA, ":")
        for atoms in frames[:3]:
            atoms.numbers[0] = 47
        ase.io.write(folder / "with_silver.xyz", frames)
        options = options.replace(str(EMT_DATA), str(folder / "with_silver.xyz"))
        assert "with_silver.xyz" in options
    elif problem == "target":
        frames = ase.io.read(EMT_DATA, ":")
        for atoms in frames:
            atoms.info["charge"] = 0.0
        ase.io.write(folder / "charged.xyz", frames)
        targets = "energy: {key: energy, unit: eV}\ncharge: {key: charge, unit: e}"
        options = emt_options(SMALL_SOAP, "{batch_size: 8}", targets=targets, seed=3)
        options = options.replace(str(EMT_DATA), str(folder / "charged.xyz"))
    else:
        options = emt_options(SMALL_MP, "{batch_size: 8}", seed=3)
    (folder / "options.yaml").write_text(options)
    result = run_mtt("calibrate", str(checkpoint), "options.yaml", *overrides, cwd=folder)
    assert result.returncode != 0
    assert message in " ".join(result.stderr.split()), result.stderr
    assert not (folder / "model.pt").exists()
