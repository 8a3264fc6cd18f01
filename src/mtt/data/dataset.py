"""Datasets of a run: reading every block, splitting, and what the model must know."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from ase.data import chemical_symbols

from ..errors import DataError, OptionsError
from .options import parse_dataset_list
from .readers import Structure, TargetInfo, read_dataset


@dataclass
class DatasetInfo:
    """What an architecture needs to know about the data to build its model."""

    atomic_types: list[int]
    targets: dict[str, TargetInfo]
    length_unit: str = "angstrom"

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

    train: list[Structure]
    validation: list[Structure]
    test: list[Structure]
    info: DatasetInfo
    #: for each set, (file, index in file) of every structure, saved in the run folder
    origins: dict[str, list[tuple[str, int]]] = field(default_factory=dict)

    def fingerprint(self) -> str:
        """A digest of every structure of every set, in order, with its reference values:
        a restart checks with it that it trains on the very same data (wherever its file is)."""
        digest = hashlib.sha256()
        for structures in (self.train, self.validation, self.test):
            digest.update(len(structures).to_bytes(8, "little"))
            for structure in structures:
                for tensor in (structure.types, structure.positions, structure.cell, structure.pbc):
                    digest.update(tensor.contiguous().numpy().tobytes())
                for values in (structure.values, structure.forces, structure.stress):
                    for name in sorted(values):
                        digest.update(name.encode())
                        digest.update(values[name].contiguous().numpy().tobytes())
        return digest.hexdigest()


def _learned(targets: list[TargetInfo]) -> dict[str, str]:
    """What is learned of each target, e.g. {'energy': 'energy [eV] + forces + stress'}."""
    return {
        t.name: f"{t.name} [{t.unit}]" + (" + forces" if t.forces else "") + (" + stress" if t.stress else "")
        for t in targets
    }


def _read_blocks(value: Any, where: str, base_dir: Path):
    structures, origins, targets = [], [], None
    for i, block in enumerate(parse_dataset_list(value, where)):
        block_where = where if not isinstance(value, list) else f"{where}[{i}]"
        read, block_targets, path = read_dataset(block, base_dir, block_where)
        if targets is None:
            targets = block_targets
        elif [t.to_dict() for t in block_targets] != [t.to_dict() for t in targets]:
            raise DataError(
                f"'{block_where}' does not define the same targets (and forces/stress) as "
                f"the first dataset of '{where}': {', '.join(_learned(block_targets).values()) or 'none'} "
                f"instead of {', '.join(_learned(targets).values()) or 'none'}.",
            )
        structures.extend(read)
        origins.extend((str(path), j) for j in range(len(read)))
    return structures, origins, targets or []


def _split_off(fraction: Any, where: str, pool: list[int], total: int, generator: torch.Generator, allow_empty: bool):
    """Draw ``fraction`` of all ``total`` training structures out of ``pool``."""
    if not isinstance(fraction, (int, float)) or isinstance(fraction, bool) or not 0 <= fraction < 1:
        raise OptionsError(f"'{where}' must be a fraction in [0, 1) or a dataset, got {fraction!r}.")
    count = min(int(round(fraction * total)), len(pool))
    if count == 0 and not (allow_empty and fraction == 0):
        raise DataError(
            f"'{where}: {fraction}' of {total} training structures leaves the {where.replace('_set', '')} set empty.",
            hint="Use a larger fraction, more data, or give that set as its own file.",
        )
    order = torch.randperm(len(pool), generator=generator).tolist()
    chosen = sorted(pool[i] for i in order[:count])
    rest = sorted(pool[i] for i in order[count:])
    return chosen, rest


def load_splits(options: dict, base_dir: Path, seed: int) -> Splits:
    """Read every dataset of the options and split off validation and test fractions."""
    train, train_origins, targets = _read_blocks(options["training_set"], "training_set", base_dir)
    generator = torch.Generator().manual_seed(seed)
    pool = list(range(len(train)))
    sets: dict[str, tuple[list[Structure], list]] = {}
    for name, allow_empty in (("validation_set", False), ("test_set", True)):
        value = options.get(name, 0.1)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            chosen, pool = _split_off(value, name, pool, len(train), generator, allow_empty)
            sets[name] = ([train[i] for i in chosen], [train_origins[i] for i in chosen])
        else:
            read, origins, set_targets = _read_blocks(value, name, base_dir)
            # every set is evaluated on every term of the training loss
            if _learned(set_targets) != _learned(targets):
                raise DataError(
                    f"'{name}' gives {', '.join(_learned(set_targets).values()) or 'no target'}, but "
                    f"'training_set' gives {', '.join(_learned(targets).values()) or 'no target'}.",
                    hint=f"Read the same targets, with the same forces and stress, in '{name}' "
                    "(set forces/stress to off in the training set to learn without them).",
                )
            sets[name] = (read, origins)
    if not pool:
        raise DataError(
            "the validation and test fractions leave no structure for training.",
            hint="Lower 'validation_set' and 'test_set'.",
        )
    if not targets:
        raise OptionsError(
            "'training_set.targets' is empty: there is nothing to learn.",
            hint="Add a target, e.g. targets: {energy: {key: energy, unit: eV}}.",
        )
    training = [train[i] for i in pool]
    atomic_types = sorted({int(t) for s in training for t in s.types})
    for name, (structures, origins) in sets.items():
        for structure, (path, index) in zip(structures, origins):
            missing = sorted({int(t) for t in structure.types} - set(atomic_types))
            if missing:
                elements = ", ".join(f"{chemical_symbols[z]} (atomic number {z})" for z in missing)
                # the seed only matters for a set split off the training data
                split_off = isinstance(options.get(name, 0.1), (int, float))
                remedy = (
                    "move such structures to the training set or change the split seed"
                    if split_off
                    else f"add structures with {', '.join(chemical_symbols[z] for z in missing)} to the "
                    f"training set, or remove this one from the {name.replace('_', ' ')}"
                )
                raise DataError(
                    f"structure {index} of '{path}' in the {name.replace('_', ' ')} has "
                    f"{elements}, which no training structure has.",
                    hint=f"The model cannot predict elements it never saw: {remedy}.",
                )
    info = DatasetInfo(atomic_types=atomic_types, targets={t.name: t for t in targets})
    return Splits(
        train=training,
        validation=sets["validation_set"][0],
        test=sets["test_set"][0],
        info=info,
        origins={
            "training": [train_origins[i] for i in pool],
            "validation": sets["validation_set"][1],
            "test": sets["test_set"][1],
        },
    )
