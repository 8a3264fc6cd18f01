"""What `mtt train` writes besides the checkpoints: the run folder's own files, and at the
end the exported model (an earlier file at -o is kept aside) and the learning curve."""

from __future__ import annotations

import shlex
import shutil
from pathlib import Path

import torch
import yaml

from .. import architectures
from ..config import ComposedOptions
from ..data.dataset import DatasetInfo, Splits
from ..export import export_model
from ..learning_curve import write_learning_curve
from ..outputs import keep_previous
from ..training.hypers import TrainerHypers
from ..training.plateau import PlateauSchedule
from .restart import COMMAND_FILE


def write_run_files(
    folder: Path, options: ComposedOptions, options_path: str, arguments: list[str], splits: Splits
) -> None:
    """options.yaml (composed), command.yaml (how the run was started) and indices/."""
    (folder / "options.yaml").write_text(options.to_yaml())
    command = {
        "command": shlex.join(["mtt", *arguments]),
        "options_file": str(Path(options_path).resolve()),
        "folder": str(Path.cwd()),
    }
    (folder / COMMAND_FILE).write_text("# how this run was started\n" + yaml.safe_dump(command, sort_keys=False))
    indices = folder / "indices"
    indices.mkdir()
    for name, structures in splits.sets.items():
        with open(indices / f"{name}.txt", "w") as file:
            for path, numbers in structures.origins():
                file.writelines(f"{path}\t{i}\n" for i in numbers.tolist())


def how_it_trains(hypers: TrainerHypers, world_size: int) -> str:
    """The schedule of a run in a line: what metatrain's options turn into is visible."""
    batch = f"batch {hypers.batch_size}" + (
        f" per rank ({hypers.batch_size * world_size} in all)" if world_size > 1 else ""
    )
    if hypers.max_atoms_per_batch is not None:
        batch = f"batches packed to {hypers.max_atoms_per_batch} atoms" + (
            f" per rank ({hypers.max_atoms_per_batch * world_size} in all)" if world_size > 1 else ""
        )
    plateau = PlateauSchedule(hypers.scheduler_patience, hypers.scheduler_factor)  # its defaults filled in
    schedule = {
        "cosine": f"cosine decay to {hypers.final_lr_fraction:g} of it",
        "constant": "constant",
        "plateau": f"times {plateau.factor:g} when the validation loss has not decreased for more than "
        f"{plateau.patience} epochs",
    }[hypers.schedule]
    stop = (
        f", stops after {hypers.early_stopping_patience} epochs without a better model"
        if hypers.early_stopping_patience
        else ""
    )
    return f"{hypers.num_epochs} epochs, {batch}, learning rate {hypers.learning_rate:g} ({schedule}){stop}"


def deliver(
    model: torch.nn.Module,
    info: DatasetInfo,
    architecture: architectures.Architecture,
    folder: Path,
    target: Path,
    best_epoch: int,
) -> list[tuple[str, str]]:
    """Export the best model into the run folder and to ``target`` (an older file there is
    kept aside, never replaced silently); draw the learning curve. Returns what went where."""
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
    files.append(("checkpoint", str(folder / "model.ckpt")))
    curve = write_learning_curve(folder / "metrics.csv", folder / "learning_curve.png", best_epoch)
    if curve is not None:
        files.append(("learning curve", str(curve)))
    return files
