"""Labelling with the reference method: any ASE calculator, named by import path, in a
pool of processes. Each structure's result is its own file, written whole or not at all,
so that an interrupted round continues without labelling a structure twice; a structure
the calculator fails on (it raises, or gives NaN) is skipped with its reason."""

from __future__ import annotations

import importlib
import multiprocessing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ase
import ase.io
import numpy as np
from ase.calculators.singlepoint import SinglePointCalculator

from ..errors import EnvironmentProblem, OptionsError
from .rounds import write_whole


def calculator_class(path: str) -> type:
    """The class of ``module:Class``, with what to install when the module is missing."""
    module_name, _, class_name = path.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        package = module_name.split(".")[0]
        raise EnvironmentProblem(
            f"label.calculator '{path}': the module '{module_name}' does not import ({error}).",
            hint=f"Install the package that provides it in this environment (e.g. pip install {package}).",
        ) from error
    found = getattr(module, class_name, None)
    if not callable(found):
        raise OptionsError(
            f"label.calculator '{path}': the module '{module_name}' has no class '{class_name}'.",
            hint="Write the calculator as 'module:Class', e.g. tblite.ase:TBLite or ase.calculators.emt:EMT.",
        )
    return found


def make_calculator(path: str, parameters: dict[str, Any]) -> Any:
    try:
        return calculator_class(path)(**parameters)
    except TypeError as error:
        raise OptionsError(f"label.parameters do not fit {path}: {error}") from error


@dataclass
class Labelled:
    done: list[ase.Atoms]  # in selection order, with energy, forces (and stress) as ASE results
    failures: dict[int, str]  # selection index -> why the calculator gave nothing


_worker_calculator: Any = None


def _start_worker(path: str, parameters: dict[str, Any]) -> None:
    global _worker_calculator
    _worker_calculator = make_calculator(path, parameters)


def _compute(job: tuple[int, ase.Atoms]) -> tuple[int, dict | None, str | None]:
    index, atoms = job
    atoms = atoms.copy()
    atoms.calc = _worker_calculator
    try:
        results = {"energy": float(atoms.get_potential_energy()), "forces": np.array(atoms.get_forces())}
        if atoms.pbc.all():
            results["stress"] = np.array(atoms.get_stress(voigt=False))
    except Exception as error:  # any failure of the reference method skips this structure
        return index, None, f"{type(error).__name__}: {str(error).strip().splitlines()[0] if str(error) else ''}"
    if not all(np.isfinite(value).all() for value in results.values()):
        return index, None, "the calculator gave NaN or infinite values"
    return index, results, None


def label(selected: list[ase.Atoms], folder: Path, path: str, parameters: dict[str, Any], processes: int) -> Labelled:
    """Label ``selected`` into ``folder`` (one file per structure); those labelled (or
    failed) before, in an interrupted run, are read back instead."""
    folder.mkdir(parents=True, exist_ok=True)
    pending = [
        (i, atoms)
        for i, atoms in enumerate(selected)
        if not (folder / f"{i:05d}.xyz").exists() and not (folder / f"{i:05d}.failed").exists()
    ]
    if pending:
        if processes == 1:
            _start_worker(path, parameters)
            results = map(_compute, pending)
            pool = None
        else:
            pool = multiprocessing.get_context("spawn").Pool(
                min(processes, len(pending)), initializer=_start_worker, initargs=(path, parameters)
            )
            results = pool.imap_unordered(_compute, pending)
        try:
            for index, values, failure in results:
                if failure is not None:
                    write_whole(folder / f"{index:05d}.failed", lambda p, text=failure: p.write_text(text + "\n"))
                    continue
                atoms = selected[index].copy()
                atoms.calc = SinglePointCalculator(atoms, **values)
                write_whole(folder / f"{index:05d}.xyz", lambda p, a=atoms: ase.io.write(p, a, format="extxyz"))
        finally:
            if pool is not None:
                pool.terminate()
                pool.join()
    done, failures = [], {}
    for i in range(len(selected)):
        failed = folder / f"{i:05d}.failed"
        if failed.exists():
            failures[i] = failed.read_text().strip()
        else:
            done.append(ase.io.read(folder / f"{i:05d}.xyz", format="extxyz"))
    return Labelled(done, failures)
