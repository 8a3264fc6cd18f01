"""What a run shows on the terminal: one line per epoch that fits 80 columns, a bar for the
steps of the current epoch (on a terminal only), and a summary at the end.

The lines stay on screen, so the learning history can be read back; ``train.log`` gets
the same epochs with the full names of every error, the MAEs and the learning rate.
"""

from __future__ import annotations

import math
import sys
import textwrap
import time
from typing import TextIO

from .console import StatusLine, columns
from .display import display, format_metrics, metric_name
from .logs import FILE_LOGGER, LOGGER

NUMBER_WIDTH = 9


def number(value: float) -> str:
    """Four significant digits in at most 8 characters."""
    if not math.isfinite(value):
        return "nan" if math.isnan(value) else "inf"
    if value == 0:
        return "0"
    if 1e-3 <= abs(value) < 1e4:
        return f"{value:#.4g}".rstrip(".")  # 13.00, not 13: the digits say the precision
    if 1e4 <= abs(value) < 1e7:
        return f"{value:.0f}"
    return f"{value:.2e}"


def duration(seconds: float) -> str:
    if not math.isfinite(seconds):
        return "?"
    seconds = int(round(seconds))
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


def _short_name(key: str) -> tuple[str, str]:
    """A column's short name and its long one, from a metric key like 'forces_rmse'."""
    quantity = key.removesuffix("_rmse")
    known = {"energy_per_atom": ("E", "energy per atom"), "forces": ("F", "forces"), "stress": ("S", "stress")}
    if quantity in known:
        return known[quantity]
    long = quantity.replace("_per_atom", " per atom").replace("_", " ")
    return quantity.split("_")[0][:3], long


class EpochTable:
    """The learning history as a table: RMSEs of the training and validation sets per
    epoch (every ``log_interval`` epochs and the last), a star on the epochs that gave a
    better model, and the estimated time left."""

    def __init__(
        self,
        total_epochs: int,
        first_epoch: int,
        n_structures: int,
        log_interval: int,
        units: dict[str, str],
        stream: TextIO | None = None,
    ):
        self.total = total_epochs
        self.first = first_epoch
        self.n_structures = n_structures
        self.log_interval = log_interval
        self.units = units
        self.stream = stream or sys.stdout
        self.live = self.stream.isatty() and total_epochs > first_epoch
        StatusLine.stream = self.stream
        self.start = time.monotonic()
        self.last_bar = 0.0
        self.keys = [key for key in units if key.endswith("_rmse")]
        self.with_train = True
        self.epoch_width = max(5, 2 * len(str(total_epochs)) + 1)
        if total_epochs > first_epoch:
            for line in self._header(units):
                self.stream.write(line + "\n")
            self.stream.flush()

    # -- the header, once the quantities are known ----------------------------------------
    def _header(self, units: dict[str, str]) -> list[str]:
        width = columns(self.stream)
        names = [_short_name(key) for key in self.keys]
        shown_units = [display(1.0, units.get(key, ""))[1] for key in self.keys]
        # the training columns go first when they do not fit: the validation errors stay
        self.column = max([NUMBER_WIDTH] + [len(f"valid {short}") + 1 for short, _ in names])
        self.with_train = self.epoch_width + 2 * len(self.keys) * self.column + 11 <= width
        legend = "RMSE: " + ", ".join(
            f"{short} {long}" + (f" [{unit}]" if unit else "") for (short, long), unit in zip(names, shown_units)
        )
        star = "* better model"
        legend = f"{legend}; {star}" if len(legend) + len(star) + 2 < width else f"{legend}\n{star}"
        heads = "epoch".rjust(self.epoch_width)
        sets = ["train", "valid"] if self.with_train else ["valid"]
        for split in sets:
            heads += "".join(f"{split} {short}".rjust(self.column) for short, _ in names)
        heads += "ETA".rjust(9)
        return [line for part in legend.split("\n") for line in textwrap.wrap(part, width - 1)] + [heads]

    # -- what the trainer calls ------------------------------------------------------------
    def step_done(self, epoch: int, step: int, steps: int) -> None:
        """A bar for the steps of this epoch, redrawn at most five times a second."""
        if not self.live:
            return
        now = time.monotonic()
        if now - self.last_bar < 0.2 and step < steps:
            return
        self.last_bar = now
        width = max(10, min(40, columns(self.stream) - 40))
        filled = int(width * step / max(steps, 1))
        StatusLine.show(f"epoch {epoch}/{self.total} [{'#' * filled}{'.' * (width - filled)}] {step}/{steps} steps")

    def epoch_done(self, epoch: int, sets: dict[str, dict[str, float]], learning_rate: float, better: bool) -> None:
        """The epoch's line on the terminal, and its full line (every error, the losses) in train.log."""
        units = self.units
        elapsed = time.monotonic() - self.start
        done = epoch - self.first
        rate = done * self.n_structures / elapsed if elapsed > 0 else math.nan
        eta = elapsed / done * (self.total - epoch) if done else math.nan
        due = epoch % self.log_interval == 0 or epoch == self.total
        if not due:
            return

        def full(metrics: dict[str, float]) -> str:
            loss = f", loss {metrics['loss']:.6g}" if "loss" in metrics else ""
            return format_metrics(metrics, units) + loss

        FILE_LOGGER.info(
            "epoch %d/%d: train %s | validation %s | learning rate %.3g | %.1f structures/s, ETA %s",
            epoch,
            self.total,
            full(sets["train"]),
            full(sets["validation"]),
            learning_rate,
            rate,
            duration(eta),
        )
        row = f"{epoch}/{self.total}".rjust(self.epoch_width)
        for split in ["train", "validation"] if self.with_train else ["validation"]:
            row += "".join(
                number(display(sets[split].get(key, math.nan), units.get(key, ""))[0]).rjust(self.column)
                for key in self.keys
            )
        row += duration(eta).rjust(9) + (" *" if better else "")
        StatusLine.clear()
        self.stream.write(row + "\n")
        self.stream.flush()

    def close(self) -> None:
        StatusLine.clear()


