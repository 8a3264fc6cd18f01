"""What the device check reports: its progress lines and log (device_check.log), one table of
every figure and check (device_check.md) and every figure in full (device_check.json).
"""

from __future__ import annotations

import datetime
import json
import time
from pathlib import Path

from harness import markdown_table


def fmt(value: float | None, digits: int = 3) -> str:
    if value is None:
        return "-"
    if value == 0:
        return "0"
    if abs(value) >= 1000 or abs(value) < 1e-3:
        return f"{value:.{digits - 1}e}"
    return f"{value:.{digits}g}"


class Report:
    """The check's results so far, written again to ``out`` after each step."""

    def __init__(self, out: Path, mode: str, options: dict):
        self.start = time.monotonic()
        self.out = out
        self.out.mkdir(parents=True, exist_ok=True)
        self.log = open(self.out / "device_check.log", "w")
        self.rows: list[tuple[str, str, str, str]] = []
        self.results: dict = {
            "started": datetime.datetime.now().isoformat(timespec="seconds"),
            "mode": mode,
            "options": options,
            "steps": {},
        }

    def elapsed(self) -> float:
        return time.monotonic() - self.start

    def say(self, text: str) -> None:
        line = f"[{self.elapsed():6.1f} s] {text}"
        print(line, flush=True)
        self.log.write(line + "\n")
        self.log.flush()

    def note(self, text: str) -> None:
        """To the log file only (long outputs of failed commands)."""
        self.log.write(text.rstrip() + "\n")
        self.log.flush()

    def row(self, step: str, what: str, value: str, verdict: str = "") -> None:
        self.rows.append((step, what, value, verdict))

    def write(self) -> None:
        self.results["elapsed_s"] = round(self.elapsed(), 1)
        (self.out / "device_check.json").write_text(json.dumps(self.results, indent=1, default=str))
        (self.out / "device_check.md").write_text(self.markdown())

    def markdown(self) -> str:
        env = self.results.get("environment", {})
        lines = [
            f"# mtt device check ({self.results['mode']})",
            "",
            f"{self.results['started']}, {self.results['elapsed_s']} s; "
            f"commit {self.results.get('commit', 'unknown')}; "
            f"torch {env.get('torch', '?')}, CUDA {env.get('torch_cuda', '-')}, "
            f"GPU {env.get('gpu', 'none')}, {env.get('cores', '?')} cores.",
            "",
            markdown_table(["step", "measurement", "value", "check"], self.rows),
            "",
            "## Steps",
            "",
        ]
        for name, step in self.results["steps"].items():
            text = f"- {name}: {step.get('status')} in {step.get('seconds', 0):.0f} s"
            if step.get("reason"):
                text += f": {step['reason']}"
            lines.append(text)
        if env.get("packages"):
            lines += ["", "## Versions", ""]
            versions = [f"{n} {p['version']}" for n, p in env["packages"].items() if p]
            lines.append(", ".join(versions) + f"; mtt from {env.get('mtt', {}).get('where', '?')}")
        if self.results.get("nvidia_smi"):
            lines += ["", "## nvidia-smi", "", "```", self.results["nvidia_smi"].rstrip(), "```"]
        return "\n".join(lines) + "\n"
