"""`mtt export`: a checkpoint to a metatomic model file (nothing written on failure)."""

from __future__ import annotations

from pathlib import Path

from .. import architectures
from ..export import export_model, model_from_state
from ..outputs.logs import LOGGER, setup_logging
from ..training.state import TrainingState


def export(checkpoint_path: str, output: str) -> None:
    setup_logging(None)
    state = TrainingState.load(checkpoint_path)
    model, info, architecture = model_from_state(state)
    with architectures.blame_architecture(architecture):  # TorchScript compiles its code
        path = export_model(model, info, architecture, Path(output))
    LOGGER.info(
        "exported the %s model of %s (epoch %d, best by validation) to %s, extensions in %s",
        architecture.name,
        checkpoint_path,
        state.epoch,
        path,
        path.parent / "extensions",
    )
