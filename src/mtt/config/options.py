"""The top-level options of a run."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, Optional, Union

from ..schema import REQUIRED, option

#: the types, in words, of the options declared as ``Any`` here (they are parsed elsewhere)
TYPE_NAMES = {
    "training_set": "path | dataset block | list of dataset blocks",
    "validation_set": "float | path | dataset block | list of dataset blocks",
    "test_set": "float | path | dataset block | list of dataset blocks",
    "architecture.model": "mapping",
    "architecture.training": "mapping",
}
#: defaults of the options whose dataclass default is not what a run starts from
DEFAULT_NAMES = {
    "base_precision": "the architecture's",
    "architecture.model": "the architecture's",
    "architecture.training": "see the keys below",
}


@dataclass
class ArchitectureOptions:
    name: str = option("soap_bpnn", "Architecture to train (soap_bpnn, composition, or a plug-in).")
    model: Any = option({}, "Model hyperparameters of the architecture.")
    training: Any = option({}, "Training hyperparameters (the Trainer's).")


@dataclass
class DistributedOptions:
    enabled: bool = option(False, "Train with several processes (set with distributed=true).")
    port: Optional[int] = option(
        None, "Rendezvous port; default: MASTER_PORT if set, else derived from the SLURM job id."
    )
    timeout: float = option(120.0, "Seconds to wait for every rank at start-up before failing.")


@dataclass
class DatasetDefaults:
    reader: Literal["ase"] = option("ase", "Default reader of dataset files.")
    length_unit: str = option("angstrom", "Default length unit of dataset files.")


@dataclass
class RunOptions:
    """Everything ``mtt train`` reads from options.yaml and the command line."""

    training_set: Any = option(REQUIRED, "Training data: a file, a dataset block or a list of blocks.")
    validation_set: Any = option(0.1, "Fraction of the training data, or dataset block(s).")
    test_set: Any = option(0.1, "Fraction of the training data, or dataset block(s); 0 for none.")
    seed: Optional[int] = option(None, "Random seed; a random one is chosen and recorded when null.")
    device: str = option("auto", "auto, cpu, cuda or cuda:N.")
    base_precision: Optional[Literal[32, 64]] = option(
        None,
        "Floating point precision: 32 or 64. By default the architecture's (equivariant_mp: 32, soap_bpnn: 64); "
        "the baseline fit, loss sums and uncertainty covariances are accumulated in float64 either way.",
    )
    logger: Union[Literal["none", "tensorboard", "wandb"], list[Literal["tensorboard", "wandb"]]] = option(
        "none",
        "Where every epoch's metrics also go, besides metrics.csv: 'tensorboard' (event files in the run "
        "folder's tensorboard/), 'wandb' (a Weights & Biases run in its wandb/, offline unless WANDB_MODE "
        "says otherwise), or a list of both.",
    )
    architecture: ArchitectureOptions = option(ArchitectureOptions(), "The architecture and its hyperparameters.")
    distributed: DistributedOptions = option(DistributedOptions(), "Multi-process training.")
    dataset: DatasetDefaults = option(DatasetDefaults(), "Defaults for every dataset block.")

    @property
    def loggers(self) -> list[str]:
        """The ``logger`` option as a list of names."""
        if isinstance(self.logger, list):
            return list(dict.fromkeys(self.logger))
        return [] if self.logger == "none" else [self.logger]
