"""Hyperparameters of the one Trainer, shared by every architecture."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Literal, Optional, Union

from ..schema import REQUIRED, option


def _unset_or(value: int | None, least: int) -> bool:
    return value is None or value >= least


@dataclass
class LossHypers:
    type: Literal["mse", "mae", "huber"] = option("mse", "Loss function for every target.")
    weights: dict[str, float] = option(
        {},
        "Weight of each term, by target name; 'forces' and 'stress' weigh the "
        "derivatives of the energy. Missing terms weigh what the architecture sets (equivariant_mp: forces 3), "
        "or 1.",
    )
    huber_delta: float = option(1.0, "Transition point of the Huber loss, on normalised errors.")
    types: dict[str, Literal["mse", "mae", "huber"]] = option(
        {}, "Loss function of single terms, by the names of `weights` (e.g. {forces: mae}); the others use `type`."
    )


@dataclass
class FinalStageHypers:
    """A last stage of training with its own learning rate and loss weights."""

    start_fraction: float = option(
        0.75, "Fraction of num_epochs after which the stage starts: from epoch round(fraction x num_epochs) + 1."
    )
    learning_rate: float = option(0.001, "Learning rate of the stage, constant.")
    loss_weights: dict[str, float] = option(
        {}, "Weights of the loss terms in the stage, by name as loss.weights; the others keep theirs."
    )

    def __post_init__(self):
        if not 0 <= self.start_fraction < 1 or self.learning_rate <= 0:
            raise ValueError("final_stage needs 0 <= start_fraction < 1 and learning_rate > 0")


@dataclass
class ShallowEnsembleHypers:
    """Last-layer members trained with the model, by a likelihood of their spread."""

    members: int = option(8, "Members of the ensemble (at least 2), exported as energy_ensemble.")
    loss: Literal["nll", "crps"] = option(
        "crps",
        "How the members' spread is scored against the errors: the continuous ranked probability score of "
        "a Gaussian (crps, less sensitive to outliers; it ranked and calibrated the force errors of the "
        "Uncertainty page's benchmark better than nll) or the Gaussian negative log-likelihood (nll).",
    )
    weight: float = option(1.0, "Weight of that term beside the usual loss terms.")
    forces: bool = option(
        True,
        "Also score the spread of the members' forces against each force component's error, when the run "
        "trains forces: what makes it a force uncertainty (trained on energies alone, it barely ranks the "
        "force errors). Costs about two backward passes of the model per member and step.",
    )

    def __post_init__(self):
        problems = []
        if self.members < 2:
            problems.append(f"members must be >= 2 (a spread needs two members), got {self.members!r}")
        if not self.weight > 0:
            problems.append(f"weight must be > 0, got {self.weight!r}")
        if problems:
            raise ValueError("\n".join(problems))


@dataclass
class FinetuneHypers:
    """Start from a trained model instead of random weights."""

    read_from: str = option(
        REQUIRED,
        "Checkpoint (.ckpt, e.g. a run's model.ckpt) of the same architecture to start from; its best "
        "weights are taken, and its model hyperparameters. A relative path is taken from the options "
        "file's folder.",
    )
    method: Literal["full", "heads", "lora"] = option(
        "full",
        "What is trained: every weight (full), only the output heads (heads), or low-rank adapters of "
        "every weight matrix with the heads (lora).",
    )
    lora_rank: int = option(4, "With lora: the rank of each adapter.")
    lora_alpha: float = option(8.0, "With lora: adapters are scaled by lora_alpha / lora_rank.")
    refit_baseline: bool = option(
        False,
        "Refit the per-element baseline of every element from the new data. By default the checkpoint's is "
        "kept for its elements and targets, and fitted for new elements and new targets.",
    )
    original_validation_interval: Optional[int] = option(
        None,
        "Also evaluate on the checkpoint's own validation structures every this many epochs (they are "
        "always evaluated before and after fine-tuning, when their files are found); null: only then.",
    )

    def __post_init__(self):
        problems = []
        if self.lora_rank < 1:
            problems.append(f"lora_rank must be >= 1, got {self.lora_rank!r}")
        if self.original_validation_interval is not None and self.original_validation_interval < 1:
            problems.append(f"original_validation_interval must be >= 1, got {self.original_validation_interval!r}")
        if problems:
            raise ValueError("\n".join(problems))


@dataclass
class TrainerHypers:
    """How the model is trained; read from ``architecture.training``."""

    batch_size: int = option(16, "Structures per optimisation step.")
    max_atoms_per_batch: Optional[int] = option(
        None,
        "Pack batches by atom count instead of batch_size: each optimisation step takes structures of the "
        "shuffled order until the next would bring its atoms above this number (per rank; with N ranks a step "
        "holds up to N times as many, shared by atom count). For sets whose structures range from a few "
        "atoms to hundreds. null: batch_size structures per step.",
    )
    validation_batch_size: Optional[int] = option(
        None,
        "Structures per batch (per rank) when the validation, test and monitored sets are evaluated. null: "
        "twice the training batch (2 x batch_size structures, or packed to 2 x max_atoms_per_batch atoms). "
        "Evaluation takes no derivatives of the forces with respect to the weights, so a structure needs less "
        "memory than in a training step (about half with equivariant_mp), and larger batches spread the fixed "
        "cost of each batch.",
    )
    num_epochs: int = option(100, "Passes over the training set.")
    learning_rate: float = option(0.01, "Peak learning rate, reached after the warm-up.")
    optimizer: Literal["adam", "adamw"] = option("adam", "Optimiser.")
    amsgrad: bool = option(False, "The AMSGrad variant of the optimiser (the running maximum of the second moments).")
    weight_decay: float = option(0.0, "Weight decay (decoupled with adamw).")
    warmup_fraction: float = option(0.01, "Fraction of all steps spent ramping the learning rate up linearly.")
    lr_schedule: Literal["cosine", "constant", "plateau"] = option(
        "cosine",
        "Learning rate after the warm-up: cosine decay to final_lr_fraction, constant, or plateau "
        "(multiplied by scheduler_factor whenever the validation loss has not decreased for more than "
        "scheduler_patience epochs, metatrain's schedule). Giving scheduler_patience or "
        "scheduler_factor, as metatrain's files do, chooses plateau.",
    )
    final_lr_fraction: float = option(0.01, "With the cosine schedule, final learning rate / peak.")
    loss: Union[Literal["mse", "mae", "huber"], LossHypers] = option(
        "mse",
        "Loss: a type for every term, or {type, weights, types, huber_delta}; metatrain's per-target "
        "blocks ({energy: {type, weight, forces: {...}}}) are read too.",
    )
    best_model_metric: Literal["loss", "rmse_prod", "mae_prod"] = option(
        "rmse_prod",
        "Validation figure that picks the best model: the loss, or the product of the RMSEs (MAEs) of every target.",
    )
    scale_targets: Union[bool, Literal["forces"]] = option(
        True,
        "Scale the network's output of each target by the target's spread (per atom after the baseline), so "
        "that it starts near 1; 'forces': for energies learned with forces, by the RMS of the forces times 1 Å "
        "instead (MACE's choice); false: no scale.",
    )
    fixed_composition_weights: dict[str, dict[int, float]] = option(
        {}, "Per-element baseline values to use instead of fitting them: {target: {Z: value}}."
    )
    uncertainty: Optional[bool] = option(
        None,
        "Fit last-layer uncertainties of the energies after training (LLPR: one pass over the training "
        "set, calibrated on the validation set), exported as energy_uncertainty per structure and per "
        "atom. null: when the architecture offers last-layer features; true: required (an architecture "
        "without them is refused before training); false: none.",
    )
    uncertainty_ensemble_size: int = option(
        16,
        "Members of the ensemble sampled from the last-layer posterior with the uncertainty (of the energies "
        "and forces both when the run trains forces), exported as energy_ensemble: its members' forces give "
        "the force uncertainty (calibrated on the validation forces when the run trains forces). Each member "
        "costs a backward pass where forces are asked.",
    )
    uncertainty_forces: bool = option(
        True,
        "For a run that trains forces, draw the ensemble from the last-layer posterior of the energies and "
        "forces (second backward passes along 8 random displacements of each training structure, and one "
        "backward pass per last-layer feature over the validation set), which ranks the force errors better; "
        "false: from the energies' posterior (no pass over the training set's derivatives: a cheaper fit).",
    )
    shallow_ensemble: Optional[ShallowEnsembleHypers] = option(
        None,
        "Train a shallow ensemble with the model: {members, loss: nll | crps, weight, forces}. The members "
        "are last-layer heads on the model's trunk, centred on its own head, trained alone by a likelihood "
        "term of their spread against the energy (and force) errors beside the usual loss, which the model's "
        "own weights keep; after training they are the exported energy_ensemble (instead of members sampled "
        "from the last-layer posterior: uncertainty_ensemble_size is then unused), their spread calibrated "
        "on the validation set. An ensemble without N trainings. null: none. Needs uncertainty null or true.",
    )
    checkpoint_interval: int = option(25, "Write a checkpoint every this many epochs.")
    log_interval: int = option(1, "Print a progress line every this many epochs (files only).")
    log_mae: bool = option(False, "Print MAEs beside RMSEs in the progress lines.")
    max_grad_norm: Optional[float] = option(None, "Clip the gradient norm to this value.")
    ema_decay: Optional[float] = option(
        None,
        "Decay of an exponential moving average of the weights, updated at every step (0.99 "
        "is common; null: none). Validation, the best model and the exported model then use "
        "the averaged weights.",
    )
    final_stage: Optional[FinalStageHypers] = option(
        None,
        "A last stage with its own constant learning rate and loss weights (null: none), e.g. "
        "a larger energy weight at the end of force training, as MACE does.",
    )
    cache_memory_mb: float = option(
        1024.0,
        "Memory, in MB per process, for what is kept between epochs: structures streamed from a "
        "converted dataset, once read (with their neighbour lists; they come first), and what the "
        "architecture computes once per structure (SOAP-BPNN: the descriptor, and with forces or stress "
        "what its derivatives need, about 0.25 MB per ethanol molecule; kept only when the whole training "
        "set's fits, since it serves only batches kept whole). Structures beyond it are read or computed at "
        "every step, with the same results; 0 keeps nothing.",
    )
    num_workers: Optional[int] = option(
        None,
        "Processes that read and prepare batches ahead of the training step (torch DataLoader workers), "
        "per rank. null: none for datasets held in memory; for converted datasets streamed from disk, a "
        "quarter of the rank's cores, from 1 to 4. The numbers do not depend on it.",
    )
    finetune: Optional[FinetuneHypers] = option(
        None,
        "Fine-tune a trained model: {read_from: checkpoint, method: full | heads | lora, ...}, or the "
        "checkpoint's path alone (method full). null: train from scratch.",
    )

    early_stopping_patience: Optional[int] = option(
        None,
        "Stop when the validation figure of best_model_metric has not improved for this many epochs "
        "(metatrain's option); null: train all num_epochs.",
    )
    scheduler_patience: Optional[int] = option(
        None,
        "Plateau schedule: the rate is lowered after more than this many epochs without a lower validation "
        "loss (default 10).",
    )
    scheduler_factor: Optional[float] = option(
        None, "Plateau schedule: what the learning rate is multiplied by each time (default 0.8)."
    )

    def __post_init__(self):
        # one line per problem, each starting with the option's name: the parser ties it to its key
        problems = []
        for name, value, ok, rule in (
            ("batch_size", self.batch_size, self.batch_size >= 1, ">= 1"),
            ("num_epochs", self.num_epochs, self.num_epochs >= 0, ">= 0"),
            ("learning_rate", self.learning_rate, self.learning_rate > 0, "> 0"),
            ("warmup_fraction", self.warmup_fraction, 0 <= self.warmup_fraction < 1, "in [0, 1)"),
            ("checkpoint_interval", self.checkpoint_interval, self.checkpoint_interval >= 1, ">= 1"),
            ("log_interval", self.log_interval, self.log_interval >= 1, ">= 1"),
            ("cache_memory_mb", self.cache_memory_mb, self.cache_memory_mb >= 0, ">= 0"),
            (
                "uncertainty_ensemble_size",
                self.uncertainty_ensemble_size,
                self.uncertainty_ensemble_size >= 2,
                ">= 2 (a spread needs two members)",
            ),
            ("num_workers", self.num_workers, _unset_or(self.num_workers, 0), ">= 0 or null"),
            ("max_atoms_per_batch", self.max_atoms_per_batch, _unset_or(self.max_atoms_per_batch, 1), ">= 1 or null"),
            (
                "validation_batch_size",
                self.validation_batch_size,
                _unset_or(self.validation_batch_size, 1),
                ">= 1 or null",
            ),
            ("ema_decay", self.ema_decay, self.ema_decay is None or 0 < self.ema_decay < 1, "in (0, 1) or null"),
            (
                "early_stopping_patience",
                self.early_stopping_patience,
                _unset_or(self.early_stopping_patience, 1),
                ">= 1",
            ),
            ("scheduler_patience", self.scheduler_patience, _unset_or(self.scheduler_patience, 0), ">= 0"),
            (
                "scheduler_factor",
                self.scheduler_factor,
                self.scheduler_factor is None or 0 < self.scheduler_factor < 1,
                "in (0, 1)",
            ),
        ):
            if not ok:
                problems.append(f"{name} must be {rule}, got {value!r}")
        if self.shallow_ensemble is not None and self.uncertainty is False:
            problems.append(
                "shallow_ensemble needs the uncertainty, whose ensemble its members become: set "
                "architecture.training.uncertainty to null or true, or remove shallow_ensemble"
            )
        plateau_options = self.scheduler_patience is not None or self.scheduler_factor is not None
        if plateau_options and self.lr_schedule == "constant":
            problems.append(
                "scheduler_patience and scheduler_factor set the plateau schedule, but lr_schedule is "
                "'constant': remove them, or use lr_schedule: plateau"
            )
        if problems:
            raise ValueError("\n".join(problems))

    @property
    def schedule(self) -> str:
        """The learning-rate schedule in use: metatrain's plateau options choose plateau."""
        if self.scheduler_patience is not None or self.scheduler_factor is not None:
            return "plateau"
        return self.lr_schedule

    @property
    def loss_hypers(self) -> LossHypers:
        return LossHypers(type=self.loss) if isinstance(self.loss, str) else self.loss

    def final_stage_start(self) -> int | None:
        """The last epoch before the final stage, or None without one."""
        if self.final_stage is None:
            return None
        return round(self.final_stage.start_fraction * self.num_epochs)

    def loss_hypers_of(self, epoch: int) -> LossHypers:
        """The loss of an epoch: the final stage's weights once it has started."""
        start = self.final_stage_start()
        hypers = self.loss_hypers
        if start is None or epoch <= start:
            return hypers
        return dataclasses.replace(hypers, weights={**hypers.weights, **self.final_stage.loss_weights})
