"""`mtt learn`: grow a dataset where the model is unsure, round by round.

learn options -> training options -> start data -> round 0 (the starting model) -> rounds
of explore (MD with the model) -> select (the most uncertain frames, diverse) -> label
(the reference method) -> train (`mtt train`, fine-tuned on the grown set) -> test errors;
after the last round, a final training from scratch on the whole dataset.
Every stage writes its files whole and is recorded as done, so ``--restart auto``
continues an interrupted run at the stage it stopped in, labelling nothing twice.
"""

from __future__ import annotations

import csv
import errno
import io
import math
import shutil
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import ase
import ase.io
import numpy as np
import yaml

from ..config import load_options
from ..data.dataset import load_splits
from ..data.readers import read_frames
from ..errors import DataError, EnvironmentProblem, OptionsError
from ..learning.explore import MDSettings, explore
from ..learning.label import label, make_calculator
from ..learning.options import LearnOptions, load_learn_options
from ..learning.predictor import UncertainForces, check_elements
from ..learning.rounds import RoundState, learned_block, round_options, train_round, write_text, write_whole
from ..learning.select import select
from ..outputs.logs import LOGGER, setup_logging
from ..schema import to_plain


@dataclass
class RoundRow:
    """One row of learning.csv, and of the table printed as the rounds finish."""

    round: int | str  # "final" for the final training
    structures: int  # labelled structures the round's model was trained on
    added: int
    frames: int  # MD frames considered
    above_threshold: int | str  # "-" for the starting model
    stopped_early: int | str  # MD starts stopped by the uncertainty or a physical check
    label_failed: int
    md_uncertainty: float  # median force uncertainty of the considered frames, eV/Å
    test_energy_rmse: float  # meV/atom
    test_force_rmse: float  # eV/Å
    test_force_uncertainty: float  # RMS predicted force uncertainty of the test set, eV/Å
    explore_s: float
    select_s: float
    label_s: float
    train_s: float


COLUMNS = [
    ("round", "round", "{}"),
    ("structures", "structures", "{:d}"),
    ("added", "added", "{:d}"),
    ("above_threshold", "above thr.", "{}"),
    ("stopped_early", "MD stopped", "{}"),
    ("label_failed", "failed", "{:d}"),
    ("md_uncertainty", "MD unc. [eV/Å]", "{:.3f}"),
    ("test_energy_rmse", "test E [meV/at]", "{:.2f}"),
    ("test_force_rmse", "test F [eV/Å]", "{:.3f}"),
    ("test_force_uncertainty", "test unc. [eV/Å]", "{:.3f}"),
    ("explore_s", "explore [s]", "{:.0f}"),
    ("label_s", "label [s]", "{:.0f}"),
    ("train_s", "train [s]", "{:.0f}"),
]


#: explore.max_uncertainty: auto, over the model's median force uncertainty at the starts and
#: over the selection threshold (the larger of the two)
AUTO_MAX_OVER_STARTS = 3.0
AUTO_MAX_OVER_THRESHOLD = 5.0

#: the round name and folder of the final training
FINAL = "final"


@dataclass
class StartData:
    """What the loop needs of the starting training set, read once."""

    raw: dict  # the composed training options
    atomic_types: set[int]
    count: int  # structures of the training set
    force_rms: float  # of the reference forces, eV/Å
    stress: bool  # the energy is learned with stress


