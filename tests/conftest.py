"""Shared fixtures: the repository's data, the shared DFT datasets, and running `mtt`."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
EMT_DATA = ROOT / "examples" / "data" / "emt_metals.xyz"
SHARED_DATA = ROOT.parent / "shared" / "data"


@pytest.fixture
def emt_file() -> Path:
    return EMT_DATA


@pytest.fixture
def shared_data() -> Path:
    """../shared/data beside the clone; in CI it must be there, elsewhere tests skip."""
    if not SHARED_DATA.is_dir():
        if os.environ.get("CI"):
            pytest.fail(f"CI must provide the shared datasets at {SHARED_DATA}")
        pytest.skip(f"the shared DFT datasets are not at {SHARED_DATA} (only CI and the team's machines have them)")
    return SHARED_DATA


def run_mtt(*args: str, cwd: Path, timeout: float = 600, env: dict | None = None) -> subprocess.CompletedProcess:
    """Run the `mtt` command line as a user would, in a subprocess."""
    environment = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "2"), **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "mtt", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=environment,
    )


def write_options(folder: Path, text: str, name: str = "options.yaml") -> Path:
    path = folder / name
    path.write_text(text)
    return path
