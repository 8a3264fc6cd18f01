"""Load a trained model, exported or as a checkpoint, and run it like a simulation engine.

Both kinds of file are evaluated through metatomic's ``AtomisticModel``, so `mtt eval`
checks exactly what ASE, LAMMPS and i-PI will compute.
"""

from __future__ import annotations

import zipfile
from pathlib import Path

import torch
from metatensor.torch import TensorMap
from metatomic.torch import AtomisticModel, ModelEvaluationOptions, ModelOutput, NeighborListOptions, System

from .checkpoint import is_exported_model
from .data.dataset import DatasetInfo
from .data.readers import TargetInfo
from .errors import CheckpointError
from .export import atomistic_model, model_from_state
from .training.state import TrainingState

ENERGY_UNITS = ("eV", "meV", "Hartree", "kcal/mol", "kJ/mol", "Ry")


class EvaluatedModel:
    """An ``AtomisticModel`` behind the interface the training code predicts with."""

    def __init__(self, atomistic: AtomisticModel, source: Path):
        self.atomistic = atomistic.eval()
        self.source = source
        capabilities = atomistic.capabilities()
        self.atomic_types = [int(t) for t in capabilities.atomic_types]
        self.dtype = torch.float64 if capabilities.dtype == "float64" else torch.float32
        self.output_names: list[str] = []
        self.targets: dict[str, TargetInfo] = {}
        #: the energies with an uncertainty, and its output: {"energy": "energy_uncertainty"};
        #: those with an ensemble, whose members' forces give the forces' uncertainty
        self.uncertainties = _energies_with(capabilities.outputs, "energy_uncertainty")
        self.ensembles = _energies_with(capabilities.outputs, "energy_ensemble")
        for name, output in capabilities.outputs.items():
            if name != "energy" and not name.startswith(("mtt::", "energy/")):
                continue
            target = name.split("::", 1)[-1]
            energy = name == "energy" or name.startswith("energy/") or output.unit in ENERGY_UNITS
            self.output_names.append(name)
            # whether a target is a vector, and its number of properties, come with its values
            self.targets[target] = TargetInfo(
                name=target,
                quantity="energy" if energy else "",
                unit=output.unit,
                forces=energy,
                stress=energy,
                per_atom=output.sample_kind == "atom",
            )

    def info(self, periodic: bool) -> DatasetInfo:
        """What the model predicts; stress only when every structure is periodic."""
        targets = {
            name: TargetInfo(**{**t.to_dict(), "stress": t.stress and periodic}) for name, t in self.targets.items()
        }
        return DatasetInfo(atomic_types=self.atomic_types, targets=targets)

    def requested_neighbor_lists(self) -> list[NeighborListOptions]:
        return self.atomistic.requested_neighbor_lists()

    def __call__(self, systems: list[System], outputs: dict[str, ModelOutput]) -> dict[str, TensorMap]:
        options = ModelEvaluationOptions(length_unit="angstrom", outputs=outputs)
        return self.atomistic(systems, options, check_consistency=False)


def _energies_with(outputs: dict, kind: str) -> dict[str, str]:
    """{energy output: its ``kind`` output} for ``kind`` and its variants (``kind/<name>``)."""
    return {"energy" + name[len(kind) :]: name for name in outputs if name == kind or name.startswith(kind + "/")}


def load_trained_model(path: str | Path) -> EvaluatedModel:
    """An exported model (.pt, with its extensions/ folder beside it) or an mtt checkpoint."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"model file '{path}' does not exist.")
    if not zipfile.is_zipfile(path):
        raise CheckpointError(
            f"'{path}' is neither an exported model nor an mtt checkpoint.",
            hint="Give the model.pt written by `mtt train` or `mtt export`, or a .ckpt file.",
        )
    if not is_exported_model(path):
        model, info, architecture = model_from_state(TrainingState.load(path))
        return EvaluatedModel(atomistic_model(model, info, architecture), path)

    from metatomic.torch import load_atomistic_model

    try:  # featomic's operators must be registered by featomic.torch before the model's
        import featomic.torch  # noqa: F401  copy of the library loads, or a later import aborts
    except ImportError:
        pass

    extensions = path.parent / "extensions"
    try:
        atomistic = load_atomistic_model(
            str(path), extensions_directory=str(extensions) if extensions.is_dir() else None
        )
    except Exception as error:
        raise CheckpointError(
            f"could not load '{path}' as a metatomic model: {str(error).splitlines()[0]}",
            hint="Exported models need the 'extensions' folder written beside them, and the "
            "same torch version as the one that exported them.",
        ) from error
    return EvaluatedModel(atomistic, path)