def summary_lines(
    best_epoch: int,
    epochs: int,
    metric: str,
    validation: dict[str, float],
    test: dict[str, float] | None,
    units: dict[str, str],
    files: list[tuple[str, str]],
    log_mae: bool = False,
) -> list[str]:
    """The summary at the end of a run: the best epoch, its validation errors beside the
    test errors, and where the files are."""
    best = f"epoch {best_epoch} of {epochs}" if best_epoch else "from a checkpoint of an older mtt (epoch unknown)"
    by = {"rmse_prod": "the product of the validation RMSEs", "mae_prod": "the product of the validation MAEs"}
    lines = ["", "Summary", f"  best model: {best}, by {by.get(metric, 'the validation ' + metric)}"]
    keys = [k for k in validation if k.endswith("_rmse") or (log_mae and k.endswith("_mae"))]
    if keys:
        labels = []
        for key in keys:
            unit = display(1.0, units.get(key, ""))[1]
            labels.append(metric_name(key) + (f" [{unit}]" if unit else ""))
        width = max(len(label) for label in labels) + 2
        heads = "validation".rjust(12) + ("test".rjust(12) if test else "")
        lines.append("  " + " " * width + heads)
        for key, label in zip(keys, labels):
            row = "  " + label.ljust(width) + number(display(validation[key], units.get(key, ""))[0]).rjust(12)
            if test:
                row += number(display(test.get(key, math.nan), units.get(key, ""))[0]).rjust(12)
            lines.append(row)
        if not test:
            lines.append("  (no test set: test_set is 0)")
    width = max(len(name) for name, _ in files) + 2 if files else 0
    lines += [f"  {(name + ':').ljust(width)}{where}" for name, where in files]
    return lines


def comparison_lines(
    title: str,
    before: dict[str, dict[str, float]],
    after: dict[str, dict[str, float]],
    units: dict[str, dict[str, str]],
) -> list[str]:
    """The RMSEs of each set before and after (a fine-tuning run), with the change."""
    lines = [f"  {title}:"]
    rows = []
    for name, figures in after.items():
        for key, value in figures.items():
            if not key.endswith("_rmse"):
                continue
            unit = units.get(name, {}).get(key, "")
            shown = display(1.0, unit)[1]
            label = f"{name}: {metric_name(key)}" + (f" [{shown}]" if shown else "")
            old = before.get(name, {}).get(key, math.nan)
            change = f"{100 * (value - old) / old:+.0f}%" if math.isfinite(old) and old else ""
            rows.append((label, number(display(old, unit)[0]), number(display(value, unit)[0]), change))
    if not rows:
        return []
    width = max(len(row[0]) for row in rows) + 2
    lines.append("    " + " " * width + "before".rjust(10) + "after".rjust(10) + "change".rjust(11))
    lines += ["    " + a.ljust(width) + b.rjust(10) + c.rjust(10) + d.rjust(11) for a, b, c, d in rows]
    return lines


def print_summary(lines: list[str]) -> None:
    """On the terminal and in train.log."""
    StatusLine.clear()
    for line in lines:
        LOGGER.info(line)