def learn(path: str, overrides: list[str], restart: str | None) -> None:
    setup_logging(None)
    if restart not in (None, "auto"):
        raise OptionsError(f"--restart {restart}: mtt learn continues its own folder only.", hint="Use --restart auto.")
    learn = load_learn_options(path, overrides)
    folder = Path(learn.folder)
    if (folder / "learn.yaml").exists() and restart is None:
        raise OptionsError(
            f"'{folder}' already holds an mtt learn run.",
            hint=f"Continue it with `mtt learn {path} --restart auto`, or set folder= to start another.",
        )
    if restart and not (folder / "learn.yaml").exists():
        raise OptionsError(f"--restart auto: '{folder}' holds no mtt learn run to continue.")
    start = _start_data(learn)
    starts = read_frames(Path(learn.explore.start))
    check_elements(starts, start.atomic_types, learn.explore.start)
    test = _read_test_set(learn.test_set) if learn.test_set else None
    if test is not None:
        check_elements(test, start.atomic_types, learn.test_set)
    make_calculator(learn.label.calculator, learn.label.parameters)  # a bad path or parameters fail now
    if learn.model is not None:  # refused now when it has no force uncertainty, or lacks the starts' elements
        UncertainForces(learn.model).check_elements(starts, learn.explore.start)
    threshold = start.force_rms / 10 if learn.select.threshold == "auto" else learn.select.threshold

    folder.mkdir(parents=True, exist_ok=True)
    write_text(folder / "learn.yaml", yaml.safe_dump(to_plain(learn), sort_keys=False))
    LOGGER.info(
        "mtt learn: %d rounds in %s, from %d structures; MD from %d starts of %s; frames above %.3g eV/Å "
        "force uncertainty are candidates%s",
        learn.rounds,
        folder,
        start.count,
        len(starts),
        learn.explore.start,
        threshold,
        " (auto: a tenth of the RMS of the reference forces)" if learn.select.threshold == "auto" else "",
    )
    try:
        rows = _run_rounds(learn, start, starts, test, threshold)
    except KeyboardInterrupt as interrupted:
        raise KeyboardInterrupt(
            f"{interrupted or 'mtt learn was stopped'}; continue with `mtt learn {path} --restart auto` "
            "(what was labelled is kept)"
        ) from None
    except OSError as error:
        if error.errno != errno.ENOSPC:
            raise
        raise EnvironmentProblem(
            f"the disk is full ({error.filename or folder}).",
            hint=f"Free some space, then continue with `mtt learn {path} --restart auto`: nothing labelled is lost.",
        ) from error
    final = rows[-1].round == FINAL
    rounds = rows[-2].round if final else rows[-1].round
    best = folder / (FINAL if final else f"round_{rounds}") / "model.pt"
    LOGGER.info(
        "%d structures labelled in %d rounds; the %s model is %s, the dataset %s",
        rows[-1].structures - start.count,
        rounds,
        "final" if final else "last round's",
        best,
        folder / "dataset.xyz",
    )


def _run_rounds(
    learn: LearnOptions,
    start: StartData,
    starts: list[ase.Atoms],
    test: list[ase.Atoms] | None,
    threshold: float,
) -> list[RoundRow]:
    folder = Path(learn.folder)
    _print_header()
    rows = [_round_zero(learn, start, test)]
    _print_row(rows[-1])
    learned: list[dict] = []
    for number in range(1, learn.rounds + 1):
        row, labelled = _round(learn, number, start, starts, test, threshold, learned, rows[-1])
        rows.append(row)
        _print_row(row)
        _write_results(folder, rows, test is not None)
        if labelled is not None:
            learned.append(learned_block(labelled, start.stress))
        if row.above_threshold == 0:
            LOGGER.info(
                "no MD frame of round %d is above the threshold (%.3g eV/Å): the model is sure of everything its "
                "MD visited; stopping (raise explore.temperature or explore.steps to explore further)",
                number,
                threshold,
            )
            break
    final = _final_training(learn, start, learned, test, rows[-1])
    if final is not None:
        rows.append(final)
        _print_row(final)
    _write_results(folder, rows, test is not None)
    frames = [a for block in learned for a in ase.io.read(block["systems"]["read_from"], ":")]
    write_whole(folder / "dataset.xyz", lambda p: ase.io.write(p, frames, format="extxyz"))
    return rows


def _round_zero(learn: LearnOptions, start: StartData, test: list[ase.Atoms] | None) -> RoundRow:
    folder = Path(learn.folder) / "round_0"
    folder.mkdir(parents=True, exist_ok=True)
    state = RoundState(folder)
    if not state.done("train"):
        started = time.monotonic()
        if learn.model is not None:
            checkpoint = Path(learn.model)
            model = UncertainForces(checkpoint)  # refused here when it has no force uncertainty
            model_file = checkpoint
        else:
            checkpoint, model_file = train_round(
                folder, round_options(start.raw, [], None), [], learn.train.launcher, "round 0"
            )
            model = UncertainForces(checkpoint)
        state.finish(
            "train", {"checkpoint": str(checkpoint), "model": str(model_file), "seconds": time.monotonic() - started}
        )
    else:
        model = UncertainForces(state.stages["train"]["checkpoint"])
    errors = _test_errors(model, test)
    return RoundRow(0, start.count, 0, 0, "-", "-", 0, math.nan, *errors, 0, 0, 0, state.stages["train"]["seconds"])


