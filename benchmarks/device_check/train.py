"""The device check's training steps: SOAP-BPNN ("train") and the message-passing
architecture ("message-passing"), each trained the same way on CUDA and on the CPU in
float32, and once more on the CPU in float64, whose difference from float32 measures the
rounding noise that CUDA and CPU test errors are then held to.
"""

from __future__ import annotations

from report import fmt
from runner import EMT_METALS, Check, Dataset, Skipped, relative_differences

MESSAGE_PASSING = "equivariant_mp"


def compare_devices(
    check: Check, record: dict, step: str, architecture: str, dataset: Dataset, noise_reference: bool
) -> dict:
    """The same training on CUDA and on the CPU in float32 (and float64 on the CPU: how
    far float32 rounding alone moves the results)."""
    runs = {}
    plan = ([("cuda float32", check.gpu, 32)] if check.cuda else []) + [("cpu float32", "cpu", 32)]
    if noise_reference:
        plan.append(("cpu float64", "cpu", 64))
    epochs = check.args.epochs
    for label, device, precision in plan:
        figures = check.attempt(
            record,
            f"{dataset.name} {label}",
            check.train,
            check.work / step / label.replace(" ", "-"),
            dataset,
            [f"device={device}", f"base_precision={precision}"],
            architecture=architecture,
            epochs=epochs,
        )
        if figures is None:
            continue
        runs[label] = figures
        check.say(
            f"  {architecture} {dataset.name} {label}: {figures['structures_per_s']:.1f} structures/s, "
            f"{figures['seconds_per_epoch']:.3f} s/epoch, fixed cost {figures['fixed_cost_s']:.1f} s; "
            f"{figures['test_line']}"
        )
    record[dataset.name] = runs
    what = f"{architecture} {dataset.name}, {epochs} epochs"
    cuda, cpu, cpu64 = runs.get("cuda float32"), runs.get("cpu float32"), runs.get("cpu float64")
    if cuda and cpu:
        check.row(
            step,
            f"{what}: training + validation structures/s, float32",
            f"CUDA {cuda['structures_per_s']:.1f}, CPU {cpu['structures_per_s']:.1f} "
            f"({cuda['structures_per_s'] / cpu['structures_per_s']:.2f}x)",
        )
        check.row(
            step,
            f"{what}: fixed cost of a run (s)",
            f"CUDA {cuda['fixed_cost_s']:.1f}, CPU {cpu['fixed_cost_s']:.1f}",
        )
    elif cpu:
        check.row(step, f"{what}: training + validation structures/s, CPU float32", f"{cpu['structures_per_s']:.1f}")
    noise = None
    if cpu and cpu64:
        noise = max(relative_differences(cpu["test"], cpu64["test"]).values())
        record[f"{dataset.name}_float32_noise"] = noise
        check.row(
            step,
            f"{what}: test errors, CPU float32 against float64 (largest relative difference)",
            f"{fmt(noise)}",
            "the float32 noise",
        )
    if cuda and cpu:
        differences = relative_differences(cuda["test"], cpu["test"])
        worst = max(differences.values())
        tolerance = max(3 * noise, 2e-3) if noise is not None else 2e-2
        agree = worst <= tolerance
        record[f"{dataset.name}_cuda_vs_cpu"] = {
            "relative_differences": differences,
            "tolerance": tolerance,
            "agree": agree,
        }
        check.row(
            step,
            f"{what}: test errors, CUDA against CPU float32 (largest relative difference)",
            f"{fmt(worst)} (tolerance {fmt(tolerance)})",
            "agree" if agree else "DISAGREE",
        )
        if not agree:
            record.setdefault("failures", []).append(f"CUDA and CPU test errors differ by {worst:.3g}")
    for label, figures in runs.items():
        check.row(step, f"{what}: test set, {label}", figures["test_line"].split(": ", 1)[1])
    return runs


def train_soap(check: Check, record: dict) -> None:
    """SOAP-BPNN on the ethanol data, else the EMT metals; its runs are what torchrun and MD
    compare with and start from (``check.reference``)."""
    datasets = [d for d in (check.ethanol(),) if d] or [EMT_METALS]
    if datasets[0].name != "ethanol":
        check.say(
            "  no ethanol data (run benchmarks/device_check/wheels.sh, which copies it into .whl/data): "
            "training on examples/data/emt_metals.xyz instead"
        )
        check.row("train SOAP-BPNN", "data", "no ethanol data carried: EMT metals instead", "note")
    record["dataset"] = datasets[0].name
    check.reference = (
        datasets[0],
        compare_devices(check, record, "train SOAP-BPNN", "soap_bpnn", datasets[0], not check.args.no_noise_reference),
    )


def train_message_passing(check: Check, record: dict) -> None:
    if MESSAGE_PASSING not in check.architectures:
        raise Skipped(
            f"architecture '{MESSAGE_PASSING}' is not in this mtt yet (available: {', '.join(check.architectures)})"
        )
    dataset = check.ethanol() or EMT_METALS
    compare_devices(check, record, f"train {MESSAGE_PASSING}", MESSAGE_PASSING, dataset, noise_reference=False)
