"""The dataset blocks of the options file, with the short forms users write.

``training_set: data.xyz`` is short for a block whose systems are read from that file; the
validation and test sets are a fraction of the training set, a block or a list of blocks.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Optional, Union

from ..schema import REQUIRED, option, parse_options

#: the extension of converted datasets (``mtt data convert``, :mod:`mtt.data.store`)
CONVERTED_EXTENSION = ".mttdata"


def is_converted(path: str | Path) -> bool:
    """Whether ``path`` names a converted dataset (by its extension)."""
    return str(path).rstrip("/").endswith(CONVERTED_EXTENSION)


@dataclass
class SystemsOptions:
    """Where the structures come from."""

    read_from: str = option(REQUIRED, "Path of the file with the structures (any format ASE reads).")
    reader: Literal["ase"] = option("ase", "Library used to read the file.")
    length_unit: str = option("angstrom", "Unit of positions and cells: angstrom, bohr, nm or pm.")


@dataclass
class DerivativeOptions:
    """Where forces, stress or virial of an energy target are read from."""

    key: str = option(REQUIRED, "Name of the array (forces) or info field (stress, virial).")
    read_from: Optional[str] = option(None, "Accepted for metatrain's files; must be the systems file (the default).")


@dataclass
class TargetOptions:
    """One quantity to learn, read from the dataset file."""

    key: Optional[str] = option(None, "Name of the field in the file; default: the target name.")
    unit: str = option(
        "",
        "Unit of the values in the file (eV, kcal/mol, Hartree, ...). Empty means eV for "
        "energies; other targets are then kept as they are.",
    )
    quantity: str = option(
        "",
        "'energy' for an energy with forces and stress; default: 'energy' for a target named energy or "
        "energy/<variant> (another level of theory, in metatrain's and metatomic's terms).",
    )
    read_from: Optional[str] = option(None, "Accepted for metatrain's files; must be the systems file (the default).")
    sample_kind: Literal["system", "atom", "atom_pair"] = option(
        "system",
        "What one value belongs to: a structure (system) or an atom (atom: read from the file's per-atom "
        "arrays, e.g. partial charges). atom_pair is not supported yet.",
    )
    per_atom: Optional[bool] = option(None, "Older spelling of sample_kind: true is sample_kind: atom.")
    type: Union[Literal["scalar"], dict[str, Any]] = option(
        "scalar",
        "scalar, or {cartesian: {rank: 1}} for a vector (3 numbers per value: a dipole moment, or a "
        "vector per atom); predicted equivariantly. Other ranks and spherical targets are not supported yet.",
    )
    num_subtargets: int = option(1, "Values per structure or atom (of 3 numbers each for vectors).")
    description: str = option("", "Free text stored in the exported model.")
    forces: Union[bool, str, DerivativeOptions, None] = option(
        None,
        "Forces of an energy target: a key, on/off, or {key, read_from}. Default: the "
        "'forces' array when the file has one.",
    )
    stress: Union[bool, str, DerivativeOptions, None] = option(
        None,
        "Stress (3x3, energy/length^3) of an energy target. Default: the 'stress' field when the file has one.",
    )
    virial: Union[bool, str, DerivativeOptions, None] = option(
        None,
        "Virial (3x3, energy) of an energy target, used as stress = -virial / volume. "
        "Default: the 'virial' field when the file has one and no stress is given.",
    )

    @property
    def on_atoms(self) -> bool:
        """Whether the values are per atom (``sample_kind: atom`` or ``per_atom: true``)."""
        return self.sample_kind == "atom" or bool(self.per_atom)

    def layout_problems(self, where: str) -> list[str]:
        """What of ``sample_kind``, ``type`` and ``num_subtargets`` mtt does not support (yet)."""
        problems = []
        if self.sample_kind == "atom_pair":
            problems.append(
                f"'{where}.sample_kind: atom_pair' is not supported yet: targets are per structure or per atom"
            )
        if self.num_subtargets < 1:
            problems.append(f"'{where}.num_subtargets' must be >= 1, got {self.num_subtargets}")
        if isinstance(self.type, dict):
            kinds = set(self.type)
            cartesian = self.type.get("cartesian")
            if kinds == {"cartesian"} and isinstance(cartesian, dict) and cartesian.get("rank") == 1:
                pass
            elif kinds == {"cartesian"} and isinstance(cartesian, dict) and isinstance(cartesian.get("rank"), int):
                problems.append(
                    f"'{where}.type: {{cartesian: {{rank: {cartesian['rank']}}}}}' is not supported yet: "
                    "vectors (rank 1) and scalars are"
                )
            elif kinds == {"spherical"}:
                problems.append(f"'{where}.type: spherical' is not supported yet: scalars and cartesian vectors are")
            else:
                problems.append(f"'{where}.type' must be scalar or {{cartesian: {{rank: 1}}}}, got {self.type!r}")
        return problems

    @property
    def is_vector(self) -> bool:
        return isinstance(self.type, dict)

    def quantity_of(self, name: str) -> str:
        """'energy' for an energy (the target named energy or energy/<variant>, unless it says
        otherwise), else ''."""
        return self.quantity or ("energy" if name == "energy" or name.startswith("energy/") else "")


@dataclass
class DatasetOptions:
    """One dataset: structures and the targets read alongside them."""

    systems: SystemsOptions = option(REQUIRED, "The structures.")
    targets: dict[str, TargetOptions] = option({}, "The quantities to learn, by name.")


def expand_short_forms(value: Any) -> Any:
    """The long form of a dataset entry (a block, a list of blocks or a fraction).

    Expanded before composition too, so that an override such as
    ``training_set.targets.energy.unit=kcal/mol`` applies to a file that used a short form.
    As in metatrain, a bare file name reads an ``energy`` target (with forces and stress
    when the file has them); a converted dataset (``mtt data convert``) reads every target
    it holds. ``{read_from: file}`` is the file alone.
    """
    if isinstance(value, list):
        return [expand_short_forms(block) for block in value]
    if isinstance(value, dict) and set(value) == {"read_from"}:  # {read_from: file}: the file alone
        value = value["read_from"]
    if isinstance(value, str) and is_converted(value):  # it knows its targets: all of them
        return {"systems": {"read_from": value}}
    if isinstance(value, str):
        return {"systems": {"read_from": value}, "targets": {"energy": {"key": "energy"}}}
    if isinstance(value, dict):
        block = dict(value)
        if isinstance(block.get("systems"), str):
            block["systems"] = {"read_from": block["systems"]}
        targets = block.get("targets")
        if isinstance(targets, dict):
            block["targets"] = {name: ({"key": t} if isinstance(t, str) else t) for name, t in targets.items()}
        return block
    return value


def parse_dataset_list(value: Any, path: str) -> list[DatasetOptions]:
    """Expand the short forms of a dataset entry and parse each block."""
    blocks = value if isinstance(value, list) else [value]
    expanded = [expand_short_forms(block) for block in blocks]
    paths = (
        [path] if len(expanded) == 1 and not isinstance(value, list) else [f"{path}[{i}]" for i in range(len(expanded))]
    )
    return [parse_options(DatasetOptions, b, p) for b, p in zip(expanded, paths)]


def unit_problems(block: DatasetOptions, where: str) -> list[str]:
    """Every unknown unit of a dataset block, so that they are all reported in one message
    with the other problems of the options."""
    from ..errors import OptionsError
    from .units import energy_factor, length_factor, property_factor

    checks = [(length_factor, block.systems.length_unit, f"{where}.systems.length_unit")]
    problems = []
    for name, target in block.targets.items():
        problems += target.layout_problems(f"{where}.targets.{name}")
        place = f"{where}.targets.{name}.unit"
        if target.quantity_of(name) == "energy":
            checks.append((energy_factor, target.unit or "eV", place))
        else:
            checks.append((property_factor, target.unit, place))
    for check, unit, place in checks:
        try:
            check(unit, place)
        except OptionsError as error:
            problems.append(f"{error.message} {error.hint}" if error.hint else error.message)
    return problems
