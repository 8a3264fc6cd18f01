"""A trained model out of mtt: rebuilt from a checkpoint, wrapped in metatomic's
``AtomisticModel`` and saved for ASE, LAMMPS and i-PI (compiled extensions beside it)."""

from __future__ import annotations

import copy
import os
import shutil
from pathlib import Path

import torch
from metatomic.torch import AtomisticModel, ModelCapabilities, ModelMetadata, ModelOutput

from . import __version__, architectures
from .architectures.adapters import add_adapters, merged
from .data.dataset import DatasetInfo
from .outputs.run_folder import keep_previous
from .schema import parse_options
from .training.hypers import FinetuneHypers
from .training.state import TrainingState


def model_from_state(
    state: TrainingState, best: bool = True
) -> tuple[torch.nn.Module, DatasetInfo, architectures.Architecture]:
    """Rebuild the model of a checkpoint, with its best weights (by validation) or its
    latest; returns (model, dataset info, architecture)."""
    identity = state.identity
    architecture = architectures.load(identity.architecture)
    info = DatasetInfo.from_dict(identity.dataset_info)
    hypers = parse_options(architecture.hypers_class, identity.model_hypers, "architecture.model")
    with architectures.blame_architecture(architecture):
        model = architecture.model_class(hypers, info)
    weights = state.best_model_state if best else state.model_state
    dtype = next(v.dtype for v in weights.values() if v.is_floating_point())
    model = model.to(dtype)
    finetune = lora_of(identity.options)
    if finetune is not None:  # the checkpoint holds the adapters apart from the weights
        add_adapters(model, finetune.lora_rank, finetune.lora_alpha)
    model.load_state_dict(weights)
    return merged(model).eval(), info, architecture


def lora_of(options: dict) -> FinetuneHypers | None:
    """The fine-tuning options of a run's options when it trained low-rank adapters."""
    finetune = ((options.get("architecture") or {}).get("training") or {}).get("finetune")
    if not isinstance(finetune, dict) or finetune.get("method") != "lora":
        return None
    return parse_options(FinetuneHypers, finetune, "architecture.training.finetune")


def atomistic_model(
    model: torch.nn.Module,
    info: DatasetInfo,
    architecture: architectures.Architecture,
    authors: list[str] | None = None,
) -> AtomisticModel:
    """Wrap ``model`` in metatomic's ``AtomisticModel``, declaring what it computes, how far
    its atoms interact and the devices its architecture runs on."""
    name = architecture.name
    dtype = next(v.dtype for v in model.state_dict().values() if v.is_floating_point())
    # a frozen copy: engines that call backward() on the energy (ASE's metatomic
    # calculator) then compute the forces and not, needlessly, every weight's gradient
    model = copy.deepcopy(merged(model)).to("cpu").eval().requires_grad_(False)
    outputs = {}
    for target, output in zip(info.targets.values(), model.output_names):
        outputs[output] = ModelOutput(
            unit=target.unit,
            sample_kind="atom" if target.per_atom else "system",
            explicit_gradients=[],
            description=target.description or f"{target.name}, trained with mtt",
        )
    members = model.uncertainty.ensemble.shape[2]
    trained = getattr(model, "shallow_ensemble", None) is not None
    origin = "trained with the model (a shallow ensemble)" if trained else "sampled from their posterior"
    for i, (target, output) in enumerate(zip(info.targets.values(), model.output_names)):
        if float(model.uncertainty.factors[model.output_starts[i]]) <= 0:  # not fitted and calibrated
            continue
        declared = {
            model.uncertainty_names[i]: f"standard deviation of {output} (last-layer posterior, calibrated on "
            "the validation set); per atom: the atom's local uncertainty, per structure: the structure's",
            model.ensemble_names[i]: f"{members} members of {output} with last-layer weights {origin}; the "
            "spread of their forces is the force uncertainty",
        }
        for name, description in declared.items():
            if name and (members > 0 or name == model.uncertainty_names[i]):
                outputs[name] = ModelOutput(
                    unit=target.unit, sample_kind="atom", explicit_gradients=[], description=description
                )
    capabilities = ModelCapabilities(
        outputs=outputs,
        atomic_types=list(info.atomic_types),
        interaction_range=float(model.interaction_range()),
        length_unit="angstrom",
        supported_devices=list(architecture.supported_devices),
        dtype="float64" if dtype == torch.float64 else "float32",
    )
    metadata = ModelMetadata(
        name=f"mtt {name}",
        description=f"{name} model trained with mtt {__version__}",
        authors=authors or [],
    )
    return AtomisticModel(model, metadata, capabilities)


def export_model(
    model: torch.nn.Module,
    info: DatasetInfo,
    architecture: architectures.Architecture,
    path: Path,
    authors: list[str] | None = None,
) -> Path:
    """Save ``model`` as a metatomic model file; compiled extensions go next to it."""
    exported = atomistic_model(model, info, architecture, authors)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        exported.save(str(temporary), collect_extensions=str(path.parent / "extensions"))
        os.replace(temporary, path)
    finally:
        if temporary.exists():
            temporary.unlink()
    return path


def export_run_model(
    model: torch.nn.Module,
    info: DatasetInfo,
    architecture: architectures.Architecture,
    folder: Path,
    target: Path,
) -> list[tuple[str, str]]:
    """Export a run's model into its run folder and to ``target`` (an older file there is
    kept aside, never replaced silently). Returns what went where."""
    with architectures.blame_architecture(architecture):  # TorchScript compiles its code
        exported = export_model(model, info, architecture, folder / "model.pt")
    files = [("run folder", str(folder))]
    if target.resolve() != exported.resolve():
        target.parent.mkdir(parents=True, exist_ok=True)
        kept = keep_previous(target)
        shutil.copyfile(exported, target)
        shutil.copytree(folder / "extensions", target.parent / "extensions", dirs_exist_ok=True)
        files.append(("model", f"{target} (and {target.parent / 'extensions'}/)"))
        if kept is not None:
            files.append(("previous model", f"{kept} (it was at {target})"))
    else:
        files.append(("model", str(exported)))
    return files