def _round(
    learn: LearnOptions,
    number: int,
    start: StartData,
    starts: list[ase.Atoms],
    test: list[ase.Atoms] | None,
    threshold: float,
    learned: list[dict],
    previous: RoundRow,
) -> tuple[RoundRow, Path | None]:
    top = Path(learn.folder)
    folder = top / f"round_{number}"
    folder.mkdir(parents=True, exist_ok=True)
    state = RoundState(folder)
    previous_checkpoint = Path(RoundState(top / f"round_{number - 1}").stages["train"]["checkpoint"])
    model = UncertainForces(previous_checkpoint)
    model.check_elements(starts, learn.explore.start)

    if not state.done("explore"):
        started = time.monotonic()
        max_uncertainty = _max_uncertainty(learn, model, starts, threshold, number)
        settings = MDSettings(
            learn.temperature(number),
            learn.explore.steps,
            learn.explore.timestep,
            learn.explore.friction,
            learn.explore.every,
            max_uncertainty,
            learn.explore.min_distance,
        )
        found = explore(model, starts, settings, np.random.default_rng([learn.seed, number]))
        for stop in found.stops:
            first = {0: " at its start", 1: " at its first step"}.get(stop.step, f" at step {stop.step}")
            LOGGER.info("round %d: the MD from start %d stopped%s: %s", number, stop.start, first, stop.reason)
        exploded = [stop for stop in found.stops if stop.step <= 1]
        if len(exploded) == len(starts) and not found.candidates:
            raise DataError(
                f"round {number}: the MD of every start of {learn.explore.start} stopped at its first step "
                "(reasons above), and left nothing to label.",
                hint="Check the starting structures (overlapping atoms?), lower explore.timestep or "
                "explore.temperature, or raise explore.max_uncertainty.",
            )
        write_whole(folder / "candidates.xyz", lambda p: ase.io.write(p, found.candidates, format="extxyz"))
        write_text(folder / "md_trace.csv", _trace_csv(found.trace))
        uncertainties = [a.info["force_uncertainty"] for a in found.candidates]
        state.finish(
            "explore",
            {
                "frames": len(found.candidates),
                "above_threshold": sum(u > threshold for u in uncertainties),
                "stopped_early": len(found.stops),
                "md_uncertainty": float(np.median(uncertainties)) if uncertainties else math.nan,
                "temperature": settings.temperature,
                "max_uncertainty": max_uncertainty,
                "seconds": time.monotonic() - started,
            },
        )
    explored = state.stages["explore"]

    if not state.done("select"):
        started = time.monotonic()
        candidates = ase.io.read(folder / "candidates.xyz", ":") if explored["frames"] else []
        chosen = select(candidates, threshold, learn.select.max_per_round, learn.select.min_difference)
        for atoms in chosen:
            atoms.calc = None
        write_whole(folder / "selected.xyz", lambda p: ase.io.write(p, chosen, format="extxyz"))
        state.finish("select", {"selected": len(chosen), "seconds": time.monotonic() - started})

    if not state.done("label"):
        started = time.monotonic()
        selected = ase.io.read(folder / "selected.xyz", ":") if state.stages["select"]["selected"] else []
        done = label(
            selected, folder / "labelled", learn.label.calculator, learn.label.parameters, learn.label.processes
        )
        for index, why in sorted(done.failures.items()):
            LOGGER.info("round %d: structure %d of selected.xyz was not labelled: %s", number, index, why)
        write_whole(folder / "labelled.xyz", lambda p: ase.io.write(p, done.done, format="extxyz"))
        state.finish(
            "label",
            {"labelled": len(done.done), "failed": len(done.failures), "seconds": time.monotonic() - started},
        )
    labelled = state.stages["label"]
    labelled_file = folder / "labelled.xyz" if labelled["labelled"] else None
    grown = learned + ([learned_block(labelled_file, start.stress)] if labelled_file else [])

    if not state.done("train"):
        started = time.monotonic()
        if labelled_file is None:  # nothing new: the previous model stays
            checkpoint, model_file = (
                previous_checkpoint,
                RoundState(top / f"round_{number - 1}").stages["train"]["model"],
            )
        else:
            finetune = previous_checkpoint if learn.train.mode == "finetune" else None
            checkpoint, model_file = train_round(
                folder,
                round_options(start.raw, grown, finetune),
                learn.train.overrides,
                learn.train.launcher,
                f"round {number}",
            )
        state.finish(
            "train", {"checkpoint": str(checkpoint), "model": str(model_file), "seconds": time.monotonic() - started}
        )
    errors = _test_errors(UncertainForces(state.stages["train"]["checkpoint"]), test)
    row = RoundRow(
        number,
        previous.structures + labelled["labelled"],
        labelled["labelled"],
        explored["frames"],
        explored["above_threshold"],
        explored["stopped_early"],
        labelled["failed"],
        explored["md_uncertainty"],
        *errors,
        explored["seconds"],
        state.stages["select"]["seconds"],
        labelled["seconds"],
        state.stages["train"]["seconds"],
    )
    return row, labelled_file


