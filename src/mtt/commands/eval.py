"""`mtt eval`: predictions of a trained model on datasets, errors and parity plots."""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import ase
import ase.io
import torch
from ase.calculators.singlepoint import SinglePointCalculator
from ase.data import chemical_symbols
from metatomic.torch import ModelOutput

from ..data.batching import Batch, batch_indices, compute_neighbor_lists, make_batch
from ..data.dataset import DatasetInfo
from ..data.readers import Structure
from ..data.structure_sets import StructureSet
from ..errors import DataError, EnvironmentProblem
from ..inference import EvaluatedModel, load_trained_model
from ..outputs.display import display
from ..outputs.logs import LOGGER, setup_logging
from ..training.loss import Metrics, Term, term_label, terms_of, with_reference
from ..training.predictions import Predictions, predict
from ..training.shallow_ensemble import member_gradients
from ..training.uncertainty import binned_calibration, calibration_figures
from .eval_sets import sets_to_evaluate


def _check_elements(model: EvaluatedModel, structures: StructureSet) -> None:
    known = set(model.atomic_types)
    unknown = {z for z, n in structures.type_counts().items() if n > 0} - known
    if unknown:
        path, index, present = structures.first_with(unknown)
        names = ", ".join(f"{chemical_symbols[z]} (Z={z})" for z in present)
        raise DataError(
            f"structure {index} of '{path}' contains {names}, which the model was not trained on.",
            hint=f"The model knows {', '.join(chemical_symbols[z] for z in sorted(known))}.",
        )


def _check_targets(model: EvaluatedModel, reference: DatasetInfo, where: str) -> None:
    for name, target in reference.targets.items():
        if name not in model.targets:
            raise DataError(
                f"'{where}' asks for target '{name}', which the model does not predict.",
                hint=f"The model predicts: {', '.join(model.targets) or 'nothing mtt can compare'}.",
            )
        if model.targets[name].per_atom != target.per_atom:
            kind = "per atom" if model.targets[name].per_atom else "per structure"
            raise DataError(
                f"'{where}' reads target '{name}' {'per atom' if target.per_atom else 'per structure'}, "
                f"but the model predicts it {kind}.",
                hint="Set the target's sample_kind in the dataset options to the model's.",
            )


def _to_atoms(structure: Structure, predictions: dict[str, torch.Tensor]) -> ase.Atoms:
    atoms = ase.Atoms(
        numbers=structure.types.numpy(),
        positions=structure.positions.numpy(),
        cell=structure.cell.numpy(),
        pbc=structure.pbc.numpy(),
    )
    results = {k: v for k, v in predictions.items() if k in ("energy", "forces", "stress")}
    for key, value in predictions.items():
        if key not in results:
            atoms.info[key] = value
    if results:
        atoms.calc = SinglePointCalculator(atoms, **results)
    return atoms


