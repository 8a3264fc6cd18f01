"""Datasets of a run: reading every block, splitting, and what the model must know."""

from __future__ import annotations

import copy
import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from ase.data import chemical_symbols

from ..errors import DataError, OptionsError
from .options import DatasetOptions, is_converted, parse_dataset_list
from .readers import TargetInfo, read_dataset
from .store import open_converted
from .structure_sets import InMemorySet, StructureSet


@dataclass
class DatasetInfo:
    """What an architecture needs to know about the data to build its model."""

    atomic_types: list[int]
    targets: dict[str, TargetInfo]
    length_unit: str = "angstrom"

    @property
    def needs_forces(self) -> bool:
        """Whether some target has forces: batches then take derivatives by the positions."""
        return any(t.forces for t in self.targets.values())

    @property
    def needs_stress(self) -> bool:
        """Whether some target has stress: batches then take derivatives by a strain."""
        return any(t.stress for t in self.targets.values())

    def to_dict(self) -> dict:
        return {
            "atomic_types": list(self.atomic_types),
            "targets": {name: t.to_dict() for name, t in self.targets.items()},
            "length_unit": self.length_unit,
        }

    @classmethod
    def from_dict(cls, data: dict) -> "DatasetInfo":
        return cls(
            atomic_types=list(data["atomic_types"]),
            targets={n: TargetInfo(**t) for n, t in data["targets"].items()},
            length_unit=data["length_unit"],
        )


@dataclass
class Splits:
    """The training, validation and test structures of one run."""

    train: StructureSet
    validation: StructureSet
    test: StructureSet
    info: DatasetInfo

    @property
    def sets(self) -> dict[str, StructureSet]:
        """Each set by the name of its indices file in the run folder."""
        return {"training": self.train, "validation": self.validation, "test": self.test}

    @property
    def origins(self) -> dict[str, list[tuple[str, int]]]:
        """(file, index in it) of every structure of each set, as its indices file lists them."""
        return {
            name: [(path, int(i)) for path, numbers in structures.origins() for i in numbers]
            for name, structures in self.sets.items()
        }

    def fingerprint(self) -> str:
        """A digest of every structure of every set, in order, with its reference values:
        a restart checks with it that it trains on the very same data (wherever its file is)."""
        digest = hashlib.sha256()
        for structures in (self.train, self.validation, self.test):
            structures.update_digest(digest)
        return digest.hexdigest()


def _learned(targets: list[TargetInfo]) -> dict[str, str]:
    """What is learned of each target, e.g. {'energy': 'energy [eV] + forces + stress'}."""
    return {t.name: t.describe() for t in targets}


def read_block(block: DatasetOptions, base_dir: Path, where: str) -> tuple[StructureSet, list[TargetInfo], Path]:
    """The structures of one dataset block, read into memory or opened on disk when converted."""
    if is_converted(block.systems.read_from):
        structures, targets = open_converted(block, base_dir, where)
        return structures, targets, structures.store.path
    read, targets, path = read_dataset(block, base_dir, where)
    return InMemorySet(read, [(str(path), j) for j in range(len(read))]), targets, path


def _read_blocks(value: Any, where: str, base_dir: Path) -> tuple[StructureSet, list[TargetInfo]]:
    blocks = parse_dataset_list(value, where)
    converted = [is_converted(block.systems.read_from) for block in blocks]
    if any(converted):
        if len(blocks) > 1:
            raise DataError(
                f"'{where}' lists {len(blocks)} datasets, {sum(converted)} of them converted: a set made of "
                "a converted dataset cannot take other datasets yet.",
                hint="Convert all of them into one dataset: the dataset file of `mtt data convert` takes a "
                "list of blocks.",
            )
        return open_converted(blocks[0], base_dir, where)
    structures, origins, targets = [], [], {}
    for i, block in enumerate(blocks):
        block_where = where if not isinstance(value, list) else f"{where}[{i}]"
        read, block_targets, path = read_dataset(block, base_dir, block_where)
        join_targets(targets, block_targets, block_where, where)
        structures.extend(read)
        origins.extend((str(path), j) for j in range(len(read)))
    return InMemorySet(structures, origins), list(targets.values())


