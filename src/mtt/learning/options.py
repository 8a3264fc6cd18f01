"""The options of `mtt learn`: a YAML file composed by Hydra with command-line overrides,
then checked as strictly as the training options (unknown keys, wrong types, all at once)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Optional, Union

from hydra import compose, initialize
from hydra.core.config_store import ConfigStore
from hydra.core.global_hydra import GlobalHydra
from hydra.errors import HydraException
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from ..config.files import read_options_file
from ..config.overrides import split_overrides
from ..errors import OptionsError
from ..schema import option, parse_options


@dataclass
class ExploreOptions:
    start: str = option(doc="Structure file (extended XYZ, or any format ASE reads) whose structures start the MD.")
    temperature: Union[float, list[float]] = option(
        300.0, "Langevin temperature in K, or a list of one per round (the last repeats)."
    )
    steps: int = option(1000, "MD steps per start and round.")
    timestep: float = option(0.5, "MD time step in fs.")
    friction: float = option(0.01, "Langevin friction in 1/fs.")
    every: int = option(10, "Every how many steps a frame is considered for selection.")
    max_uncertainty: Union[float, Literal["auto"]] = option(
        "auto",
        "A start's MD stops when a structure's force uncertainty (eV/Å, computed every `every` steps) exceeds "
        "this: the model left its data. auto, each round: the larger of 3 times the model's median force "
        "uncertainty at the starting structures and 5 times the selection threshold.",
    )
    min_distance: float = option(
        0.5, "A start's MD stops when two atoms come closer than this (Å): a physical check of the model."
    )


@dataclass
class SelectOptions:
    max_per_round: int = option(20, "The most structures labelled per round: the most uncertain, kept diverse.")
    threshold: Union[float, Literal["auto"]] = option(
        "auto",
        "Force uncertainty (eV/Å, a structure's RMS over its atoms) below which no frame is taken. auto: a "
        "tenth of the RMS of the reference forces of the starting training set.",
    )
    min_difference: float = option(
        0.05,
        "Two structures of the same atoms whose sorted interatomic distances (per element pair, up to 6 Å) "
        "differ by less than this RMS (Å) are near-duplicates: only the more uncertain one is taken. Periodic "
        "cells: two frames of the same MD run whose atoms moved by less than this RMS (Å).",
    )


@dataclass
class LabelOptions:
    calculator: str = option(doc="The ASE calculator of the reference method, as 'module:Class'.")
    parameters: dict[str, Any] = option({}, "Keyword arguments of the calculator.")
    processes: int = option(1, "Structures labelled in parallel, each process with a calculator of its own.")


@dataclass
class TrainOptions:
    mode: Literal["finetune", "retrain"] = option(
        "finetune",
        "finetune: each round starts from the previous round's best model; retrain: from scratch.",
    )
    final: Literal["retrain", "none"] = option(
        "retrain",
        "With mode finetune, after the last round: retrain trains a model from scratch on the whole dataset with "
        "the starting options (learn/final/), which is the loop's result; the fine-tuned rounds only choose the "
        "structures. none: the last round's model is the result. With mode retrain the last round already is.",
    )
    overrides: list[str] = option(
        [], "Overrides (Hydra syntax) of the training options for the rounds after the first, e.g. num_epochs."
    )
    launcher: str = option(
        "",
        "Command that starts each round's `mtt train` on several processes, e.g. 'torchrun --nproc-per-node 2 "
        "--no-python' or 'srun --ntasks 4': the training then runs distributed=true.",
    )


@dataclass
class LearnOptions:
    options: str = option(doc="An ordinary training options file: its training_set is where the loop starts.")
    explore: ExploreOptions = option(doc="The MD with the current model.")
    label: LabelOptions = option(doc="The reference method.")
    rounds: int = option(5, "Rounds of explore, select, label and train after the starting model.")
    model: Optional[str] = option(
        None,
        "A checkpoint (.ckpt) of a model with uncertainty, trained on the options' training set, to start from "
        "instead of training one.",
    )
    select: SelectOptions = option(SelectOptions(), "Which frames of the MD are labelled.")
    train: TrainOptions = option(TrainOptions(), "How each round trains.")
    test_set: Optional[str] = option(
        None, "A structure file with reference energies and forces, evaluated every round."
    )
    folder: str = option("learn", "Where the rounds are written.")
    seed: int = option(0, "Seed of the MD's initial velocities and noise.")

    def __post_init__(self):
        problems = []
        if self.rounds < 1:
            problems.append("rounds must be at least 1")
        if self.explore.steps < 1 or self.explore.every < 1:
            problems.append("explore.steps and explore.every must be at least 1")
        if self.explore.timestep <= 0:
            problems.append("explore.timestep must be positive")
        if self.select.max_per_round < 1:
            problems.append("select.max_per_round must be at least 1")
        if self.label.processes < 1:
            problems.append("label.processes must be at least 1")
        if ":" not in self.label.calculator:
            problems.append(f"label.calculator must be 'module:Class', got {self.label.calculator!r}")
        temperatures = self.explore.temperature
        if isinstance(temperatures, list) and not temperatures:
            problems.append("explore.temperature must not be an empty list")
        if problems:
            raise ValueError("\n".join(problems))

    def temperature(self, round_number: int) -> float:
        """The MD temperature of round ``round_number`` (1, 2, ...)."""
        temperatures = self.explore.temperature
        if isinstance(temperatures, list):
            return float(temperatures[min(round_number, len(temperatures)) - 1])
        return float(temperatures)


def load_learn_options(path: str | Path, overrides: list[str]) -> LearnOptions:
    """The learn options of ``path`` with ``overrides``; relative paths are taken from the file's folder."""
    path = Path(path)
    user = read_options_file(path)
    groups, values = split_overrides(overrides)
    if groups:  # `mtt train`'s config groups mean nothing here
        values += [f"++{group}={choice}" for group, choice in groups.items()]
    GlobalHydra.instance().clear()
    ConfigStore.instance().store(name="learn_options", node=user)
    try:
        with initialize(version_base=None):
            composed = OmegaConf.to_container(compose(config_name="learn_options", overrides=values), resolve=True)
    except (HydraException, OmegaConfBaseException) as error:
        raise OptionsError(
            f"could not apply the command-line overrides: {error}",
            hint="Overrides use Hydra's syntax: key=value, e.g. rounds=3 or explore.temperature=400.",
        ) from error
    finally:
        GlobalHydra.instance().clear()
    learn = parse_options(LearnOptions, composed, "")
    base = path.parent.resolve()
    for owner, name in ((learn, "options"), (learn, "model"), (learn, "test_set"), (learn.explore, "start")):
        value = getattr(owner, name)
        if value is not None:
            setattr(owner, name, str(_absolute(value, base)))
    learn.folder = str(_absolute(learn.folder, Path.cwd()))  # like mtt train's outputs/: in the working folder
    return learn


def _absolute(value: str, base: Path) -> Path:
    candidate = Path(value).expanduser()
    return candidate if candidate.is_absolute() else base / candidate
