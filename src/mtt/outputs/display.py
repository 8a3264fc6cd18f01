"""How a metric is named and shown wherever a run reports it (terminal, log, CSV, loggers)."""

from __future__ import annotations


def metric_name(key: str) -> str:
    """A metric key in words: 'energy_per_atom_rmse' -> 'energy per atom RMSE'."""
    return key.replace("_rmse", " RMSE").replace("_mae", " MAE").replace("_per_atom", " per atom").replace("_", " ")


def display(value: float, unit: str) -> tuple[float, str]:
    """Energies are shown in meV: the errors of good models are a few meV."""
    if unit.startswith("eV"):
        return value * 1000.0, "m" + unit
    return value, unit


def format_metrics(metrics: dict[str, float], units: dict[str, str], with_mae: bool = True) -> str:
    parts = []
    for key, value in metrics.items():
        if key == "loss" or (key.endswith("_mae") and not with_mae):
            continue
        shown, unit = display(value, units.get(key, ""))
        parts.append(f"{key.replace('_', ' ')} {shown:.4g}" + (f" {unit}" if unit else ""))
    return ", ".join(parts)
