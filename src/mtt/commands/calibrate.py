"""`mtt calibrate`: the uncertainty of a trained model, fitted without training it again.

options -> distributed env -> checkpoint -> data -> fit -> checkpoint -> export. The
covariance comes from the options' training set and the calibration from its validation
set, split as `mtt train` splits them (with the options' seed): given the options of the
run that trained the model, the fit is the one that run would have made.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

from ase.data import chemical_symbols

from .. import architectures, distributed
from ..config import load_options
from ..data.batching import compute_neighbor_lists
from ..data.dataset import DatasetInfo, load_splits
from ..data.structure_sets import InMemorySet
from ..errors import DataError, OptionsError
from ..export import export_run_model, model_from_state
from ..outputs.logs import FILE_LOGGER, LOGGER, setup_logging
from ..outputs.run_folder import new_run_folder, write_run_files
from ..outputs.terminal import print_summary
from ..training.state import TrainingState
from ..training.trainer import Trainer
from ..training.uncertainty import fit_uncertainty, wants_uncertainty
from .context import RunContext


def calibrate(checkpoint_path: str, options_path: str, overrides: list[str], output: str, context: RunContext) -> None:
    setup_logging(None)
    options = load_options(options_path, overrides)
    run, hypers = options.run, options.trainer_hypers
    state = TrainingState.load(checkpoint_path)
    name = state.identity.architecture
    if run.architecture.name != name:
        raise OptionsError(
            f"{checkpoint_path} holds a '{name}' model, but the options' architecture.name is "
            f"'{run.architecture.name}'.",
            hint="Give the options of the run that trained the model: its datasets are what is fitted on.",
        )
    # asked for by this command, whatever the options of a run trained without it say;
    # a model that cannot have one is refused
    hypers.uncertainty = True
    environment = distributed.setup(run.distributed.enabled, run.distributed.port, run.distributed.timeout, run.device)
    context.environment = environment
    main = environment.is_main
    setup_logging(None, verbose=main)
    model, model_info, architecture = model_from_state(state)
    dtype = next(v.dtype for v in model.state_dict().values() if v.is_floating_point())
    model = model.to(environment.device)
    wants_uncertainty(model, hypers, architecture.name)

    splits = load_splits(options.raw, Path(options_path).parent, run.seed)
    _check_data(splits.info, model_info, checkpoint_path)
    with architectures.blame_architecture(architecture):
        requests = model.requested_neighbor_lists()
    for structures in (splits.train, splits.validation):
        if isinstance(structures, InMemorySet):
            compute_neighbor_lists(structures.structures, requests)

    folder = Path(environment.broadcast_object(str(new_run_folder()) if main else None))
    context.run_folder = folder
    if main:
        setup_logging(folder / "calibrate.log")
        LOGGER.info("run folder: %s", folder)
        LOGGER.info("distributed: %s", environment.describe())
        write_run_files(folder, options.to_yaml(), options_path, context.arguments or [], splits.sets)
        LOGGER.info(
            "calibrating %s on %d training and %d validation structures",
            checkpoint_path,
            len(splits.train),
            len(splits.validation),
        )
    trainer = Trainer(hypers, architecture, splits.info, environment, dtype, run.seed)
    try:
        fitted = fit_uncertainty(trainer, model, splits.train, splits.validation)
    finally:
        trainer.close()
    if not fitted.factors:
        raise DataError(
            f"the validation set of {options_path} has no energies: the uncertainty is calibrated on them.",
            hint="Give a validation set with the energies the model predicts.",
        )
    FILE_LOGGER.info("uncertainty: %s", fitted.describe())
    files = []
    if main:
        # the checkpoint's own weights (a fine-tuning's adapters apart), with the fitted posterior
        for key, value in model.uncertainty.state_dict(prefix="uncertainty.").items():
            state.best_model_state[key] = value.detach().cpu().clone()
            state.model_state[key] = value.detach().cpu().clone()
        state.write(folder / "model.ckpt")
        files = export_run_model(model, model_info, architecture, folder, Path(output))
        files.append(("checkpoint", str(folder / "model.ckpt")))
        width = max(len(label) for label, _ in files) + 1
        lines = ["", "Summary"]
        lines += textwrap.wrap(f"uncertainty: {fitted.describe()}", 78, initial_indent="  ", subsequent_indent="    ")
        lines += [f"  {label + ':':<{width}} {where}" for label, where in files]
        print_summary(lines)
    environment.shutdown()


def _check_data(data: DatasetInfo, model: DatasetInfo, checkpoint: str) -> None:
    """The calibration data must be of the model's elements and targets."""
    unknown = sorted(set(data.atomic_types) - set(model.atomic_types))
    if unknown:
        raise DataError(
            f"the datasets contain {', '.join(chemical_symbols[z] for z in unknown)}, which the model of "
            f"{checkpoint} was not trained on.",
            hint="Calibrate on structures of the model's elements: "
            + ", ".join(chemical_symbols[z] for z in model.atomic_types),
        )
    for name, target in data.targets.items():
        known = model.targets.get(name)
        if known is None:
            raise DataError(
                f"the datasets give target '{name}', which the model of {checkpoint} does not predict (it "
                f"predicts {', '.join(model.targets)}).",
                hint="Read only the model's targets in the options' datasets.",
            )
        if known.layout != target.layout:
            raise DataError(
                f"target '{name}' of the datasets is not the model's: {target.describe()} here, "
                f"{known.describe()} in {checkpoint}.",
                hint="Read the target as the run that trained the model did.",
            )
