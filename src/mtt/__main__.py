"""The `mtt` command line, and the dispatcher that turns every failure into one message.

User and environment problems (:class:`mtt.errors.MttError`) are printed as they are;
errors raised inside an architecture say so and name its maintainers; anything else is an
internal error of mtt. The full traceback goes to error.log in the run folder, and
``--debug`` prints it. The exit status is non-zero on every failure.
"""

from __future__ import annotations

import argparse
import sys
import traceback

from . import __version__
from .allocator import keep_freed_memory
from .commands.context import RunContext


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="mtt",
        description="Train machine-learning models of atoms from a short YAML file.",
    )
    parser.add_argument("--version", action="version", version=f"mtt {__version__}")
    # --debug before the command too (`mtt --debug train ...`); its own name, because the
    # command's default would otherwise overwrite it
    parser.add_argument("--debug", action="store_true", dest="debug_first", help="print the full traceback of errors")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    # options every command takes
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--debug", action="store_true", help="print the full traceback of errors")

    train = commands.add_parser(
        "train",
        parents=[common],
        help="train a model from an options file",
        description="Train a model. Overrides use Hydra's syntax and may come before or after the "
        "other arguments, e.g. `mtt train options.yaml architecture.training.num_epochs=5 seed=3 "
        "distributed=true` or `mtt train options.yaml --restart auto architecture.training.num_epochs=25`.",
    )
    train.add_argument("options", help="the options file (YAML)")
    train.add_argument("overrides", nargs="*", help="key=value overrides of the options")
    train.add_argument(
        "-o", "--output", default="model.pt", help="where to write the exported model (default: model.pt)"
    )
    train.add_argument(
        "--restart",
        metavar="CHECKPOINT",
        help="continue from a checkpoint, or 'auto': the latest checkpoint under outputs/ of a run with these options",
    )

    calibrate = commands.add_parser(
        "calibrate",
        parents=[common],
        help="fit the uncertainty of a trained model without training it again",
        description="Fit the last-layer uncertainty of a checkpoint's model (energy_uncertainty and the "
        "energy_ensemble whose forces give the force uncertainty): its covariance on the training set of an "
        "options file, its calibration on the validation set, split as `mtt train` splits them. Writes a "
        "new run folder with the checkpoint and exports the model; the checkpoint given is left as it is. "
        "For models trained with uncertainty: false, or by an mtt without uncertainties.",
    )
    calibrate.add_argument("checkpoint", help="an mtt checkpoint (.ckpt)")
    calibrate.add_argument("options", help="the options file (YAML) of the datasets to fit on: the training run's")
    calibrate.add_argument("overrides", nargs="*", help="key=value overrides of the options")
    calibrate.add_argument(
        "-o", "--output", default="model.pt", help="where to write the exported model (default: model.pt)"
    )

    learn = commands.add_parser(
        "learn",
        parents=[common],
        help="grow a dataset where the model is unsure: MD, selection, labelling, training, in rounds",
        description="Active learning: train a model with uncertainty on the training set of an options file, "
        "then, round by round, run MD with it, label its most uncertain frames with an ASE calculator and "
        "fine-tune on the grown set. Overrides of the learn options use Hydra's syntax, e.g. "
        "`mtt learn learn.yaml rounds=3 explore.temperature=400`. Writes learn/round_<n>/, learning.csv and "
        "learning.png.",
    )
    learn.add_argument("learn_options", help="the learn options file (YAML)")
    learn.add_argument("overrides", nargs="*", help="key=value overrides of the learn options")
    learn.add_argument(
        "--restart", metavar="auto", help="'auto': continue the run in the learn folder where it stopped"
    )

    export = commands.add_parser(
        "export",
        parents=[common],
        help="export a checkpoint as a metatomic model for ASE, LAMMPS and i-PI",
        description="Export the best model of a checkpoint in the metatomic format; the "
        "compiled extensions it needs are collected in 'extensions/' beside it.",
    )
    export.add_argument("checkpoint", help="an mtt checkpoint (.ckpt)")
    export.add_argument("-o", "--output", default="model.pt", help="the model file to write (default: model.pt)")

    evaluate = commands.add_parser(
        "eval",
        parents=[common],
        help="evaluate a model on datasets: errors, predictions, parity plots",
        description="Predict with a trained model (model.pt, a checkpoint or a run folder) on the datasets "
        "of an options file (one dataset block, or a list of them; targets optional), or on the test set "
        "of a training run (a training options file, or nothing for the run folder's own test set), print "
        "the errors and write the predictions, with the reference values, as extended XYZ.",
    )
    evaluate.add_argument("model", help="an exported model (.pt), an mtt checkpoint (.ckpt) or a run folder")
    evaluate.add_argument(
        "options",
        nargs="?",
        help="YAML file with the dataset(s) to evaluate on, a structure file (its energies, forces and "
        "stress when it has them) or a converted dataset, or a training options file (its test set); "
        "default: the test set of the model's run folder",
    )
    evaluate.add_argument(
        "-o", "--output", default="predictions.xyz", help="predictions file (default: predictions.xyz)"
    )
    evaluate.add_argument("--plots", action="store_true", help="write a parity plot (PNG) per target")
    evaluate.add_argument("--batch-size", type=int, default=16, help="structures per batch (default: 16)")

    data = commands.add_parser(
        "data",
        help="convert datasets once, to stream them from disk; describe converted datasets",
        description="Datasets too large for memory are converted once into a folder of arrays that "
        "`mtt train` and `mtt eval` stream from disk (training_set: train.mttdata).",
    )
    data_commands = data.add_subparsers(dest="data_command", metavar="DATA_COMMAND", required=True)
    convert = data_commands.add_parser(
        "convert",
        parents=[common],
        help="convert dataset files into one converted dataset",
        description="Convert the structures and targets of a dataset file (one dataset block, systems and "
        "targets as in the training options, or a list of blocks whose files feed one dataset) into a "
        "converted dataset, in bounded memory, on every core (extended XYZ files are parsed in parallel).",
    )
    convert.add_argument("dataset", help="YAML file with the dataset block(s)")
    convert.add_argument("-o", "--output", required=True, help="the converted dataset to write (.mttdata is added)")
    convert.add_argument("--processes", type=int, help="processes parsing the files (default: one per core)")
    info = data_commands.add_parser(
        "info",
        parents=[common],
        help="print what a converted dataset holds",
        description="Print the structures, atoms, elements, targets with their units, size on disk and "
        "atom-count range of a converted dataset.",
    )
    info.add_argument("dataset", help="a converted dataset (.mttdata)")
    info.add_argument(
        "--verify", action="store_true", help="also check every array against the digest of its conversion"
    )

    options = commands.add_parser(
        "options",
        parents=[common],
        help="list every option with its default and documentation",
        description="Print every option of `mtt train` (top level, the architecture's model hyperparameters, "
        "the training hyperparameters, datasets, distributed training) with its type, default and "
        "documentation.",
    )
    options.add_argument(
        "architecture", nargs="?", help="the architecture whose model hyperparameters to list (default: soap_bpnn)"
    )
    return parser


