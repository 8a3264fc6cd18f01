"""Sphinx extension: the parts of mtt's documentation that are generated from its code.

- ``.. mtt-options-reference::`` every option of the options file, read from the option
  dataclasses (``mtt.config.options.RunOptions``, the Trainer's ``TrainerHypers``, the
  dataset blocks), with its type, default and the ``doc`` stored by
  :func:`mtt.schema.option`;
- ``.. mtt-architecture-hypers:: NAME`` the model hyperparameters of one architecture;
- ``.. mtt-cli::`` the command-line reference, read from ``mtt.__main__.build_parser()``;
- ``.. mtt-failure:: mtt train options.yaml ...`` runs ``mtt`` on the files given in its
  body while the docs build, and shows the files, the command and what ``mtt`` printed,
  so the troubleshooting page quotes the messages users really get.

The generators (:func:`options_reference`, :func:`architecture_hypers`,
:func:`cli_reference`, :func:`walk`) return reStructuredText and need no Sphinx, so
``tests/test_docs.py`` calls them to check that every option is documented.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import io
import os
import re
import shlex
import shutil
import tempfile
import typing
from pathlib import Path
from typing import Iterator

import yaml

ROOT = Path(__file__).resolve().parents[3]


# -- walking the option dataclasses -------------------------------------------------------
@dataclasses.dataclass
class Entry:
    """One option: its dotted key as users write it, and what the docs say about it."""

    key: str
    type: str
    default: str
    doc: str
    required: bool
    depth: int


def walk(cls: type, prefix: str = "", type_overrides: dict[str, str] | None = None, depth: int = 0) -> Iterator[Entry]:
    """Every option of ``cls``, in the order of the code (:func:`mtt.schema.walk_options`,
    which `mtt options` prints too), with its default as reStructuredText."""
    from mtt.config.options import DEFAULT_NAMES, TYPE_NAMES
    from mtt.schema import walk_options

    for option in walk_options(cls, prefix, {**TYPE_NAMES, **(type_overrides or {})}, depth):
        if option.required:
            default = "required"
        elif dataclasses.is_dataclass(option.default):
            default = "see the keys below"
        else:
            default = f"``{option.default_yaml()}``"
        yield Entry(
            key=option.key,
            type=option.type,
            default=DEFAULT_NAMES.get(option.key, default),
            doc=option.doc,
            required=option.required,
            depth=option.depth,
        )


def _inline(text: str) -> str:
    """Code doc strings use `x` for code; reStructuredText wants ``x``."""
    return re.sub(r"(?<![`:\w])`([^`]+)`(?![`_])", r"``\1``", text)


def confvals(entries: typing.Iterable[Entry], no_index: typing.Collection[str] = ()) -> list[str]:
    lines: list[str] = []
    for entry in entries:
        lines.append(f".. confval:: {entry.key}")
        lines.append(f"   :type: {entry.type}")
        lines.append(f"   :default: {entry.default}")
        if entry.key in no_index:
            lines.append("   :no-index:")
        lines.append("")
        doc = _inline(entry.doc) if entry.doc else "*(undocumented)*"
        lines.extend("   " + line for line in doc.splitlines())
        lines.append("")
    return lines


def _section(title: str, underline: str) -> list[str]:
    return [title, underline * len(title), ""]


# -- the options file ---------------------------------------------------------------------
def options_reference() -> str:
    """The reference of every option of the options file, as reStructuredText."""
    from mtt.config.options import ArchitectureOptions, DatasetDefaults, DistributedOptions, RunOptions
    from mtt.data import units
    from mtt.data.options import DatasetOptions
    from mtt.training.hypers import TrainerHypers

    top = {e.key: e for e in walk(RunOptions) if e.depth == 0}
    lines: list[str] = []

    lines += _section("Top level", "-")
    lines += [
        "The keys at the top of the file. ``architecture``, ``distributed`` and ``dataset``",
        "are groups of options, described in the sections below.",
        "",
    ]
    lines += confvals(e for k, e in top.items() if k not in ("architecture", "distributed", "dataset"))

    lines += _section("Architecture", "-")
    lines += confvals([top["architecture"]])
    lines += confvals(walk(ArchitectureOptions, "architecture"))
    lines += [
        "The keys of ``architecture.model`` depend on the architecture: see :doc:`architectures/index`",
        "for each one's. ``architecture.training`` holds the training hyperparameters below, the same",
        "for every architecture.",
        "",
    ]

    lines += [".. _training-hyperparameters:", ""]
    lines += _section("Training hyperparameters", "-")
    lines += [
        "Read from ``architecture.training``: how the one Trainer shared by every architecture",
        "optimises the model.",
        "",
    ]
    lines += confvals(walk(TrainerHypers, "architecture.training"))

    lines += _section("Datasets", "-")
    lines += [
        "``training_set``, ``validation_set`` and ``test_set`` each take a *dataset block*, a list of",
        "blocks (their structures are put together), or a short form:",
        "",
        "- a path, ``training_set: data.xyz``, is short for a block whose systems are read from that",
        "  file, with an ``energy`` target read from the field ``energy`` of each structure, in eV,",
        "  and its forces and stress when the file has them;",
        "- ``systems: data.xyz`` is short for ``systems: {read_from: data.xyz}``;",
        "- a target given as a string, ``energy: U0``, is short for ``energy: {key: U0}``;",
        "- ``validation_set`` and ``test_set`` can be a fraction in [0, 1) of the training structures,",
        "  set aside at random (with the run's seed); ``test_set: 0`` means no test set.",
        "",
        "Relative paths are taken from the folder of the options file. The keys of a block are listed",
        "below for ``training_set``; blocks of ``validation_set`` and ``test_set`` take the same keys,",
        "and must have the targets of the training set.",
        "",
    ]
    lines += confvals(walk(DatasetOptions, "training_set"))
    lines += [".. _options-units:", ""]
    lines += _section("Units", "~")
    lines += [
        "Values are converted to eV and Å when they are read; metrics, checkpoints and exported",
        "models use these units. Units are not case sensitive.",
        "",
        "- length units (``systems.length_unit``): " + ", ".join(f"``{u}``" for u in units.KNOWN_LENGTH_UNITS) + ";",
        "- energy units (``unit`` of an energy target, and of forces and stress derived from it): "
        + ", ".join(f"``{u}``" for u in units.KNOWN_ENERGY_UNITS)
        + ";",
        "- other per-structure targets: an energy unit, ``Debye``, ``e*angstrom``, ``e*bohr``,",
        "  ``bohr^3``, ``angstrom^3``, or an empty unit to keep the values as they are.",
        "",
    ]

    lines += _section("Distributed training", "-")
    lines += [
        "Chosen as a whole with ``distributed=true`` or ``distributed: true``; the keys below",
        "fine-tune it. :doc:`distributed` explains how to launch such a run.",
        "",
    ]
    lines += confvals([top["distributed"]])
    lines += confvals(walk(DistributedOptions, "distributed"))

    lines += _section("Dataset defaults", "-")
    lines += ["Defaults applied to every dataset block that does not set them.", ""]
    lines += confvals([top["dataset"]])
    lines += confvals(walk(DatasetDefaults, "dataset"))
    return "\n".join(lines) + "\n"


# -- architectures ------------------------------------------------------------------------
def _shared_model_keys() -> set[str]:
    """Keys that several built-in architectures have: they get no cross-reference target."""
    from mtt import architectures

    seen: dict[str, int] = {}
    for name in architectures.BUILTIN:
        for entry in walk(architectures.load(name).hypers_class, "architecture.model"):
            seen[entry.key] = seen.get(entry.key, 0) + 1
    return {key for key, count in seen.items() if count > 1}


def architecture_hypers(name: str) -> str:
    """The model hyperparameters of architecture ``name``, as reStructuredText."""
    from mtt import architectures

    architecture = architectures.load(name)
    entries = list(walk(architecture.hypers_class, "architecture.model"))
    lines = [
        f"Read from ``architecture.model`` when ``architecture.name`` is ``{name}``; the training",
        "hyperparameters (``architecture.training``) are the same for every architecture, see",
        ":ref:`training-hyperparameters`.",
        "",
    ]
    if not entries:
        lines += [f"``{name}`` has no model hyperparameters: ``architecture.model`` stays empty.", ""]
    else:
        lines += confvals(entries, no_index=_shared_model_keys())
    defaults = {"architecture": {"name": name, "model": _plain_defaults(architecture.hypers_class)}}
    if entries:
        lines += [
            "The same defaults, as they would be written in an options file:",
            "",
            ".. code-block:: yaml",
            "",
        ]
        lines += ["   " + line for line in yaml.safe_dump(defaults, sort_keys=False).splitlines()]
        lines.append("")
    if architecture.maintainers:
        lines += [f"**Maintainers:** {', '.join(architecture.maintainers)}.", ""]
    return "\n".join(lines) + "\n"


def _plain_defaults(cls: type) -> dict:
    from mtt.schema import defaults_of

    return defaults_of(cls)


# -- the command line ---------------------------------------------------------------------
def _subcommands(parser: argparse.ArgumentParser, prefix: str = "") -> dict[str, argparse.ArgumentParser]:
    """Every command under ``parser``, by its name after ``mtt`` (``data convert`` for a
    command of a command)."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            found = {}
            for name, subparser in action.choices.items():
                found[prefix + name] = subparser
                found.update(_subcommands(subparser, f"{prefix}{name} "))
            return found
    return {}