def join_targets(targets: dict[str, TargetInfo], more: list[TargetInfo], where: str, of: str) -> None:
    """Add to ``targets`` those of another dataset of the set ``of`` (at ``where``): several
    datasets may give different targets (variants); one target keeps its unit and shape,
    and is learned with forces or stress when a dataset gives them."""
    for target in more:
        known = targets.get(target.name)
        if known is None:
            targets[target.name] = copy.copy(target)
            continue
        if known.layout != target.layout:
            raise DataError(
                f"'{where}' reads target '{target.name}' as {target.describe()}, but an earlier dataset "
                f"of '{of}' as {known.describe()}.",
                hint="A target has one unit and shape in a run: give the other quantity another name.",
            )
        known.forces, known.stress = known.forces or target.forces, known.stress or target.stress


def _split_off(
    fraction: Any, where: str, pool: np.ndarray, total: int, generator: torch.Generator, allow_empty: bool
) -> tuple[np.ndarray, np.ndarray]:
    """Draw ``fraction`` of all ``total`` training structures out of ``pool``."""
    if not isinstance(fraction, (int, float)) or isinstance(fraction, bool) or not 0 <= fraction < 1:
        raise OptionsError(f"'{where}' must be a fraction in [0, 1) or a dataset, got {fraction!r}.")
    count = min(int(round(fraction * total)), len(pool))
    if count == 0 and not (allow_empty and fraction == 0):
        raise DataError(
            f"'{where}: {fraction}' of {total} training structures leaves the {where.replace('_set', '')} set empty.",
            hint="Use a larger fraction, more data, or give that set as its own file.",
        )
    order = torch.randperm(len(pool), generator=generator).numpy()
    return np.sort(pool[order[:count]]), np.sort(pool[order[count:]])


def load_splits(options: dict, base_dir: Path, seed: int) -> Splits:
    """Read every dataset of the options and split off validation and test fractions."""
    train, targets = _read_blocks(options["training_set"], "training_set", base_dir)
    generator = torch.Generator().manual_seed(seed)
    pool = np.arange(len(train))
    sets: dict[str, StructureSet] = {}
    for name, allow_empty in (("validation_set", False), ("test_set", True)):
        value = options.get(name, 0.1)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            chosen, pool = _split_off(value, name, pool, len(train), generator, allow_empty)
            sets[name] = train.subset(chosen)
        else:
            read, set_targets = _read_blocks(value, name, base_dir)
            # every set is evaluated on every term of the training loss
            if _learned(set_targets) != _learned(targets):
                raise DataError(
                    f"'{name}' gives {', '.join(_learned(set_targets).values()) or 'no target'}, but "
                    f"'training_set' gives {', '.join(_learned(targets).values()) or 'no target'}.",
                    hint=f"Read the same targets, with the same forces and stress, in '{name}' "
                    "(set forces/stress to off in the training set to learn without them).",
                )
            sets[name] = read
    if not len(pool):
        raise DataError(
            "the validation and test fractions leave no structure for training.",
            hint="Lower 'validation_set' and 'test_set'.",
        )
    if not targets:
        raise OptionsError(
            "'training_set.targets' is empty: there is nothing to learn.",
            hint="Add a target, e.g. targets: {energy: {key: energy, unit: eV}}.",
        )
    training = train.subset(pool)
    atomic_types = sorted(z for z, n in training.type_counts().items() if n > 0)
    for name, structures in sets.items():
        missing = {z for z, n in structures.type_counts().items() if n > 0} - set(atomic_types)
        if missing:
            path, index, present = structures.first_with(missing)
            elements = ", ".join(f"{chemical_symbols[z]} (atomic number {z})" for z in present)
            # the seed only matters for a set split off the training data
            split_off = isinstance(options.get(name, 0.1), (int, float))
            remedy = (
                "move such structures to the training set or change the split seed"
                if split_off
                else f"add structures with {', '.join(chemical_symbols[z] for z in present)} to the "
                f"training set, or remove this one from the {name.replace('_', ' ')}"
            )
            raise DataError(
                f"structure {index} of '{path}' in the {name.replace('_', ' ')} has "
                f"{elements}, which no training structure has.",
                hint=f"The model cannot predict elements it never saw: {remedy}.",
            )
    info = DatasetInfo(atomic_types=atomic_types, targets={t.name: t for t in targets})
    return Splits(train=training, validation=sets["validation_set"], test=sets["test_set"], info=info)