def _final_training(
    learn: LearnOptions, start: StartData, learned: list[dict], test: list[ase.Atoms] | None, last: RoundRow
) -> RoundRow | None:
    """A model trained from scratch on the whole dataset with the starting options: a
    fine-tuned round keeps only part of what its new structures are worth, and a few
    epochs a round cannot make up for the full training a production model gets."""
    if learn.train.final == "none" or learn.train.mode == "retrain" or not learned:
        return None
    folder = Path(learn.folder) / FINAL
    planned = {"after_round": last.round, "structures": last.structures}
    if folder.exists() and RoundState(folder).stages.get("planned") != planned:
        shutil.rmtree(folder)  # trained (or begun) on the dataset of fewer rounds: it would be stale
    folder.mkdir(parents=True, exist_ok=True)
    state = RoundState(folder)
    if not state.done("planned"):
        state.finish("planned", planned)
    if not state.done("train"):
        LOGGER.info("final training: from scratch on all %d structures, with the starting options", last.structures)
        started = time.monotonic()
        checkpoint, model_file = train_round(
            folder, round_options(start.raw, learned, None), [], learn.train.launcher, "the final training"
        )
        state.finish(
            "train", {"checkpoint": str(checkpoint), "model": str(model_file), "seconds": time.monotonic() - started}
        )
    errors = _test_errors(UncertainForces(state.stages["train"]["checkpoint"]), test)
    seconds = state.stages["train"]["seconds"]
    return RoundRow(FINAL, last.structures, 0, 0, "-", "-", 0, math.nan, *errors, 0, 0, 0, seconds)


def _max_uncertainty(
    learn: LearnOptions, model: UncertainForces, starts: list[ase.Atoms], threshold: float, number: int
) -> float:
    """The force uncertainty at which a round's MD stops. auto: the model's own uncertainty
    where it was trained decides what "left its data" means: a model that is unsure
    everywhere (a few training structures) would otherwise stop at its first steps."""
    if learn.explore.max_uncertainty != "auto":
        return learn.explore.max_uncertainty
    at_starts = float(np.median(model.predict_frames(starts).uncertainty))
    limit = max(AUTO_MAX_OVER_STARTS * at_starts, AUTO_MAX_OVER_THRESHOLD * threshold)
    LOGGER.info(
        "round %d: the MD stops above %.3g eV/Å force uncertainty (auto: the larger of %g times the model's "
        "median at the starts, %.3g eV/Å, and %g times the threshold)",
        number,
        limit,
        AUTO_MAX_OVER_STARTS,
        at_starts,
        AUTO_MAX_OVER_THRESHOLD,
    )
    return limit


def _start_data(learn: LearnOptions) -> StartData:
    options = load_options(learn.options)
    if options.trainer_hypers.uncertainty is False:
        raise OptionsError(
            f"{learn.options} sets architecture.training.uncertainty: false, and mtt learn selects structures by "
            "the model's force uncertainty.",
            hint="Remove that line (or set it to true) in the training options.",
        )
    if options.trainer_hypers.finetune is not None:
        raise OptionsError(
            f"{learn.options} fine-tunes a checkpoint (architecture.training.finetune); mtt learn trains its "
            "starting model from the options' training set.",
            hint="To start from a trained model, give it as model: in the learn options.",
        )
    splits = load_splits(options.raw, Path(learn.options).parent, options.run.seed)
    energy = splits.info.targets.get("energy")
    if energy is None or not energy.forces:
        raise DataError(
            f"the training set of {learn.options} has no energy with forces, which mtt learn labels and grows.",
            hint="Read an energy target with its forces (targets: {energy: {key: energy, unit: eV, forces: forces}}).",
        )
    if energy.unit not in ("", "eV"):
        raise DataError(
            f"the training set of {learn.options} reads its energy in {energy.unit}, and the labels of an ASE "
            "calculator are in eV.",
            hint="Convert the starting data to eV, so that both are one target.",
        )
    squares, count = 0.0, 0
    structures = splits.train.read(list(range(len(splits.train))))
    for structure in structures:
        forces = structure.forces.get("energy")
        if forces is not None:
            squares += float((forces.double() ** 2).sum())
            count += forces.numel()
    return StartData(
        raw=options.raw,
        atomic_types=set(splits.info.atomic_types),
        # the structures of the training set, those split off for validation and test included
        count=len(splits.train)
        + sum(
            len(part)
            for name, part in (("validation_set", splits.validation), ("test_set", splits.test))
            if isinstance(options.raw.get(name), (int, float))
        ),
        force_rms=math.sqrt(squares / max(count, 1)),
        stress=bool(energy.stress),
    )