def _label(command: str) -> str:
    """The reference label of a command's section: ``cli-data-convert`` for ``data convert``."""
    return "cli-" + command.replace(" ", "-")


def _option_signature(action: argparse.Action, formatter: argparse.HelpFormatter) -> str:
    if not action.option_strings:
        return action.metavar if isinstance(action.metavar, str) else action.dest
    if action.nargs == 0:
        return ", ".join(action.option_strings)
    metavar = formatter._format_args(action, action.dest.upper())
    return ", ".join(f"{s} {metavar}" for s in action.option_strings)


def _describe_parser(parser: argparse.ArgumentParser, program: str, underline: str, top: bool = False) -> list[str]:
    """A section for one (sub)command: description, usage, then its arguments.

    ``--help`` is only listed for the top-level command: every command has it.
    """
    formatter = parser._get_formatter()
    lines = _section(program, underline)
    if parser.description:
        lines += [_inline(parser.description), ""]
    usage = parser.format_usage().strip()
    lines += [".. code-block:: text", "", "   " + usage.replace("\n", "\n   "), ""]
    commands = _subcommand_helps(parser)
    if commands:
        lines += ["Commands:", ""]
        command = program.split(" ", 1)[1] + " " if " " in program else ""
        lines += [f"- :ref:`{program} {a.dest} <{_label(command + a.dest)}>`: {a.help or ''}" for a in commands]
        lines.append("")
    lines += [f".. program:: {program}", ""]
    positionals = [a for a in parser._actions if not a.option_strings]
    optionals = [a for a in parser._actions if a.option_strings]
    for action in positionals + optionals:
        if isinstance(action, argparse._SubParsersAction):
            continue
        if isinstance(action, argparse._HelpAction) and not top:
            continue
        lines.append(f".. option:: {_option_signature(action, formatter)}")
        lines.append("")
        text = formatter._expand_help(action) if action.help else ""
        if action.nargs in ("*", "+") and not action.option_strings:
            text += " (any number)"
        lines += ["   " + _inline(text.strip() or "(no description)"), ""]
    return lines


