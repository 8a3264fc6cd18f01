"""Read structures and targets from files with ASE, converting units on the way in."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import ase
import ase.io
import numpy as np
import torch

from ..errors import DataError
from .options import DatasetOptions, DerivativeOptions
from .units import energy_factor, length_factor, property_factor


@dataclass
class TargetInfo:
    """What one target is: its name, unit and which derivatives are learned."""

    name: str
    quantity: str  # "energy" or "" (a generic per-structure scalar)
    unit: str  # internal unit of the values
    forces: bool = False
    stress: bool = False
    description: str = ""
    per_atom: bool = False  # one value per atom (sample_kind: atom), not per structure
    vector: bool = False  # 3 numbers (x, y, z) per value, rotating with the structure
    properties: int = 1  # values per structure or atom (num_subtargets)

    def to_dict(self) -> dict:
        return dict(self.__dict__)

    @property
    def width(self) -> int:
        """Numbers per structure or atom: the properties, times 3 for vectors (property by
        property, x y z each)."""
        return self.properties * (3 if self.vector else 1)

    @property
    def layout(self) -> tuple:
        """What the target is, but for the derivatives learned with it: two datasets (or a
        checkpoint and new data) may share a target only where this is the same."""
        return (self.quantity, self.unit, self.per_atom, self.vector, self.properties)

    def describe(self) -> str:
        """What is learned of it: 'energy [eV] + forces + stress', 'charges [e] per atom',
        'dipole [e*angstrom] vector'."""
        shape = " vector" if self.vector else ""
        shape += f" x {self.properties}" if self.properties > 1 else ""
        derivatives = (" + forces" if self.forces else "") + (" + stress" if self.stress else "")
        return f"{self.name} [{self.unit}]" + shape + (" per atom" if self.per_atom else "") + derivatives


@dataclass
class Structure:
    """One structure with its reference values, in internal units (eV, Å)."""

    types: torch.Tensor  # (n_atoms,) int32 atomic numbers
    positions: torch.Tensor  # (n_atoms, 3) float64
    cell: torch.Tensor  # (3, 3) float64, zeros for molecules
    pbc: torch.Tensor  # (3,) bool
    #: name -> (width,), or (n_atoms, width) for per-atom targets
    values: dict[str, torch.Tensor] = field(default_factory=dict)
    forces: dict[str, torch.Tensor] = field(default_factory=dict)  # name -> (n_atoms, 3)
    stress: dict[str, torch.Tensor] = field(default_factory=dict)  # name -> (3, 3)
    #: (file, index in it): the same structure has the same key, however often it is read
    key: tuple[str, int] | None = None

    def __len__(self) -> int:
        return len(self.types)


def resolve_path(path: str, base_dir: Path) -> Path:
    """Relative dataset paths are relative to the options file's folder."""
    candidate = Path(path).expanduser()
    return candidate if candidate.is_absolute() else base_dir / candidate


def parsed_by_ase(path: Path, parse: Callable[[], Any]) -> Any:
    """What ``parse`` reads from ``path`` with ASE, whose many errors are told as one."""
    try:
        return parse()
    except DataError:
        raise
    except Exception as error:  # ASE raises many types for malformed files
        raise DataError(
            f"could not read '{path}' with ASE: {type(error).__name__}: {error}",
            hint="Check that the file is complete and in a format ASE reads (the extension "
            "selects the format, e.g. .xyz for extended XYZ).",
        ) from error


def read_frames(path: Path) -> list[ase.Atoms]:
    """All frames of a file, with a clear error for missing or malformed files."""
    if not path.exists():
        raise DataError(
            f"dataset file '{path}' does not exist.",
            hint="Check 'read_from' in the options; relative paths are taken from the folder of the options file.",
        )
    frames = parsed_by_ase(path, lambda: ase.io.read(path, index=":"))
    if not isinstance(frames, list):
        frames = [frames]
    if len(frames) == 0:
        raise DataError(f"dataset file '{path}' holds no structure.")
    return frames


def _lookup(atoms: ase.Atoms, key: str, per_atom: bool):
    if per_atom and key in atoms.arrays:
        return atoms.arrays[key]
    if not per_atom and key in atoms.info:
        return atoms.info[key]
    results = atoms.calc.results if atoms.calc is not None else {}
    if key in results:
        return results[key]
    return None


def _available_keys(atoms: ase.Atoms) -> list[str]:
    keys = set(atoms.info) | (set(atoms.arrays) - {"numbers", "positions"})
    if atoms.calc is not None:
        keys |= set(atoms.calc.results)
    return sorted(keys)


