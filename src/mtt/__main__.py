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
from dataclasses import dataclass
from pathlib import Path

from . import __version__


@dataclass
class RunContext:
    """What the dispatcher needs to know about the command while it runs."""

    run_folder: Path | None = None
    environment: object | None = None  # mtt.distributed.DistributedEnvironment, once set up


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="mtt",
        description="Train machine-learning models of atoms from a short YAML file.",
    )
    parser.add_argument("--version", action="version", version=f"mtt {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    # options every command takes
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--debug", action="store_true", help="print the full traceback of errors")

    train = commands.add_parser(
        "train",
        parents=[common],
        help="train a model from an options file",
        description="Train a model. Overrides after the file use Hydra's syntax, e.g. "
        "`mtt train options.yaml architecture.training.num_epochs=5 seed=3 distributed=true`.",
    )
    train.add_argument("options", help="the options file (YAML)")
    train.add_argument("overrides", nargs="*", help="key=value overrides of the options")
    train.add_argument(
        "-o", "--output", default="model.pt", help="where to write the exported model (default: model.pt)"
    )
    train.add_argument(
        "--restart",
        metavar="CHECKPOINT",
        help="continue from a checkpoint, or 'auto' for the one with the highest epoch under outputs/",
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
        description="Predict with a trained model (model.pt or a checkpoint) on the datasets of "
        "an options file (one dataset block, or a list of them; targets optional), print the "
        "errors and write the predictions as extended XYZ.",
    )
    evaluate.add_argument("model", help="an exported model (.pt) or an mtt checkpoint (.ckpt)")
    evaluate.add_argument("options", help="YAML file with the dataset(s) to evaluate on")
    evaluate.add_argument(
        "-o", "--output", default="predictions.xyz", help="predictions file (default: predictions.xyz)"
    )
    evaluate.add_argument("--plots", action="store_true", help="write a parity plot (PNG) per target")
    evaluate.add_argument("--batch-size", type=int, default=16, help="structures per batch (default: 16)")
    return parser


def run_command(args: argparse.Namespace, context: RunContext) -> None:
    if args.command == "train":
        from .commands.train import train

        train(args.options, args.overrides, args.output, args.restart, context)
    elif args.command == "export":
        from .commands.export import export

        export(args.checkpoint, args.output)
    elif args.command == "eval":
        from .commands.eval import evaluate

        evaluate(args.model, args.options, args.output, args.plots, args.batch_size)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    context = RunContext()
    try:
        run_command(args, context)
        return 0
    except KeyboardInterrupt:
        print("mtt: interrupted", file=sys.stderr)
        return 130
    except Exception as error:
        return report(error, context, args.debug)


def report(error: BaseException, context: RunContext, debug: bool) -> int:
    from .errors import MttError
    from .outputs import write_error_log
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
