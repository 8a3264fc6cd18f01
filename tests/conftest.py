"""Shared fixtures: the repository's data, the shared DFT datasets, and running `mtt`."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
EMT_DATA = ROOT / "examples" / "data" / "emt_metals.xyz"
#: ../shared beside the clone; MTT_SHARED points elsewhere (a clone in a worktree folder)
SHARED_DATA = Path(os.environ.get("MTT_SHARED", ROOT.parent / "shared")) / "data"


@pytest.fixture
def emt_file() -> Path:
    return EMT_DATA


@pytest.fixture(scope="session")
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


def untuned_allocator_environment() -> dict[str, str]:
    """This process's environment without the user's allocator settings (``MALLOC_*``
    variables, a preloaded allocator): glibc's defaults, as most engines start."""
    return {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_") and k != "LD_PRELOAD"}


def exported_outputs(model: Path) -> list[str]:
    """The outputs an exported model declares, read in a process that never imports mtt."""
    script = (
        "import sys, metatomic.torch as mta\n"
        "print(*sorted(mta.load_atomistic_model(sys.argv[1]).capabilities().outputs))\n"
        "assert 'mtt' not in sys.modules\n"
    )
    result = subprocess.run([sys.executable, "-c", script, str(model)], capture_output=True, text=True, check=True)
    return result.stdout.split()


def torchrun_train(options: Path, cwd: Path, ranks: int = 2) -> subprocess.CompletedProcess:
    """`mtt train options distributed=true` on ``ranks`` processes started by torchrun."""
    return subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(ranks), "-m", "mtt", "train"]
        + [str(options), "distributed=true"],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=600,
    )


#: the SOAP-BPNN model of the quick tests: small, trained in seconds on the EMT data
SMALL_SOAP = "name: soap_bpnn\nmodel:\n  soap: {max_radial: 3, max_angular: 2}"


def emt_options(
    architecture: str,
    training: str,
    targets: str = "energy: {key: energy, unit: eV}",
    seed: int | None = None,
    validation: float = 0.1,
    precision: int | None = None,
) -> str:
    """Options that train on the shipped EMT data: ``architecture`` is the block's body (name,
    model), ``training`` the flow mapping of ``architecture.training``, ``targets`` the lines
    of ``training_set.targets``; ``precision`` the base_precision (default: the architecture's)."""
    body = "".join(f"  {line}\n" for line in architecture.splitlines())
    lines = "".join(f"    {line}\n" for line in targets.splitlines())
    return (
        (f"seed: {seed}\n" if seed is not None else "")
        + (f"base_precision: {precision}\n" if precision is not None else "")
        + f"architecture:\n{body}  training: {training}\n"
        + f"training_set:\n  systems: {EMT_DATA}\n  targets:\n{lines}"
        + f"validation_set: {validation}\ntest_set: 0.1\n"
    )


def write_options(folder: Path, text: str, name: str = "options.yaml") -> Path:
    path = folder / name
    path.write_text(text)
    return path


def logged_test_errors(folder: Path) -> str:
    """The test-set errors of the newest run under ``folder/outputs``, as its train.log has
    them (the terminal shows them in the summary table)."""
    runs = sorted(folder.glob("outputs/*/*/train.log"))
    assert runs, f"no run under {folder}/outputs"
    lines = [line.split(" INFO ", 1)[-1] for line in runs[-1].read_text().splitlines()]
    return next(line for line in lines if line.startswith("test set"))