def has_key(frames: list[ase.Atoms], key: str, per_atom: bool) -> bool:
    return _lookup(frames[0], key, per_atom) is not None


def _require(atoms: ase.Atoms, key: str, per_atom: bool, index: int, path: Path, what: str) -> np.ndarray:
    value = _lookup(atoms, key, per_atom)
    if value is None:
        raise DataError(
            f"{what} key '{key}' not found in structure {index} of '{path}'.",
            hint=f"Keys in that structure: {', '.join(_available_keys(atoms)) or 'none'}. "
            "Set 'key' in the target options to one of them.",
        )
    array = np.asarray(value, dtype=np.float64)
    if not np.all(np.isfinite(array)):
        raise DataError(
            f"{what} (key '{key}') has NaN or infinite values in structure {index} of '{path}'.",
            hint="Remove that structure from the dataset or fix its value.",
        )
    return array


#: the keys looked for when forces, stress or virial are not named: the first one present
CONVENTIONAL_KEYS = {"forces": ("forces", "force"), "stress": ("stress",), "virial": ("virial",)}


def _derivative_key(
    option: bool | str | DerivativeOptions | None, kind: str, frames: list[ase.Atoms], per_atom: bool, where: str
) -> str | None:
    """The key of forces/stress/virial to read, or None when not learned."""
    keys = CONVENTIONAL_KEYS[kind]
    present = next((key for key in keys if has_key(frames, key, per_atom)), None)
    if option is None:  # automatic: the conventional key when the file has it
        return present
    if option is False or (isinstance(option, str) and option.lower() in ("off", "false", "no")):
        return None
    if option is True or (isinstance(option, str) and option.lower() in ("on", "true", "yes")):
        return present or keys[0]
    if isinstance(option, DerivativeOptions):
        if option.read_from is not None:
            raise DataError(
                f"'{where}.read_from' is not supported: {where} must be stored in the same file as the structures.",
                hint=f"Remove '{where}.read_from' and add the values to the systems file.",
            )
        return option.key
    return option


@dataclass
class _TargetReading:
    """How one target is read from each frame: its keys and unit factor."""

    info: TargetInfo
    key: str
    factor: float
    forces: str | None
    stress: str | None
    virial: str | None


@dataclass
class DatasetReading:
    """How the frames of one dataset file become structures: the file, the length factor
    and every target's keys. Made from the options and the first frame, then applied to
    every frame, in this process or in the workers of ``mtt data convert``."""

    path: Path
    length_factor: float
    targets: list[_TargetReading]

    @property
    def infos(self) -> list[TargetInfo]:
        return [t.info for t in self.targets]

    def structure(self, atoms: ase.Atoms, index: int) -> Structure:
        """The structure of frame ``index``, in internal units, with every target's values."""
        path, l_factor = self.path, self.length_factor
        positions = torch.tensor(atoms.positions * l_factor, dtype=torch.float64)
        pbc = torch.tensor(atoms.pbc, dtype=torch.bool)
        cell = torch.tensor(atoms.cell.array * l_factor, dtype=torch.float64)
        cell = torch.where(pbc[:, None], cell, torch.zeros_like(cell))
        structure = Structure(
            types=torch.tensor(atoms.numbers, dtype=torch.int32),
            positions=positions,
            cell=cell,
            pbc=pbc,
            key=(str(path), index),
        )
        for target in self.targets:
            info, key, factor = target.info, target.key, target.factor
            value = _require(atoms, key, info.per_atom, index, path, f"target '{info.name}'")
            shape = (len(atoms), info.width) if info.per_atom else (info.width,)
            if value.size != int(np.prod(shape)):
                what = "atom" if info.per_atom else "structure"
                raise DataError(
                    f"target '{info.name}' (key '{key}') in structure {index} of '{path}' has {value.size} "
                    f"values, expected {info.width} per {what}"
                    + (f" ({len(atoms)} atoms)" if info.per_atom else "")
                    + ".",
                    hint="Check the target's sample_kind, type and num_subtargets.",
                )
            # float64 explicitly: torch's default float32 would round energies of ~1e4 eV by ~1 meV
            structure.values[info.name] = torch.tensor(value.reshape(shape), dtype=torch.float64) * factor
            if target.forces is not None:
                array = _require(atoms, target.forces, True, index, path, f"forces of '{info.name}'")
                if array.shape != (len(atoms), 3):
                    raise DataError(
                        f"forces '{target.forces}' in structure {index} of '{path}' have shape "
                        f"{array.shape}, expected ({len(atoms)}, 3).",
                    )
                structure.forces[info.name] = torch.tensor(array) * (factor / l_factor)
            if target.stress is not None or target.virial is not None:
                structure.stress[info.name] = _read_stress(
                    atoms, target.stress, target.virial, index, path, info.name, factor, l_factor
                )
        return structure


