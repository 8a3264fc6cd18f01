"""The device check's CPU scaling step: EMT structures generated on the spot, trained with
1 to 16 gloo ranks under torchrun at one global batch; seconds per epoch, speed-up, parallel
efficiency, and whether the errors are identical to those of one rank.
"""

from __future__ import annotations

import os
from pathlib import Path

from harness import EMT_GENERATOR, EMT_TARGETS
from runner import PYTHON, Check, Dataset, StepFailed


def scaling(check: Check, record: dict) -> None:
    cores = check.results.get("environment", {}).get("cores") or os.cpu_count()
    data = generate_emt(check, check.args.scaling_structures)
    dataset = Dataset("EMT generated", data, EMT_TARGETS)
    batch = check.args.scaling_batch
    results = {}
    # one rank first (the reference), then the most ranks, then the rest: if time runs
    # out, the figures that matter most are in
    counts = sorted(set(check.args.ranks))
    if len(counts) > 2:
        counts = counts[:1] + counts[-1:] + counts[1:-1]
    plan = [(n, "mtt") for n in counts]
    if check.args.torchrun_threads_row and 2 in check.args.ranks:
        plan.append((2, "torchrun"))
    for ranks, threads in plan:
        if batch % ranks:
            check.row("CPU scaling", f"{ranks} ranks", f"global batch {batch} does not split in {ranks}", "skipped")
            continue
        # torchrun sets OMP_NUM_THREADS=1 for every rank when it is unset, and mtt then
        # leaves torch's threads alone; set but empty, torchrun keeps it and mtt shares
        # the cores itself (distributed._share_cores)
        env = {"OMP_NUM_THREADS": ""} if threads == "mtt" else {"OMP_NUM_THREADS": None}
        label = f"{ranks}" if threads == "mtt" else f"{ranks}-torchrun-threads"
        figures = check.attempt(
            record,
            f"{ranks} ranks ({threads} threads)",
            check.train,
            check.work / "scaling" / f"{ranks}-{threads}",
            dataset,
            ["device=cpu"],
            epochs=check.args.scaling_epochs,
            batch=batch // ranks,
            ranks=ranks,
            env=env,
        )
        if figures is None:
            continue
        figures["ranks"] = ranks
        figures["threads_per_rank"] = max(1, cores // ranks) if threads == "mtt" else 1
        figures["threads_set_by"] = (
            "mtt (OMP_NUM_THREADS set but empty)" if threads == "mtt" else "torchrun (OMP_NUM_THREADS=1)"
        )
        results[label] = figures
        check.say(
            f"  {ranks} ranks x {figures['threads_per_rank']} threads ({figures['threads_set_by']}): "
            f"{figures['seconds_per_epoch']:.3f} s/epoch"
        )
    record["runs"] = results
    record["dataset"] = {
        "structures": check.args.scaling_structures,
        "global_batch": batch,
        "epochs": check.args.scaling_epochs,
        "cores": cores,
    }
    one = results.get("1")
    for label, figures in sorted(results.items(), key=lambda item: (item[1]["ranks"], item[0])):
        ranks = figures["ranks"]
        if one:
            speed_up = one["seconds_per_epoch"] / figures["seconds_per_epoch"]
            figures["speed_up"], figures["efficiency"] = speed_up, speed_up / ranks
            same = figures["test_line"] == one["test_line"] and figures["final_validation"] == one["final_validation"]
            figures["identical_to_one_rank"] = same
            value = (
                f"{figures['seconds_per_epoch']:.3f} s/epoch, speed-up {speed_up:.2f}x, "
                f"efficiency {speed_up / ranks:.0%}, peak {figures['peak_memory_mb']:.0f} MB/rank"
            )
            verdict = "identical errors" if same else "ERRORS DIFFER"
            if not same:
                record.setdefault("failures", []).append(f"{label} ranks: test errors differ from 1 rank")
        else:
            value, verdict = f"{figures['seconds_per_epoch']:.3f} s/epoch", "no 1-rank reference"
        threads = f"{figures['threads_per_rank']} thread{'s' if figures['threads_per_rank'] > 1 else ''}"
        if label.endswith("torchrun-threads"):
            threads += " (torchrun's OMP_NUM_THREADS=1)"
        check.row(
            "CPU scaling",
            f"{ranks} rank{'s' if ranks > 1 else ''} x {threads}; "
            f"{check.args.scaling_structures} EMT structures, global batch {batch}, "
            f"{check.args.scaling_epochs} epochs",
            value,
            verdict,
        )


def generate_emt(check: Check, count: int) -> Path:
    """``count`` EMT structures, made by four generator processes at once."""
    folder = check.work / "scaling"
    parts = 4 if count >= 40 else 1
    processes = []
    for part in range(parts):
        size = count // parts + (1 if part < count % parts else 0)
        command = [
            PYTHON,
            str(EMT_GENERATOR),
            "--n-structures",
            str(size),
            "--seed",
            str(100 + part),
            "--output",
            str(folder / f"part{part}.xyz"),
        ]
        processes.append(check.run_background(command, folder / f"generate{part}"))
    for process in processes:
        if process.wait(timeout=max(5, check.remaining())) != 0:
            raise StepFailed("generating the EMT structures failed")
    data = folder / f"emt_{count}.xyz"
    data.write_text("".join((folder / f"part{part}.xyz").read_text() for part in range(parts)))
    check.say(f"  {count} EMT structures generated")
    return data
