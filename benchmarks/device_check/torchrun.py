"""The device check's torchrun step: one rank with ``distributed=true`` on CUDA (NCCL),
against one process on CUDA, and a port that another program holds, given with
``distributed.port`` to gloo on the CPU and to NCCL on CUDA: the message and the exit
statuses must be the same.
"""

from __future__ import annotations

import re
import socket

from harness import free_port, mtt_train
from report import fmt
from runner import EMT_METALS, PYTHON, Check, Dataset, StepFailed, relative_differences, tail


def torchrun(check: Check, record: dict) -> None:
    label, device, backend = ("cuda", check.gpu, check.gpu_backend) if check.cuda else ("cpu", "cpu", "gloo")
    dataset, runs = check.reference or (check.ethanol() or EMT_METALS, {})
    single = runs.get(f"{label} float32")

    def one_rank() -> None:
        figures = check.train(
            check.work / "torchrun" / f"one-rank-{label}",
            dataset,
            [f"device={device}", "base_precision=32"],
            epochs=check.args.epochs,
            ranks=1,
        )
        record["one_rank"] = figures
        described = figures["distributed"] or ""
        ok = f"{backend} backend" in described
        check.row(
            "torchrun",
            f"--nproc-per-node 1, distributed=true, {label}",
            f"{described}; {figures['structures_per_s']:.1f} structures/s",
            "ok" if ok else "FAILED",
        )
        if not ok:
            record.setdefault("failures", []).append(f"not the {backend} backend: {described}")
        if single:
            same = figures["test_line"] == single["test_line"]
            worst = max(relative_differences(figures["test"], single["test"]).values())
            check.row(
                "torchrun",
                f"test errors against one process on {label}",
                "identical" if same else f"largest relative difference {fmt(worst)}",
                "ok" if same or worst <= 2e-3 else "DIFFERENT",
            )
        check.say(f"  torchrun, 1 rank, {backend}: {described}; {figures['test_line']}")

    check.attempt(record, f"torchrun one rank ({backend})", one_rank)

    cases = [("cpu", "cpu", "gloo")] + ([("cuda", check.gpu, check.gpu_backend)] if check.cuda else [])
    seen = {}
    for case_label, case_device, case_backend in cases:
        result = check.attempt(
            record,
            f"port in use ({case_backend} on {case_label})",
            port_in_use,
            check,
            dataset,
            case_label,
            case_device,
            case_backend,
        )
        if result is None:
            continue
        seen[case_label] = result
        record[f"port_in_use_{case_label}"] = result
        expected = result["mtt_exit"] == 3 and "could not complete the rendezvous" in result["message"]
        check.row(
            "torchrun",
            f"port in use, {case_backend} on {case_label}",
            f"torchrun exit {result['torchrun_exit']}, rank exit {result['mtt_exit']} after "
            f"{result['seconds']:.0f} s: `{result['message'][:160]}`",
            "ok" if expected else "UNEXPECTED",
        )
    if "cpu" in seen and "cuda" in seen:
        same = all(seen["cpu"][key] == seen["cuda"][key] for key in ("message", "mtt_exit", "torchrun_exit"))
        check.row(
            "torchrun",
            f"port in use: {check.gpu_backend} on cuda against gloo on cpu",
            "same message and exits" if same else "different",
            "ok" if same else "DIFFERENT",
        )
        if not same:
            record.setdefault("failures", []).append("the port-in-use case differs between NCCL and gloo")


def port_in_use(check: Check, dataset: Dataset, label: str, device: str, backend: str) -> dict:
    """One rank under torchrun, given with ``distributed.port`` a port that is held here."""
    with socket.socket() as holder:
        holder.bind(("0.0.0.0", 0))
        holder.listen()
        port = holder.getsockname()[1]
        folder = check.work / "torchrun" / f"port-in-use-{label}"
        check.write_options(folder, dataset, epochs=1)
        overrides = [f"distributed.port={port}", f"distributed.timeout={check.args.port_timeout}", f"device={device}"]
        done = check.run(
            mtt_train("options.yaml", overrides, ranks=1, port=free_port(), python=PYTHON),
            folder,
            timeout=check.args.port_timeout + 60,
        )
    if done.timed_out:
        raise StepFailed(
            f"killed at its time limit, {done.seconds:.0f} s after being given a port in use "
            f"(distributed.timeout={check.args.port_timeout})"
        )
    messages = [line for line in done.stderr.splitlines() if line.startswith("mtt")]
    rank_exit = re.search(r"exitcode\s*:\s*(-?\d+)", done.stderr)
    message = (messages[0] if messages else tail(done.stderr, 1)).replace(str(port), "PORT")
    check.say(
        f"  port in use ({backend} on {label}): torchrun exit {done.returncode}, after {done.seconds:.0f} s: {message}"
    )
    return {
        "torchrun_exit": done.returncode,
        "mtt_exit": int(rank_exit.group(1)) if rank_exit else None,
        "message": message,
        "seconds": done.seconds,
    }
