"""The documentation covers what the code accepts, and the examples' options files load.

The options reference and the architecture pages are generated from the option
dataclasses by docs/src/_ext/mtt_docs.py; these tests walk the same dataclasses on their
own, so an option without documentation, or one the generator skips, fails here rather
than going unnoticed in the rendered pages.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import typing
from pathlib import Path

import pytest

from mtt import architectures
from mtt.config import load_options
from mtt.config.options import RunOptions
from mtt.errors import MttError
from mtt.training.hypers import TrainerHypers

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs" / "src"
sys.path.insert(0, str(DOCS / "_ext"))

import mtt_docs  # noqa: E402


def option_keys(cls: type, prefix: str = "") -> list[tuple[str, str]]:
    """(dotted key, doc) of every field of ``cls``, through nested dataclasses."""
    keys = []
    hints = typing.get_type_hints(cls)
    for field in dataclasses.fields(cls):
        key = f"{prefix}.{field.name}" if prefix else field.name
        keys.append((key, field.metadata.get("doc", "")))
        annotation = hints[field.name]
        candidates = [annotation, *typing.get_args(annotation)]
        if typing.get_origin(annotation) is dict:
            candidates = [typing.get_args(annotation)[1]]
            key = f"{key}.<name>"
        for candidate in candidates:
            if isinstance(candidate, type) and dataclasses.is_dataclass(candidate):
                keys += option_keys(candidate, key)
    return keys


def documented(rst: str) -> set[str]:
    return {line.split("::", 1)[1].strip() for line in rst.splitlines() if line.startswith(".. confval::")}


@pytest.fixture(scope="module")
def reference() -> str:
    return mtt_docs.options_reference()


def test_every_run_option_is_documented(reference):
    from mtt.data.options import DatasetOptions

    keys = option_keys(RunOptions) + option_keys(DatasetOptions, "training_set")
    missing = [key for key, _ in keys if key not in documented(reference)]
    assert not missing, f"options missing from the options reference: {missing}"
    undocumented = [key for key, doc in keys if not doc.strip()]
    assert not undocumented, f"options without a doc string (option(default, doc)): {undocumented}"


def test_every_training_hyperparameter_is_documented(reference):
    keys = option_keys(TrainerHypers, "architecture.training")
    missing = [key for key, _ in keys if key not in documented(reference)]
    assert not missing, f"training hyperparameters missing from the options reference: {missing}"
    undocumented = [key for key, doc in keys if not doc.strip()]
    assert not undocumented, f"training hyperparameters without a doc string: {undocumented}"


@pytest.mark.parametrize("name", sorted(architectures.BUILTIN))
def test_every_architecture_hyperparameter_is_documented(name):
    hypers = architectures.load(name).hypers_class
    keys = option_keys(hypers, "architecture.model")
    rst = mtt_docs.architecture_hypers(name)
    missing = [key for key, _ in keys if key not in documented(rst)]
    assert not missing, f"{name} hyperparameters missing from its page: {missing}"
    undocumented = [key for key, doc in keys if not doc.strip()]
    assert not undocumented, f"{name} hyperparameters without a doc string: {undocumented}"


@pytest.mark.parametrize("name", sorted(architectures.BUILTIN))
def test_every_architecture_has_a_page(name):
    page = DOCS / "architectures" / f"{name}.rst"
    assert page.is_file(), f"add {page.relative_to(ROOT)} (see docs/src/adding-an-architecture.rst)"
    assert f".. mtt-architecture-hypers:: {name}" in page.read_text()
    assert f"   {name}\n" in (DOCS / "architectures" / "index.rst").read_text(), "list it in the toctree"


def test_every_command_is_in_the_cli_reference():
    from mtt.__main__ import build_parser

    parser = build_parser()
    rst = mtt_docs.cli_reference(parser)
    commands = mtt_docs._subcommands(parser)
    assert commands
    for name, subparser in commands.items():
        assert f".. program:: mtt {name}" in rst
        for action in subparser._actions:
            if action.help == argparse.SUPPRESS or isinstance(action, argparse._HelpAction):
                continue  # --help is documented once, for `mtt`
            if isinstance(action, argparse._SubParsersAction):
                continue  # its commands have their own sections
            flag = action.option_strings[-1] if action.option_strings else action.dest
            assert f".. option:: {flag}" in rst or f", {flag}" in rst, f"mtt {name} {flag} is not documented"


def test_every_error_kind_has_a_troubleshooting_section():
    import importlib
    import pkgutil

    import mtt

    for module in pkgutil.walk_packages(mtt.__path__, "mtt."):  # every MttError subclass
        if module.name != "mtt.__main__":
            importlib.import_module(module.name)
    titles = [line.strip().lower() for line in (DOCS / "troubleshooting.rst").read_text().splitlines()]

    def subclasses(cls):
        for sub in cls.__subclasses__():
            yield sub
            yield from subclasses(sub)

    for error in subclasses(MttError):
        assert any(title.startswith(error.kind) for title in titles), (
            f"troubleshooting.rst has no section for '{error.kind}' errors ({error.__name__})"
        )


@pytest.mark.parametrize("path", sorted(ROOT.glob("examples/*.yaml")), ids=lambda p: p.name)
def test_examples_options_files_are_valid(path):
    options = load_options(path)
    assert options.run.architecture.name in architectures.available()


def test_examples_run_on_the_data_of_the_repository():
    """A fresh clone has no ../shared: the examples (and so the docs build) must not need it."""
    for path in sorted(ROOT.glob("examples/*")):
        if path.is_file() and path.suffix in (".py", ".yaml"):
            assert "shared/" not in path.read_text(), f"{path.name} reads ../shared"
    conf = (DOCS / "conf.py").read_text()
    assert 'abort_on_example_error": True' in conf
    assert "plot_" not in conf.split('"ignore_pattern"')[1].splitlines()[0], "no example is left out of the gallery"


def test_examples_are_gallery_scripts():
    scripts = sorted(ROOT.glob("examples/plot_*.py"))
    assert scripts, "sphinx-gallery runs examples/plot_*.py"
    for script in scripts:
        text = script.read_text()
        assert text.startswith('"""'), f"{script.name} must start with a docstring (its title)"
        assert "tempfile" in text and "rmtree" in text, f"{script.name} must run in a temporary folder"