def cli_reference(parser: argparse.ArgumentParser | None = None) -> str:
    """Every ``mtt`` command with its arguments, from ``build_parser()``."""
    if parser is None:
        from mtt.__main__ import build_parser

        parser = build_parser()
    previous = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = "90"  # argparse wraps the usage lines to the terminal's width
    try:
        lines = _describe_parser(parser, parser.prog, "-", top=True)
        for name, subparser in _subcommands(parser).items():
            lines += [f".. _{_label(name)}:", ""]
            lines += _describe_parser(subparser, f"{parser.prog} {name}", "-")
    finally:
        if previous is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = previous
    return "\n".join(lines) + "\n"


def _subcommand_helps(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return list(action._choices_actions)
    return []


# -- running mtt for the troubleshooting page ---------------------------------------------
LAUNCHER_VARIABLES = {"RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"}


class _ReachedTraining(BaseException):
    """Raised instead of creating a run folder: the failure example did not fail early."""


def run_failure(command: str, files: dict[str, str]) -> tuple[int, str]:
    """Run ``command`` (``mtt ...``) in a fresh folder holding ``files``; returns its exit
    status and what it printed, with the folder shown as ``/home/user/run``.

    ``structures.xyz`` in that folder is a copy of the shipped EMT dataset. Creating the
    run folder raises instead, so a command that would start training fails the build.
    """
    from mtt import __main__ as cli
    from mtt.commands import train as train_command

    argv = shlex.split(command)
    if argv[:1] != ["mtt"]:
        raise ValueError(f"mtt-failure commands start with 'mtt', got {command!r}")

    def refuse(*args, **kwargs):
        raise _ReachedTraining()

    previous = os.getcwd()
    # a docs build started by srun or torchrun must not make these runs distributed
    launcher = {k: os.environ.pop(k) for k in list(os.environ) if k.startswith("SLURM_") or k in LAUNCHER_VARIABLES}
    with tempfile.TemporaryDirectory(prefix="mtt-docs-") as folder:
        shutil.copyfile(ROOT / "examples" / "data" / "emt_metals.xyz", Path(folder) / "structures.xyz")
        for name, text in files.items():
            (Path(folder) / name).write_text(text)
        out, err = io.StringIO(), io.StringIO()
        original = train_command.new_run_folder
        train_command.new_run_folder = refuse
        try:
            os.chdir(folder)
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                status = cli.main(argv[1:])
        except _ReachedTraining:
            raise RuntimeError(f"`{command}` did not fail before training started") from None
        finally:
            train_command.new_run_folder = original
            os.chdir(previous)
            os.environ.update(launcher)
    printed = out.getvalue() + err.getvalue()
    for name in {folder, os.path.realpath(folder)}:
        printed = printed.replace(name, "/home/user/run")
    return status, printed


# -- the order of the examples -----------------------------------------------------------
class ExampleOrder:
    """Sort key of the gallery: the introductory example first, then the others by name."""

    FIRST = ["plot_train_emt.py", "plot_md_metals.py"]

    def __init__(self, src_dir: str):
        self.src_dir = src_dir

    def __call__(self, filename: str) -> tuple[int, str]:
        rank = self.FIRST.index(filename) if filename in self.FIRST else len(self.FIRST)
        return rank, filename

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


# -- Sphinx glue --------------------------------------------------------------------------
def setup(app):
    from docutils import nodes
    from docutils.parsers.rst import Directive, directives
    from docutils.statemachine import StringList
    from sphinx.util.nodes import nested_parse_with_titles

    class _Generated(Directive):
        def render(self, text: str, source: str) -> list:
            node = nodes.section()
            node.document = self.state.document
            nested_parse_with_titles(self.state, StringList(text.splitlines(), source), node)
            return node.children

    class OptionsReference(_Generated):
        def run(self):
            return self.render(options_reference(), "<mtt options reference>")

    class ArchitectureHypers(_Generated):
        required_arguments = 1

        def run(self):
            return self.render(architecture_hypers(self.arguments[0]), f"<{self.arguments[0]} hypers>")

    class CommandLine(_Generated):
        def run(self):
            return self.render(cli_reference(), "<mtt command line>")

    class Failure(_Generated):
        """``.. mtt-failure:: mtt train options.yaml`` with files as a YAML mapping in its body."""

        required_arguments = 1
        final_argument_whitespace = True
        has_content = True
        option_spec = {"status": directives.nonnegative_int}

        def run(self):
            command = self.arguments[0]
            files = yaml.safe_load("\n".join(self.content)) or {}
            status, printed = run_failure(command, files)
            expected = self.options.get("status", 2)
            if status != expected:
                raise self.error(f"`{command}` exited with {status}, not {expected}:\n{printed}")
            lines: list[str] = []
            for name, text in files.items():
                language = "yaml" if name.endswith((".yaml", ".yml")) else "text"
                lines += [f".. code-block:: {language}", f"   :caption: {name}", ""]
                lines += ["   " + line for line in text.rstrip("\n").splitlines()] + [""]
            lines += [".. code-block:: console", ""]
            lines += ["   $ " + command]
            lines += ["   " + line for line in printed.rstrip("\n").splitlines()] + [""]
            return self.render("\n".join(lines), f"<mtt-failure {command}>")

    app.add_directive("mtt-options-reference", OptionsReference)
    app.add_directive("mtt-architecture-hypers", ArchitectureHypers)
    app.add_directive("mtt-cli", CommandLine)
    app.add_directive("mtt-failure", Failure)
    return {"version": "1", "parallel_read_safe": False, "parallel_write_safe": True}
