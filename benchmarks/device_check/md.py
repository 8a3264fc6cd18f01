"""The device check's MD step: velocity Verlet through metatomic's ASE calculator on CUDA and
on the CPU, for the ethanol model that "train" left and for a periodic cell of 1,008 Cu atoms
(a model trained here on examples/data/emt_metals.xyz). Each system runs in its own process,
md_process.py, which also checks the forces against finite differences of the
energy; this module starts it and puts what it measured in the table.
"""

from __future__ import annotations

import json
from pathlib import Path

from report import fmt
from runner import EMT_METALS, PYTHON, Check, StepFailed, tail

MD_PROCESS = Path(__file__).resolve().parent / "md_process.py"

SYSTEMS = {"ethanol": "ethanol (9 atoms)", "cu1008": "Cu fcc, periodic (1008 atoms)"}


def md(check: Check, record: dict) -> None:
    label, device = ("cuda", check.gpu) if check.cuda else ("cpu", "cpu")
    devices = [f"cuda={check.gpu}", "cpu"] if check.cuda else ["cpu"]
    systems = []
    dataset, runs = check.reference or (None, {})
    ethanol_run = runs.get(f"{label} float32") if dataset and dataset.name == "ethanol" else None
    if ethanol_run:
        systems.append(("ethanol", Path(ethanol_run["folder"]), check.args.md_steps, 10))
    else:
        check.say("  no ethanol model trained in float32 on this device: MD of the metal cell only")
        check.row("MD", "ethanol", "no ethanol model trained on this device", "skipped")
    metal = check.attempt(
        record,
        "metal model for MD",
        check.train,
        check.work / "md" / "emt-model",
        EMT_METALS,
        [f"device={device}", "base_precision=32"],
        epochs=check.args.md_train_epochs,
    )
    if metal:
        systems.append(("cu1008", Path(metal["folder"]), check.args.md_steps_large, 2))
    for system, run, steps, warmup in systems:
        command = [
            PYTHON,
            str(MD_PROCESS),
            "--model",
            str(run / "model.pt"),
            "--checkpoint",
            str(run / "model.ckpt"),
            "--system",
            system,
            "--devices",
            *devices,
            "--steps",
            str(steps),
            "--seconds",
            str(check.args.md_seconds),
            "--warmup",
            str(warmup),
            "--fd-atoms",
            str(check.args.fd_atoms),
        ]
        if system == "ethanol":
            command += ["--structure", str(dataset.path)]
        result = check.attempt(record, f"MD {system}", md_worker, check, command, system)
        if result is None:
            continue
        record[system] = result
        report(check, record, system, label, result)


def report(check: Check, record: dict, system: str, label: str, result: dict) -> None:
    """The rows of one system's MD, and its failures."""
    name = SYSTEMS[system]
    rates = ", ".join(f"{d.upper() if d == 'cuda' else 'CPU'} {r['steps_per_s']:.1f}" for d, r in result["md"].items())
    check.row("MD", f"{name}: VelocityVerlet steps/s", rates)
    drift = ", ".join(f"{d} {r['energy_drift_meV_per_atom']:+.3f}" for d, r in result["md"].items())
    steps = next(iter(result["md"].values()))["steps"]
    check.row("MD", f"{name}: total energy drift (meV/atom, {steps} steps)", drift)
    key = f"forces_{label}_vs_cpu_max_rel"
    if key in result:
        check.row(
            "MD",
            f"{name}: forces, CUDA against CPU (largest relative difference)",
            fmt(result[key]),
            "ok" if result[key] < 1e-3 else "LARGE",
        )
    if result.get("incomplete"):
        check.row("MD", f"{name}: the MD run", result["incomplete"], "INCOMPLETE")
        record.setdefault("failures", []).append(f"MD {system}: {result['incomplete']}")
    fd = result.get("finite_differences")
    if fd is None:
        return
    check.row(
        "MD",
        f"{name}: forces against finite differences of the energy (float64 copy, {fd['device']})",
        f"largest error {fmt(fd['max_abs_error_eV_per_A'])} eV/A, forces up to {fmt(fd['max_force_eV_per_A'])} eV/A",
        "ok" if fd["ok"] else "FAILED",
    )
    check.row(
        "MD",
        f"{name}: forces, float32 against float64",
        fmt(fd["float32_vs_float64_forces_max_rel"]),
        "ok" if fd["float32_vs_float64_forces_max_rel"] < 1e-3 else "LARGE",
    )
    if not fd["ok"]:
        record.setdefault("failures", []).append(f"{system}: forces disagree with finite differences")


def md_worker(check: Check, command: list[str], system: str) -> dict:
    """Run md_process.py; what it measured, from its last ``RESULT`` line, even when it was
    cut short."""
    done = check.run(command, check.work / "md" / system, timeout=None)
    results = [l for l in done.stdout.splitlines() if l.startswith("RESULT ")]
    if not results:
        raise StepFailed(
            f"md_process.py {'killed at its time limit' if done.timed_out else 'exited ' + str(done.returncode)}: "
            + tail(done.stderr, 2)
        )
    result = json.loads(results[-1][len("RESULT ") :])
    if done.timed_out or done.returncode != 0:
        result["incomplete"] = "killed at its time limit" if done.timed_out else f"exited {done.returncode}"
        check.say(f"  MD {system}: {result['incomplete']}, keeping what it measured")
    for device, rate in result["md"].items():
        check.say(f"  MD {system} on {device}: {rate['steps_per_s']:.1f} steps/s ({rate['steps']} steps)")
    fd = result.get("finite_differences")
    if fd:
        check.say(
            f"  {system}: finite differences {'ok' if fd['ok'] else 'FAILED'}, largest error "
            f"{fd['max_abs_error_eV_per_A']:.2e} eV/A"
        )
    return result
