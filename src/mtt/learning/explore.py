"""The exploration of a round: Langevin MD with the current model from every start at once
(one model call a step for all of them), each stopped when the model's force uncertainty
or a physical check shows it left the data; its frames are the candidates for labelling."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import ase
import ase.units
import numpy as np
from ase.geometry import wrap_positions
from ase.md.velocitydistribution import MaxwellBoltzmannDistribution, Stationary, ZeroRotation
from vesin import NeighborList

from .predictor import UncertainForces, structure_of


@dataclass
class MDSettings:
    temperature: float  # K
    steps: int
    timestep: float  # fs
    friction: float  # 1/fs
    every: int
    max_uncertainty: float  # eV/Å
    min_distance: float  # Å


@dataclass
class Stop:
    start: int
    step: int
    reason: str


@dataclass
class Exploration:
    candidates: list[ase.Atoms] = field(default_factory=list)  # info: start, step, force_uncertainty
    #: one row per considered frame: start, step, time (fs), energy, force uncertainty, temperature, min distance
    trace: list[tuple] = field(default_factory=list)
    stops: list[Stop] = field(default_factory=list)


def minimum_distance(atoms: ase.Atoms, below: float) -> float:
    """The shortest interatomic distance if under ``below`` (images included), else ``inf``."""
    (distances,) = NeighborList(cutoff=below, full_list=False).compute(
        atoms.positions, np.asarray(atoms.cell), bool(atoms.pbc.any()), quantities="d"
    )
    return float(distances.min()) if len(distances) else math.inf


class _Trajectory:
    def __init__(self, start: int, atoms: ase.Atoms, temperature: float, rng: np.random.Generator):
        self.start = start
        self.atoms = atoms.copy()
        self.atoms.calc = None
        MaxwellBoltzmannDistribution(self.atoms, temperature_K=temperature, rng=rng)
        Stationary(self.atoms)
        if not self.atoms.pbc.any():
            ZeroRotation(self.atoms)
        self.masses = self.atoms.get_masses()[:, None]
        self.velocities = self.atoms.get_velocities()
        self.forces = np.zeros_like(self.velocities)
        self.alive = True

    def temperature(self) -> float:
        kinetic = 0.5 * float((self.masses * self.velocities**2).sum())
        return 2 * kinetic / (3 * len(self.atoms) * ase.units.kB)

    def move(self, positions: np.ndarray) -> None:
        if self.atoms.pbc.any():
            positions = wrap_positions(positions, self.atoms.cell, self.atoms.pbc)
        self.atoms.positions = positions


def explore(
    model: UncertainForces, starts: list[ase.Atoms], settings: MDSettings, rng: np.random.Generator
) -> Exploration:
    """BAOAB Langevin dynamics from every start, in eV, Å, amu and ASE's time unit."""
    dt = settings.timestep * ase.units.fs
    c1 = math.exp(-settings.friction / ase.units.fs * dt)
    c2 = math.sqrt(1 - c1**2)
    kT = ase.units.kB * settings.temperature
    trajectories = [_Trajectory(i, atoms, settings.temperature, rng) for i, atoms in enumerate(starts)]
    result = Exploration()
    _evaluate(model, trajectories, 0, settings, result)
    for step in range(1, settings.steps + 1):
        alive = [t for t in trajectories if t.alive]
        if not alive:
            break
        for t in alive:
            t.velocities += 0.5 * dt * t.forces / t.masses
            positions = t.atoms.positions + 0.5 * dt * t.velocities
            t.velocities = c1 * t.velocities + c2 * np.sqrt(kT / t.masses) * rng.standard_normal(t.velocities.shape)
            t.move(positions + 0.5 * dt * t.velocities)
        _evaluate(model, alive, step, settings, result)
    return result


def _evaluate(
    model: UncertainForces, trajectories: list[_Trajectory], step: int, settings: MDSettings, result: Exploration
) -> None:
    """Forces at the trajectories' new positions, the half kick that ends their step, their
    checks, and their frame when it is one to consider (or the one they stop at). The force
    uncertainty, which costs a backward pass per member, is computed on the frames to
    consider only: the physical checks run every step, the uncertainty's every ``every``."""
    considered = step % settings.every == 0
    prediction = model([structure_of(t.atoms) for t in trajectories], uncertainty=considered)
    dt = settings.timestep * ase.units.fs
    for t, energy, forces, uncertainty in zip(
        trajectories, prediction.energies, prediction.forces, prediction.uncertainty
    ):
        t.forces = forces
        if step > 0:
            t.velocities += 0.5 * dt * forces / t.masses
        closest = minimum_distance(t.atoms, settings.min_distance)
        reason = None
        if not (np.isfinite(forces).all() and math.isfinite(energy)):
            reason = "the model's forces are not finite"
        elif closest < settings.min_distance:
            reason = f"atoms {closest:.2f} Å apart, closer than explore.min_distance ({settings.min_distance} Å)"
        elif considered and uncertainty > settings.max_uncertainty:
            reason = (
                f"force uncertainty {uncertainty:.3g} eV/Å above explore.max_uncertainty "
                f"({settings.max_uncertainty:.3g} eV/Å)"
            )
        if considered or reason is not None:
            result.trace.append(
                (t.start, step, step * settings.timestep, float(energy), float(uncertainty), t.temperature(), closest)
            )
            # a frame the physical checks reject is no structure to label, an uncertain one is;
            # a start itself only when the model is unsure of it (it may be in the training set)
            labelable = reason is None or reason.startswith("force uncertainty")
            if labelable and (step > 0 or reason is not None):
                frame = t.atoms.copy()
                frame.info.update(start=t.start, step=step, force_uncertainty=float(uncertainty))
                result.candidates.append(frame)
        if reason is not None:
            t.alive = False
            result.stops.append(Stop(t.start, step, reason))
