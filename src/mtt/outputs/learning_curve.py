"""The learning curve of a run: its losses and RMSEs per epoch, training and validation,
drawn from ``metrics.csv`` into a PNG in the run folder when training ends."""

from __future__ import annotations

import csv
import math
from pathlib import Path

from .display import metric_name


def _read(path: Path) -> tuple[list[int], dict[str, list[float]]]:
    with open(path, newline="") as handle:
        rows = list(csv.DictReader(handle))
    epochs = [int(row["epoch"]) for row in rows]
    columns = {
        name: [float(row[name]) if row.get(name) not in (None, "") else math.nan for row in rows]
        for name in (rows[0] if rows else {})
        if name not in ("epoch", "time [s]", "learning_rate")
    }
    return epochs, columns


def _panels(columns: dict[str, list[float]]) -> list[tuple[str, str, str | None]]:
    """(title, training column, validation column) of the loss and of every RMSE."""
    panels = []
    for name in sorted(columns, key=lambda name: name != "train_loss"):  # the loss first
        if not name.startswith("train_") or not (name == "train_loss" or "_rmse" in name):
            continue
        quantity = name.removeprefix("train_")
        title = metric_name(quantity.split(" [")[0])
        unit = quantity.split(" [", 1)[1].rstrip("]") if " [" in quantity else ""
        validation = f"validation_{quantity}"
        panels.append((title + (f" [{unit}]" if unit else ""), name, validation if validation in columns else None))
    return panels


def write_learning_curve(metrics: Path, path: Path, best_epoch: int = 0) -> Path | None:
    """Draw ``metrics`` (a run's metrics.csv) into ``path``; None when it has no epoch."""
    if not metrics.is_file():
        return None
    epochs, columns = _read(metrics)
    panels = _panels(columns)
    if not epochs or not panels:
        return None
    # a Figure on Agg's canvas with fixed margins: pyplot's import and the constrained
    # layout's extra drawing pass cost about half of what the curve costs to draw
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    count = len(panels)
    width = 2 if count > 1 else 1
    height = math.ceil(count / width)
    inches = (5.0 * width, 3.4 * height)
    figure = Figure(figsize=inches)
    FigureCanvasAgg(figure)
    axes = figure.subplots(height, width, squeeze=False)
    # margins in inches: tick labels on the left, a title above and the axis label below each panel
    left, right, top, bottom, between_x, between_y = 0.75, 0.15, 0.35, 0.5, 0.75, 0.85
    panel_width = (inches[0] - left - right - between_x * (width - 1)) / width
    panel_height = (inches[1] - top - bottom - between_y * (height - 1)) / height
    figure.subplots_adjust(
        left=left / inches[0],
        right=1 - right / inches[0],
        top=1 - top / inches[1],
        bottom=bottom / inches[1],
        wspace=between_x / panel_width,
        hspace=between_y / panel_height,
    )
    for axis, (title, train, validation) in zip(axes.flat, panels):
        axis.plot(epochs, columns[train], label="training", marker="." if len(epochs) < 30 else None)
        if validation is not None:
            axis.plot(epochs, columns[validation], label="validation", marker="." if len(epochs) < 30 else None)
        values = [v for v in columns[train] + (columns[validation] if validation else []) if math.isfinite(v)]
        if values and min(values) > 0:
            axis.set_yscale("log")
        if best_epoch:
            axis.axvline(best_epoch, color="grey", linestyle=":", linewidth=1, label=f"best (epoch {best_epoch})")
        axis.set_title(title)
        axis.set_xlabel("epoch")
        axis.xaxis.set_major_locator(MaxNLocator(integer=True))
        axis.legend(fontsize="small")
    for axis in list(axes.flat)[count:]:
        axis.set_visible(False)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)
    return path