def _parity_plot(reference: torch.Tensor, predicted: torch.Tensor, term: Term, rmse: float, path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as error:
        raise EnvironmentProblem("--plots needs matplotlib.", hint="pip install matplotlib") from error
    shown_rmse, unit = display(rmse, term.unit + ("/atom" if term.per_atom else ""))
    scale, _ = display(1.0, term.unit)
    figure, axes = plt.subplots(figsize=(4.5, 4.5), layout="constrained")
    x, y = reference.numpy() * scale, predicted.numpy() * scale
    low, high = float(min(x.min(), y.min())), float(max(x.max(), y.max()))
    axes.plot([low, high], [low, high], color="grey", linewidth=1)
    axes.scatter(x, y, s=8, alpha=0.6)
    label = f"{term.label} per atom" if term.per_atom else term.label
    per = unit.split("/atom")[0] if term.per_atom else unit
    axes.set_xlabel(f"reference {label} [{per}]")
    axes.set_ylabel(f"predicted {label} [{per}]")
    axes.set_title(f"{label}: RMSE {shown_rmse:.4g} {unit}")
    figure.savefig(path, dpi=120)
    plt.close(figure)


def evaluate(model_path: str, options_path: str | None, output: str, plots: bool, batch_size: int) -> None:
    setup_logging(None)
    model_file, sets = sets_to_evaluate(model_path, options_path)
    model = load_trained_model(model_file)
    output_path = Path(output)
    for number, chosen in enumerate(sets):
        LOGGER.info("evaluating %s on %s", model_file, chosen.description)
        reference = DatasetInfo(atomic_types=model.atomic_types, targets={t.name: t for t in chosen.targets})
        _check_elements(model, chosen.structures)
        _check_targets(model, reference, options_path or model_path)
        target_file = output_path
        if len(sets) > 1:
            target_file = output_path.with_name(f"{output_path.stem}_{number}{output_path.suffix}")
        _evaluate_dataset(model, chosen.structures, reference, chosen.name, target_file, plots, batch_size)


def _evaluate_dataset(
    model: EvaluatedModel,
    structures: StructureSet,
    reference: DatasetInfo,
    name: str,
    target_file: Path,
    plots: bool,
    batch_size: int,
) -> None:
    info = model.info(periodic=structures.periodic())
    requests = model.requested_neighbor_lists()
    needs_forces, needs_stress = info.needs_forces, info.needs_stress
    terms = terms_of(reference)
    metrics = Metrics(terms)
    pairs: dict[str, tuple[list, list]] = {t.label: ([], []) for t in terms}
    # energies with an uncertainty, and those whose ensemble gives their forces' one
    uncertain = {t: output for t, output in model.uncertainties.items() if t in info.targets}
    spread = {t: output for t, output in model.ensembles.items() if t in info.targets and info.targets[t].forces}
    collected = _Collected()
    started = time.monotonic()
    target_file.parent.mkdir(parents=True, exist_ok=True)
    target_file.write_text("")  # the predictions are appended batch by batch
    batches = batch_indices(len(structures), batch_size, None)
    bar = None
    if sys.stdout.isatty() and len(batches) > 1:
        from tqdm import tqdm

        bar = tqdm(total=len(structures), unit="structure", desc=f"evaluating {name}")
    for count, indices in enumerate(batches, start=1):
        chosen = structures.read(indices)
        compute_neighbor_lists(chosen, requests)
        batch = make_batch(chosen, model.dtype, torch.device("cpu"), needs_forces, needs_stress, flat=False)
        computed = predict(model, batch, info, create_graph=False)
        predictions = Predictions(
            *({k: v.detach() for k, v in part.items()} for part in (computed.values, computed.forces, computed.stress))
        )
        metrics.update(predictions, batch)
        frames = _frames_of(chosen, predictions, info, reference)
        _collect_uncertainties(model, batch, predictions, frames, uncertain, spread, collected)
        for term in terms:
            if term.target not in getattr(batch, term.kind):  # no structure of the batch has it
                continue
            pairs[term.label][0].append(_flat(term, getattr(batch, term.kind)[term.target], batch))
            pairs[term.label][1].append(_flat(term, getattr(predictions, term.kind)[term.target], batch))
        ase.io.write(target_file, frames, format="extxyz", append=True)
        if bar is not None:
            bar.update(len(chosen))
        elif len(batches) >= 10 and count % (len(batches) // 10) == 0:
            LOGGER.info("evaluated %d/%d structures", min(count * batch_size, len(structures)), len(structures))
    if bar is not None:
        bar.close()
    elapsed = time.monotonic() - started

    LOGGER.info(
        "%s: %d structures in %.2f s (%.1f structures/s); predictions written to %s",
        name,
        len(structures),
        elapsed,
        len(structures) / max(elapsed, 1e-9),
        target_file,
    )
    if terms:
        _print_table(metrics)
    collected.report(target_file if plots else None)
    if plots and not terms:
        LOGGER.info(
            "no parity plot: %s gives no reference values (no targets), so there is nothing to plot the "
            "predictions against; name the targets of the file in the options to get one",
            name,
        )
    if plots and terms:
        results = metrics.results()
        for term in terms:
            key = f"{term.label}_per_atom" if term.per_atom else term.label
            # a variant's "/" (energy/xtb) cannot be in a file name
            plot = target_file.with_name(f"{target_file.stem}_parity_{term.label.replace('/', '_')}.png")
            reference_values, predicted_values = (torch.cat(p) for p in pairs[term.label])
            _parity_plot(reference_values, predicted_values, term, results[f"{key}_rmse"], plot)
            LOGGER.info("parity plot of %s written to %s", term.label, plot)


def _flat(term: Term, values: torch.Tensor, batch: Batch) -> torch.Tensor:
    """The numbers of a parity plot: per atom for energies, of the structures with a reference."""
    values = values.detach().double().reshape(len(values), -1)
    if term.per_atom:
        values = values / batch.n_atoms[:, None]
    return with_reference(term, values, batch).reshape(-1)


def _frames_of(
    structures: list[Structure], predictions: Predictions, info: DatasetInfo, reference: DatasetInfo
) -> list[ase.Atoms]:
    """The structures with the predictions (energy, forces and stress as ASE's results) and,
    beside them, the reference values of the dataset as reference_<name> (in eV and Å)."""
    frames, first_atom = [], 0
    for i, structure in enumerate(structures):
        values, per_atom = {}, {}
        atoms_of = slice(first_atom, first_atom + len(structure))
        for name, target in info.targets.items():
            if target.per_atom:
                per_atom[name] = _plain(predictions.values[name][atoms_of])
            else:
                values[name] = _plain(predictions.values[name][i])
            prefix = "" if name == "energy" else f"{name}_"
            if name in predictions.forces:
                values[f"{prefix}forces"] = predictions.forces[name][first_atom : first_atom + len(structure)].numpy()
            if name in predictions.stress:
                values[f"{prefix}stress"] = predictions.stress[name][i].numpy()
        first_atom += len(structure)
        atoms = _to_atoms(structure, values)
        for name, array in per_atom.items():
            atoms.arrays[name] = array
        for name, target in reference.targets.items():
            if name in structure.values:
                value = _plain(structure.values[name])
                if target.per_atom:
                    atoms.arrays[f"reference_{name}"] = value
                else:
                    atoms.info[f"reference_{name}"] = value
            if name in structure.forces:
                atoms.arrays[f"reference_{term_label(name, 'forces')}"] = structure.forces[name].numpy()
            if name in structure.stress:
                atoms.info[f"reference_{term_label(name, 'stress')}"] = structure.stress[name].numpy()
        frames.append(atoms)
    return frames


def _plain(values: torch.Tensor):
    """A float for one number, else a NumPy array (a row per atom, one column for scalars)."""
    values = values.detach()
    if values.numel() == 1 and values.dim() <= 1:
        return float(values.reshape(()))
    array = values.numpy()
    return array[:, 0] if array.ndim == 2 and array.shape[1] == 1 else array


def _print_table(metrics: Metrics) -> None:
    results, units = metrics.results(), metrics.units()
    rows = [("quantity", "RMSE", "MAE", "unit")]
    for term in metrics.terms:
        key = f"{term.label}_per_atom" if term.per_atom else term.label
        rmse, unit = display(results[f"{key}_rmse"], units[f"{key}_rmse"])
        mae, _ = display(results[f"{key}_mae"], units[f"{key}_mae"])
        rows.append((key.replace("_", " "), f"{rmse:.5g}", f"{mae:.5g}", unit))
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    for row in rows:
        LOGGER.info(
            "  ".join(
                cell.ljust(width) if i in (0, 3) else cell.rjust(width)
                for i, (cell, width) in enumerate(zip(row, widths))
            )
        )


@dataclass
class _Collected:
    """Errors and predicted deviations of a set, batch by batch, for each quantity with an
    uncertainty: per structure (what is ranked and binned) and per number (what the
    Gaussian figures are of: a structure's energy, or each force component)."""

    per_structure: dict[str, tuple[list, list]] = field(default_factory=dict)
    per_number: dict[str, tuple[list, list]] = field(default_factory=dict)

    def add(
        self, label: str, structures: tuple[torch.Tensor, torch.Tensor], numbers: tuple[torch.Tensor, torch.Tensor]
    ):
        for collection, (errors, deviations) in ((self.per_structure, structures), (self.per_number, numbers)):
            errors_so_far, deviations_so_far = collection.setdefault(label, ([], []))
            errors_so_far.append(errors.reshape(-1))
            deviations_so_far.append(deviations.reshape(-1))

    def report(self, plot_next_to: Path | None) -> None:
        for label, (errors, deviations) in self.per_structure.items():
            numbers = [torch.cat(part) for part in self.per_number[label]]
            _report_uncertainty(label, (torch.cat(errors), torch.cat(deviations)), numbers, plot_next_to)


def _collect_uncertainties(
    model: EvaluatedModel,
    batch: Batch,
    predictions: Predictions,
    frames: list[ase.Atoms],
    uncertain: dict[str, str],
    spread: dict[str, str],
    collected: _Collected,
) -> None:
    """The predicted uncertainties of a batch into its frames, and beside its errors where
    the set has references: energies' from their uncertainty output, forces' from the
    spread of their ensemble members' forces."""
    if not uncertain and not spread:
        return
    # one pass of the model for every uncertainty, the members' forces from its graph
    requested = {
        output: ModelOutput(unit="eV", sample_kind="system") for output in (*uncertain.values(), *spread.values())
    }
    computed = model(batch.systems, requested)
    for target, output in uncertain.items():
        deviation = computed[output].block().values.detach().double().reshape(-1)
        for frame, value in zip(frames, deviation.tolist()):
            frame.info[output.replace("/", "_")] = value
        if target in batch.values:
            has = batch.has(target, "values")
            error = predictions.values[target].double().reshape(-1) - batch.values[target].double().reshape(-1)
            collected.add(target, (error[has], deviation[has]), (error[has], deviation[has]))
    structure_of_atom = torch.repeat_interleave(torch.arange(len(batch)), batch.n_atoms)
    for target, output in spread.items():
        gradients = member_gradients(computed[output].block().values, batch.positions)
        members = -torch.cat([gradient.detach() for gradient in gradients], 1).double()  # (members, atoms, 3)
        deviation = members.std(0)  # (atoms, 3)
        label = term_label(target, "forces")
        per_atom = torch.sqrt((deviation**2).mean(1))
        per_structure = torch.sqrt(
            torch.zeros(len(batch), dtype=torch.float64).index_add(0, structure_of_atom, (deviation**2).mean(1))
            / batch.n_atoms.double()
        )
        first = 0
        for frame, value in zip(frames, per_structure.tolist()):
            frame.info[f"{label}_uncertainty"] = value
            frame.arrays[f"{label}_uncertainty"] = per_atom[first : first + len(frame)].numpy()
            first += len(frame)
        if target not in batch.forces:
            continue
        has = batch.has(target, "forces")
        error = predictions.forces[target].double() - batch.forces[target].double()
        squared = torch.zeros(len(batch), dtype=torch.float64).index_add(0, structure_of_atom, (error**2).mean(1))
        rmse = torch.sqrt(squared / batch.n_atoms.double())
        atoms = has[structure_of_atom]
        collected.add(label, (rmse[has], per_structure[has]), (error[atoms], deviation[atoms]))


def _report_uncertainty(
    label: str,
    per_structure: tuple[torch.Tensor, torch.Tensor],
    per_number: list[torch.Tensor],
    plot_next_to: Path | None,
) -> None:
    """How the predicted uncertainty of an energy, or of forces, describes its errors on
    this set: ranked and binned per structure (a structure's force RMSE against its
    force uncertainty), the Gaussian figures per number (each force component)."""
    errors, deviations = per_structure
    ranked = calibration_figures(errors, deviations)
    figures = calibration_figures(*per_number)
    forces = label.endswith("forces")
    scale, unit = display(1.0, "eV/A" if forces else "eV")
    LOGGER.info(
        "%s uncertainty on %d structures: rank correlation with |error| (Spearman) %.3f, negative "
        "log-likelihood %.4g (%s), miscalibration area %.3f (0: calibrated)",
        label,
        len(errors),
        ranked["spearman"],
        figures["nll"],
        "per force component, in eV/A" if forces else "energies in eV",
        figures["miscalibration_area"],
    )
    bins = binned_calibration(errors, deviations)
    LOGGER.info("  %-22s %-16s %s", f"predicted [{unit}]", f"observed RMSE [{unit}]", "structures")
    for predicted, observed, count in bins:
        LOGGER.info("  %-22.4g %-16.4g %d", predicted * scale, observed * scale, count)
    if plot_next_to is None:
        return
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as error:
        raise EnvironmentProblem("--plots needs matplotlib.", hint="pip install matplotlib") from error
    figure, axes = plt.subplots(figsize=(4.5, 4.5), layout="constrained")
    x = [b[0] * scale for b in bins]
    y = [b[1] * scale for b in bins]
    high = max(x + y)
    axes.plot([0, high], [0, high], color="grey", linewidth=1, label="calibrated")
    axes.plot(x, y, marker="o", label="observed")
    axes.set_xlabel(f"predicted {label} uncertainty [{unit}]")
    axes.set_ylabel(f"observed {label} RMSE [{unit}]")
    axes.set_title(f"miscalibration area {figures['miscalibration_area']:.3f}, Spearman {ranked['spearman']:.2f}")
    axes.legend()
    path = plot_next_to.with_name(f"{plot_next_to.stem}_calibration_{label.replace('/', '_')}.png")
    figure.savefig(path, dpi=120)
    plt.close(figure)
    LOGGER.info("calibration plot of the %s uncertainty written to %s", label, path)