def test_mtt_options_prints_every_option_with_its_default_and_doc(tmp_path):
    from conftest import run_mtt

    from mtt.data.options import DatasetOptions
    from mtt.schema import walk_options

    result = run_mtt("options", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    printed = " ".join(result.stdout.split())  # the docs are wrapped to the terminal
    hypers = architectures.load("soap_bpnn").hypers_class
    for cls, prefix in [
        (RunOptions, ""),
        (TrainerHypers, "architecture.training"),
        (hypers, "architecture.model"),
        (DatasetOptions, "training_set"),
    ]:
        for entry in walk_options(cls, prefix):
            if entry.key in ("architecture", "distributed", "dataset"):
                continue  # groups: their keys are listed
            assert f"{entry.key}: " in printed, entry.key
            assert " ".join(entry.doc.split()) in printed, entry.key
    assert "architecture.training.num_epochs: 100 " in printed
    assert "architecture.model.soap.cutoff.radius: 5.0 " in printed
    assert "architecture.training.learning_rate: 0.01 " in printed
    assert "architecture.training.final_stage: null " in printed

    # an architecture's own training defaults are the ones shown
    message_passing = " ".join(run_mtt("options", "equivariant_mp", cwd=tmp_path).stdout.split())
    assert "architecture.training.learning_rate: 0.02 " in message_passing
    assert "architecture.training.ema_decay: 0.99 " in message_passing
    assert "architecture.training.final_stage.learning_rate: 0.001 " in message_passing
    assert "architecture.training.final_stage.start_fraction: 0.875 " in message_passing
    assert all(len(line) <= 80 for line in result.stdout.splitlines())

    composition = run_mtt("options", "composition", cwd=tmp_path)
    assert composition.returncode == 0 and "composition has none." in composition.stdout
    wrong = run_mtt("options", "soap_bpn", cwd=tmp_path)
    assert wrong.returncode == 2 and "Did you mean 'soap_bpnn'" in wrong.stderr
