"""Units a dataset may use, converted to mtt's internal eV and Å.

Targets are stored in internal units (eV, Å, and their combinations) from the moment they
are read; metrics and exported models report these internal units.
"""

from __future__ import annotations

import ase.units

from ..errors import OptionsError, did_you_mean

_ENERGY = {
    "ev": 1.0,
    "mev": 1e-3,
    "hartree": ase.units.Hartree,
    "ha": ase.units.Hartree,
    "rydberg": ase.units.Rydberg,
    "ry": ase.units.Rydberg,
    "kcal/mol": ase.units.kcal / ase.units.mol,
    "kj/mol": ase.units.kJ / ase.units.mol,
}
_LENGTH = {
    "angstrom": 1.0,
    "a": 1.0,
    "å": 1.0,
    "bohr": ase.units.Bohr,
    "nm": 10.0,
    "pm": 0.01,
}
# per-structure properties other than energies, with the unit they are stored in
_OTHER = {
    "e": (1.0, "e"),  # charges, in elementary charges
    "debye": (ase.units.Debye, "e*angstrom"),
    "e*angstrom": (1.0, "e*angstrom"),
    "e*bohr": (ase.units.Bohr, "e*angstrom"),
    "bohr^3": (ase.units.Bohr**3, "angstrom^3"),
    "angstrom^3": (1.0, "angstrom^3"),
}

ENERGY_UNIT = "eV"
LENGTH_UNIT = "angstrom"
KNOWN_ENERGY_UNITS = ("eV", "meV", "Hartree", "Ry", "kcal/mol", "kJ/mol")
KNOWN_LENGTH_UNITS = ("angstrom", "bohr", "nm", "pm")


def _lookup(unit: str, table: dict, what: str, known: tuple, where: str) -> float:
    key = unit.strip().lower()
    if key in table:
        return table[key]
    raise OptionsError(
        f"unknown {what} unit '{unit}' in '{where}'.{did_you_mean(unit, known)}",
        hint=f"Known {what} units: {', '.join(known)}.",
    )


def length_factor(unit: str, where: str) -> float:
    """Factor that converts a length in ``unit`` to Å."""
    return _lookup(unit, _LENGTH, "length", KNOWN_LENGTH_UNITS, where)


def energy_factor(unit: str, where: str) -> float:
    """Factor that converts an energy in ``unit`` to eV."""
    return _lookup(unit, _ENERGY, "energy", KNOWN_ENERGY_UNITS, where)


def property_factor(unit: str, where: str) -> tuple[float, str]:
    """Factor and internal unit for a generic per-structure target.

    An empty unit means a dimensionless number (or one the user keeps as is).
    """
    key = unit.strip().lower()
    if key == "":
        return 1.0, ""
    if key in _ENERGY:
        return _ENERGY[key], ENERGY_UNIT
    if key in _OTHER:
        return _OTHER[key]
    known = KNOWN_ENERGY_UNITS + ("e", "Debye", "e*angstrom", "e*bohr", "bohr^3", "angstrom^3")
    raise OptionsError(
        f"unknown unit '{unit}' in '{where}'.{did_you_mean(unit, known)}",
        hint=f"Known units: {', '.join(known)}; leave the unit empty to keep values as they are.",
    )