def run_command(args: argparse.Namespace, context: RunContext) -> None:
    if args.command == "train":
        from .commands.train import train

        train(args.options, args.overrides, args.output, args.restart, context)
    elif args.command == "calibrate":
        from .commands.calibrate import calibrate

        calibrate(args.checkpoint, args.options, args.overrides, args.output, context)
    elif args.command == "learn":
        from .commands.learn import learn

        learn(args.learn_options, args.overrides, args.restart)
    elif args.command == "export":
        from .commands.export import export

        export(args.checkpoint, args.output)
    elif args.command == "eval":
        from .commands.eval import evaluate

        evaluate(args.model, args.options, args.output, args.plots, args.batch_size)
    elif args.command == "data" and args.data_command == "convert":
        from .commands.data import convert

        convert(args.dataset, args.output, args.processes)
    elif args.command == "data":
        from .commands.data import info

        info(args.dataset, args.verify)
    elif args.command == "options":
        from .commands.options import show_options

        show_options(args.architecture)


def parse_arguments(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line, with `mtt train`'s overrides taken wherever they are: argparse
    alone stops collecting them at the first flag (``--restart auto``)."""
    parser = build_parser()
    args, extras = parser.parse_known_args(argv)
    if extras:
        if args.command in ("train", "calibrate", "learn") and not any(extra.startswith("-") for extra in extras):
            args.overrides = list(args.overrides) + extras
        else:
            parser.error(f"unrecognized arguments: {' '.join(extras)}")
    args.debug = getattr(args, "debug", False) or args.debug_first
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_arguments(argv)
    keep_freed_memory()
    context = RunContext(arguments=list(sys.argv[1:] if argv is None else argv))
    try:
        run_command(args, context)
        return 0
    except KeyboardInterrupt as interrupted:
        print(f"mtt: interrupted{': ' + str(interrupted) if str(interrupted) else ''}", file=sys.stderr)
        return 130
    except Exception as error:
        return report(error, context, args.debug)


def report(error: BaseException, context: RunContext, debug: bool) -> int:
    from .errors import MttError
    from .outputs.logs import write_error_log
    from .training.stopping import StopRequested

    environment = context.environment
    rank = environment.rank if environment is not None and environment.enabled else None
    if isinstance(error, StopRequested):  # not a failure: one message, from rank 0
        if not rank:
            print(f"mtt: {error}", file=sys.stderr)
        if environment is not None:  # every rank stopped together: close the group in order
            environment.shutdown()
        return error.exit_status
    log = None
    if context.run_folder is not None and context.run_folder.exists():
        log = write_error_log(context.run_folder, error, rank)
    if not isinstance(error, MttError) and rank is not None:
        from .distributed import peer_failure

        error = peer_failure(error, environment) or error
    if debug:
        traceback.print_exception(type(error), error, error.__traceback__, file=sys.stderr)
    where = f" (rank {rank})" if rank is not None else ""
    if isinstance(error, MttError):
        print(f"mtt{where}: {error.kind}: {error}", file=sys.stderr)
    else:
        print(
            f"mtt: internal error: {type(error).__name__}: {error}\n"
            "This is a bug in mtt; please report it on the mtt issue tracker with the error.log.",
            file=sys.stderr,
        )
    if log is not None:
        print(f"The full traceback is in {log}.", file=sys.stderr)
    elif not debug:
        print("Run again with --debug to see the full traceback.", file=sys.stderr)
    if isinstance(error, MttError):
        return getattr(error, "exit_status", 2)
    return 1


if __name__ == "__main__":
    sys.exit(main())