def _read_test_set(path: str) -> list[ase.Atoms]:
    frames = read_frames(Path(path))
    for index, atoms in enumerate(frames):
        results = atoms.calc.results if atoms.calc is not None else {}
        missing = [name for name in ("energy", "forces") if name not in results]
        if missing:
            raise DataError(
                f"structure {index} of the test set {path} has no reference {' and '.join(missing)}.",
                hint="The test set needs an energy (info 'energy') and forces (array 'forces') for every structure.",
            )
    return frames


def _test_errors(model: UncertainForces, test: list[ase.Atoms] | None) -> tuple[float, float, float]:
    """Energy RMSE per atom (meV), force RMSE and RMS force uncertainty (eV/Å) on the test set."""
    if test is None:
        return math.nan, math.nan, math.nan
    predicted = model.predict_frames(test)
    sizes = np.array([len(a) for a in test])
    energies = np.array([a.get_potential_energy() for a in test])
    forces = np.concatenate([a.get_forces() for a in test])
    energy_rmse = float(np.sqrt(np.mean(((predicted.energies - energies) / sizes) ** 2))) * 1000
    force_rmse = float(np.sqrt(np.mean((np.concatenate(predicted.forces) - forces) ** 2)))
    uncertainty = float(np.sqrt(np.mean(predicted.uncertainty**2)))
    return energy_rmse, force_rmse, uncertainty


def _trace_csv(trace: list[tuple]) -> str:
    stream = io.StringIO()
    writer = csv.writer(stream)
    writer.writerow(
        ["start", "step", "time_fs", "energy_eV", "force_uncertainty_eV_per_A", "temperature_K", "min_distance_A"]
    )
    writer.writerows(trace)
    return stream.getvalue()


def _cells(row: RoundRow) -> list[str]:
    values = asdict(row)
    cells = []
    for key, _, form in COLUMNS:
        value = values[key]
        if isinstance(value, float) and math.isnan(value):
            cells.append("-")
        else:
            cells.append(form.format(value) if not isinstance(value, str) else value)
    return cells


def _print_header() -> None:
    LOGGER.info("  ".join(title.rjust(max(len(title), 5)) for _, title, _ in COLUMNS))


def _print_row(row: RoundRow) -> None:
    LOGGER.info("  ".join(c.rjust(max(len(t), 5)) for c, (_, t, _) in zip(_cells(row), COLUMNS)))


def _write_results(folder: Path, rows: list[RoundRow], tested: bool) -> None:
    stream = io.StringIO()
    writer = csv.DictWriter(stream, fieldnames=list(asdict(rows[0])))
    writer.writeheader()
    writer.writerows(asdict(row) for row in rows)
    write_text(folder / "learning.csv", stream.getvalue())
    _plot(folder / "learning.png", rows, tested)


def _plot(path: Path, rows: list[RoundRow], tested: bool) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    final = [row for row in rows if row.round == FINAL]
    rows = [row for row in rows if row.round != FINAL]
    sizes = [row.structures for row in rows]
    figure, axes = plt.subplots(figsize=(5.5, 4), layout="constrained")
    if tested:
        lines = axes.plot(sizes, [r.test_force_rmse for r in rows], marker="o", label="test force RMSE")
        axes.plot(sizes, [r.test_force_uncertainty for r in rows], marker="s", label="test force uncertainty")
        for row in final:
            axes.plot(
                [row.structures],
                [row.test_force_rmse],
                marker="*",
                markersize=12,
                linestyle="",
                color=lines[0].get_color(),
                label="test force RMSE, final training",
            )
    axes.plot(sizes[1:], [r.md_uncertainty for r in rows[1:]], marker="^", label="median MD force uncertainty")
    axes.set_xlabel("labelled structures")
    axes.set_ylabel("eV/Å")
    axes.set_yscale("log")
    axes.legend()
    figure.savefig(path, dpi=120)
    plt.close(figure)
