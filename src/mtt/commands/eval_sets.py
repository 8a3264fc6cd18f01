"""What `mtt eval` evaluates: the dataset blocks of an eval file, or the test set of a
training run, from its own indices when the model lies in its run folder (or the folder is
given), else split again from a training options file and its seed."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import ase.io
import numpy as np

from ..config import load_options
from ..config.files import read_yaml
from ..config.loader import DATASETS
from ..data.dataset import join_targets, load_splits, read_block
from ..data.options import expand_short_forms, is_converted, parse_dataset_list
from ..data.readers import TargetInfo, has_key, parsed_by_ase, resolve_path
from ..data.structure_sets import InMemorySet, StructureSet
from ..errors import DataError, OptionsError
from ..outputs.run_folder import is_run_folder, run_folder_of


@dataclass
class EvaluationSet:
    """Structures to evaluate on, with the targets to compare, and what to call them."""

    description: str  # said before the errors: which structures these are
    name: str  # short, for the predictions and the log lines (a file name)
    structures: StructureSet
    targets: list[TargetInfo]
    source: str  # the file (or run folder) they come from, for messages


def model_and_run(model: str) -> tuple[Path, Path | None]:
    """The model file (a run folder gives its model.pt), and the run folder it lies in."""
    path = Path(model)
    if path.is_dir():
        candidate = path / "model.pt" if (path / "model.pt").is_file() else path / "model.ckpt"
        return candidate, path if is_run_folder(path) else None
    if path.suffix == ".ckpt" or path.name == "model.pt":
        return path, run_folder_of(path) if path.parent.exists() else None
    return path, None


def _blocks(options: dict) -> list:
    blocks = []
    for key in DATASETS:
        value = options.get(key)
        if isinstance(value, (dict, list, str)):
            blocks += parse_dataset_list(value, key)
    return blocks


def _from_indices(run: Path) -> EvaluationSet:
    """The test structures of a run, by its indices/test.txt, read with its options.yaml."""
    lines = (run / "indices" / "test.txt").read_text().splitlines()
    if not lines:
        raise DataError(f"the run {run} has no test set (test_set: 0).", hint="Give a dataset file to evaluate on.")
    wanted: dict[str, list[int]] = {}
    for line in lines:
        file, index = line.rsplit("\t", 1)
        wanted.setdefault(file, []).append(int(index))
    blocks = _blocks(read_yaml(run / "options.yaml"))
    parts, targets = [], {}
    for file, indices in wanted.items():
        block = next((b for b in blocks if str(resolve_path(b.systems.read_from, run)) == file), None)
        if block is None:
            raise DataError(f"'{file}' of {run / 'indices' / 'test.txt'} is in no dataset of {run / 'options.yaml'}.")
        read, block_targets, _ = read_block(block, run, "test_set")
        parts.append(read.subset(np.array(indices, dtype=np.int64)))
        join_targets(targets, block_targets, "test_set", "test_set")
    structures = (
        parts[0]
        if len(parts) == 1
        else InMemorySet(
            [s for part in parts for s in part.structures],
            [
                origin
                for part in parts
                for path, numbers in part.origins()
                for origin in ((path, int(i)) for i in numbers)
            ],
        )
    )
    files = ", ".join(Path(f).name for f in wanted)
    return EvaluationSet(
        f"the test set of the run {run}: {len(structures)} structures of {files}, from its indices/test.txt",
        f"test set of {run.name}",
        structures,
        list(targets.values()),
        str(run),
    )


def _from_training_options(path: Path) -> EvaluationSet:
    """The test set of a training options file, split again with its seed."""
    options = load_options(path)
    if options.chosen_seed:
        raise OptionsError(
            f"'{path}' sets no seed, so its test set cannot be drawn again: each run drew its own split.",
            hint="Give the run folder (outputs/<date>/<time>) or its model.pt or checkpoint: its indices "
            "say which structures were the test set.",
        )
    splits = load_splits(options.raw, path.parent, options.run.seed)
    if not splits.test:
        raise DataError(f"'{path}' has no test set (test_set: 0).", hint="Give a dataset file to evaluate on.")
    return EvaluationSet(
        f"the test set of {path}: {len(splits.test)} structures, split with its seed {options.run.seed}",
        f"test set of {path.name}",
        splits.test,
        list(splits.info.targets.values()),
        str(path),
    )


def _structure_file(path: Path) -> dict:
    """The dataset block of a structure file given in place of a YAML file: its energies
    (with forces and stress) when its first structure has one, else no reference values."""
    block = expand_short_forms(path.name)
    if not is_converted(path) and path.is_file():
        first = parsed_by_ase(path, lambda: ase.io.read(path, index=0))
        if not has_key([first], "energy", per_atom=False):
            block["targets"] = {}
    return block


def sets_to_evaluate(model: str, options_path: str | None) -> tuple[Path, list[EvaluationSet]]:
    """The model file and what to evaluate it on."""
    model_path, run = model_and_run(model)
    if options_path is None:
        if run is None or not (run / "indices" / "test.txt").is_file():
            raise OptionsError(
                f"no options file given, and '{model}' is not in a run folder whose test set mtt could evaluate.",
                hint="Give a dataset file (`mtt eval model.pt eval.yaml`) or a run folder "
                "(`mtt eval outputs/<date>/<time>`).",
            )
        return model_path, [_from_indices(run)]
    path = Path(options_path)
    content = read_yaml(path) if path.suffix in (".yaml", ".yml") else _structure_file(path)
    if isinstance(content, dict) and "training_set" in content:  # a training options file
        if run is not None and (run / "indices" / "test.txt").is_file():
            return model_path, [_from_indices(run)]
        return model_path, [_from_training_options(path)]
    sets = []
    blocks = parse_dataset_list(content, "eval")  # one block or a list
    for number, block in enumerate(blocks):
        where = "eval" if len(blocks) == 1 else f"eval[{number}]"
        structures, targets, file = read_block(block, path.parent, where)
        sets.append(EvaluationSet(f"{file}: {len(structures)} structures", file.name, structures, targets, str(file)))
    return model_path, sets