def plan_reading(options: DatasetOptions, first: ase.Atoms, path: Path, base_dir: Path, where: str) -> DatasetReading:
    """How to read the dataset of ``options`` whose first frame is ``first``."""
    frames = [first]
    l_factor = length_factor(options.systems.length_unit, f"{where}.systems.length_unit")
    targets = []
    for name, target in options.targets.items():
        twhere = f"{where}.targets.{name}"
        if target.read_from is not None and resolve_path(target.read_from, base_dir) != path:
            raise DataError(
                f"'{twhere}.read_from' points to another file than the systems; reading "
                "targets from a separate file is not supported.",
                hint="Store the targets in the same file as the structures.",
            )
        quantity = target.quantity_of(name)
        if quantity == "energy" and (target.on_atoms or target.is_vector or target.num_subtargets != 1):
            raise DataError(
                f"'{twhere}' is an energy, one number per structure: it cannot be per atom, a vector or have "
                "several subtargets.",
                hint="Give the target another name (quantities other than energies are learned as they are), "
                "or set quantity: '' for a property.",
            )
        if quantity == "energy":
            factor, unit = energy_factor(target.unit or "eV", f"{twhere}.unit"), "eV"
            forces = _derivative_key(target.forces, "forces", frames, True, f"{twhere}.forces")
            stress = _derivative_key(target.stress, "stress", frames, False, f"{twhere}.stress")
            virial = None
            if stress is None:
                virial = _derivative_key(target.virial, "virial", frames, False, f"{twhere}.virial")
        else:
            factor, unit = property_factor(target.unit, f"{twhere}.unit")
            for kind in ("forces", "stress", "virial"):
                if getattr(target, kind) not in (None, False, "off"):
                    raise DataError(
                        f"'{twhere}.{kind}' needs an energy target (quantity: energy).",
                    )
            forces = stress = virial = None
        info = TargetInfo(
            name=name,
            quantity=quantity,
            unit=unit,
            forces=forces is not None,
            stress=stress is not None or virial is not None,
            description=target.description,
            per_atom=target.on_atoms,
            vector=target.is_vector,
            properties=target.num_subtargets,
        )
        targets.append(_TargetReading(info, target.key or name, factor, forces, stress, virial))
    return DatasetReading(path, l_factor, targets)


def read_dataset(options: DatasetOptions, base_dir: Path, where: str) -> tuple[list[Structure], list[TargetInfo], Path]:
    """Read one dataset block: its structures and target descriptions."""
    path = resolve_path(options.systems.read_from, base_dir)
    frames = read_frames(path)
    reading = plan_reading(options, frames[0], path, base_dir, where)
    structures = [reading.structure(atoms, index) for index, atoms in enumerate(frames)]
    return structures, reading.infos, path


def _read_stress(
    atoms: ase.Atoms,
    stress_key: str | None,
    virial_key: str | None,
    index: int,
    path: Path,
    name: str,
    factor: float,
    l_factor: float,
) -> torch.Tensor:
    if not atoms.pbc.all():
        raise DataError(
            f"structure {index} of '{path}' is not periodic in all directions, but a "
            f"stress or virial is read for '{name}'.",
            hint="Stress is only defined for periodic systems; set 'stress: off' and "
            "'virial: off' for datasets with molecules or slabs.",
        )
    key = stress_key if stress_key is not None else virial_key
    array = _require(atoms, key, False, index, path, f"stress/virial of '{name}'")
    if array.size == 6:  # Voigt order xx yy zz yz xz xy
        xx, yy, zz, yz, xz, xy = array.reshape(6)
        array = np.array([[xx, xy, xz], [xy, yy, yz], [xz, yz, zz]])
    if array.size != 9:
        raise DataError(
            f"'{key}' in structure {index} of '{path}' has {array.size} values, expected a "
            "3x3 matrix (9 values) or 6 Voigt components.",
        )
    array = torch.tensor(array.reshape(3, 3))
    if stress_key is not None:
        return array * (factor / l_factor**3)
    volume = abs(float(np.linalg.det(atoms.cell.array))) * l_factor**3
    if math.isclose(volume, 0.0):
        raise DataError(f"structure {index} of '{path}' has a zero cell volume.")
    return -array * factor / volume
