"""Compose the options of a run: packaged defaults < options.yaml < command line."""

from __future__ import annotations

import dataclasses
import difflib
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Literal

import yaml
from hydra import compose, initialize_config_module
from hydra.core.config_store import ConfigStore
from hydra.core.global_hydra import GlobalHydra
from hydra.errors import HydraException
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from .. import architectures
from ..data.options import expand_short_forms, parse_dataset_list, unit_problems
from ..errors import OptionsError, OptionsProblems, did_you_mean
from ..schema import defaults_of, parse_options, walk_options
from ..training.hypers import TrainerHypers
from .dataset_paths import resolve_datasets
from .files import read_options_file
from .metatrain import translate_metatrain
from .options import DistributedOptions, RunOptions
from .overrides import BOOLEAN_WORDS, GROUPS, split_overrides

DATASETS = ("training_set", "validation_set", "test_set")


@dataclass
class ComposedOptions:
    """The composed options as plain data, and their parsed, typed parts."""

    raw: dict
    run: RunOptions
    model_hypers: Any
    trainer_hypers: TrainerHypers
    #: the seed was drawn at random (none given): a restart takes its checkpoint's
    chosen_seed: bool = False
    #: where base_precision comes from: "given" (file or command line), "default" (the
    #: architecture's, none given: a restart takes its checkpoint's) or "checkpoint" (taken)
    precision_origin: Literal["given", "default", "checkpoint"] = "given"
    #: what was read in mtt's terms or ignored (metatrain's options), to tell the user
    notes: list[str] = field(default_factory=list)
    #: the keys under ``architecture.model`` that the file or the command line set
    #: (dotted): fine-tuning takes the others from its checkpoint
    given_model_keys: list[str] = field(default_factory=list)

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.raw, sort_keys=False)


def _store_configs(user: dict, chosen: architectures.Architecture) -> None:
    """Register the defaults that come from code, and the user's file, with Hydra."""
    store = ConfigStore.instance()
    base = defaults_of(RunOptions)
    for group in GROUPS:
        base.pop(group)
    store.store(name="base", node=base)
    trainer = defaults_of(TrainerHypers)
    for name in architectures.available():
        # only the chosen architecture is imported: its model defaults come from its
        # hypers, its training defaults from the Trainer's and its own
        model, training = {}, trainer
        if name == chosen.name:
            model, training = defaults_of(chosen.hypers_class), training_defaults(chosen)
        store.store(group="architecture", name=name, node={"name": name, "model": model, "training": training})
    store.store(name="user_options", node=user)


def training_defaults(architecture: architectures.Architecture) -> dict:
    """``architecture.training`` before the user's options: the Trainer's defaults with
    those the architecture sets (``__training_defaults__``)."""
    return _merged(defaults_of(TrainerHypers), architecture.training_defaults)


def _merged(defaults: dict, changes: dict) -> dict:
    """``defaults`` with ``changes`` applied, mappings merged key by key."""
    result = dict(defaults)
    for key, value in changes.items():
        if isinstance(value, dict) and isinstance(result.get(key), dict):
            result[key] = _merged(result[key], value)
        else:
            result[key] = value
    return result


def load_options(path: str | Path, overrides: list[str] | None = None) -> ComposedOptions:
    """Compose, validate and type the options of a run."""
    path = Path(path)
    user = read_options_file(path)
    groups, values = split_overrides(list(overrides or []))

    # short forms expanded first, so that overrides of their keys apply; an interpolation
    # (`test_set: ${validation_set}`) is expanded once resolved
    for key in DATASETS:
        if key in user and not (isinstance(user[key], str) and "${" in user[key]):
            user[key] = expand_short_forms(user[key])
    # choices of config groups made inside the file
    if isinstance(user.get("architecture"), str):  # `architecture: composition`
        user["architecture"] = {"name": user["architecture"]}
    if user.get("architecture") is not None and not isinstance(user["architecture"], dict):
        raise OptionsError(f"'architecture' must be a mapping of options, got {user['architecture']!r}.")
    distributed = user.get("distributed")
    if isinstance(distributed, str) and distributed.strip().lower() in BOOLEAN_WORDS:
        distributed = BOOLEAN_WORDS[distributed.strip().lower()] == "true"  # `distributed: "true"`
    if isinstance(distributed, bool):
        user.pop("distributed")
        groups.setdefault("distributed", "true" if distributed else "false")
    elif isinstance(distributed, str):
        raise OptionsError(f"distributed: {distributed} is not valid.", hint="Use distributed: true or false.")
    if "architecture" in groups:
        name = groups["architecture"]
    else:
        name = (user.get("architecture") or {}).get("name", "soap_bpnn")
    if not isinstance(name, str):
        raise OptionsError(f"'architecture.name' must be a string, got {name!r}.")
    architectures.check_name(name)
    groups["architecture"] = name
    if isinstance(user.get("architecture"), dict):
        user["architecture"] = {**user["architecture"], "name": name}
    for group, choice in groups.items():
        if group == "distributed" and choice not in ("true", "false"):
            raise OptionsError(f"distributed={choice} is not valid.", hint="Use distributed=true or distributed=false.")
        if group == "dataset" and choice != "ase":
            raise OptionsError(f"dataset={choice} is not valid.", hint="The only dataset reader is 'ase'.")
    if "distributed" in groups:  # the choice wins over an `enabled` in the file's mapping
        values.insert(0, f"++distributed.enabled={groups['distributed']}")

    architecture = architectures.load(name)
    given = _given_model_keys(user, values)
    _store_configs(user, architecture)
    GlobalHydra.instance().clear()
    try:
        with initialize_config_module(config_module="mtt.config.conf", version_base=None):
            cfg = compose(
                config_name="mtt",
                overrides=[f"{g}='{c}'" for g, c in groups.items()] + values,
            )
    except (HydraException, OmegaConfBaseException) as error:
        raise OptionsError(
            f"could not apply the command-line overrides: {error}",
            hint="Overrides use Hydra's syntax: key=value, quoted values for text with "
            "special characters (key='a=b'), +key=value to add a key.",
        ) from error
    finally:
        GlobalHydra.instance().clear()
    try:
        raw = OmegaConf.to_container(cfg, resolve=True)
    except OmegaConfBaseException as error:  # e.g. ${name} naming no option
        raise OptionsError(
            f"could not resolve an interpolation in the options: {str(error).splitlines()[0]}",
            hint="Write a literal '$' as \\$, or refer to environment variables as ${oc.env:NAME}.",
        ) from error
    for key in DATASETS:
        if key in raw:
            raw[key] = resolve_datasets(raw[key], path.parent.resolve(), raw["dataset"])
    _resolve_finetune(raw, path.parent.resolve())
    options = _validate(raw, architecture)
    options.given_model_keys = given
    return options


def _given_model_keys(user: dict, overrides: list[str]) -> list[str]:
    """The dotted keys under ``architecture.model`` of the file and of the overrides."""

    def flatten(node: Any, prefix: str) -> list[str]:
        if isinstance(node, dict) and node:
            return [key for name, value in node.items() for key in flatten(value, f"{prefix}.{name}")]
        return [prefix]

    model = (user.get("architecture") or {}).get("model") if isinstance(user.get("architecture"), dict) else None
    keys = [key.removeprefix(".") for key in flatten(model, "")] if isinstance(model, dict) and model else []
    for override in overrides:
        key = override.split("=", 1)[0].lstrip("+~")
        if key.startswith("architecture.model."):
            keys.append(key.removeprefix("architecture.model."))
    return keys


def _resolve_finetune(raw: dict, base_dir: Path) -> None:
    """``finetune: model.ckpt`` is short for ``{read_from: model.ckpt}``; its path is made
    absolute, as the datasets', so that the run folder's options.yaml runs from anywhere."""
    training = (raw.get("architecture") or {}).get("training")
    if not isinstance(training, dict):
        return
    finetune = training.get("finetune")
    if isinstance(finetune, str):
        finetune = training["finetune"] = {"read_from": finetune}
    if isinstance(finetune, dict) and isinstance(finetune.get("read_from"), str):
        checkpoint = Path(finetune["read_from"]).expanduser()
        finetune["read_from"] = str(checkpoint if checkpoint.is_absolute() else (base_dir / checkpoint).resolve())


def _misplaced(raw: dict, architecture: architectures.Architecture) -> list[str]:
    """Top-level keys that are options of a section (``num_epochs=5`` for
    ``architecture.training.num_epochs=5``): each is reported with its full key, and
    dropped so that the strict parser does not report it a second time."""
    top = {f.name for f in dataclasses.fields(RunOptions)}
    nested = [
        entry.key
        for cls, prefix in (
            (TrainerHypers, "architecture.training"),
            (architecture.hypers_class, "architecture.model"),
            (DistributedOptions, "distributed"),
        )
        for entry in walk_options(cls, prefix)
    ]
    by_name: dict[str, list[str]] = {}
    for key in nested:
        by_name.setdefault(key.rsplit(".", 1)[-1], []).append(key)
    problems = []
    for key in [k for k in raw if k not in top and isinstance(k, str)]:
        if did_you_mean(key, top):
            continue  # a typo of a top-level key: the parser's message says which
        close = difflib.get_close_matches(key, by_name, 1, 0.8)
        found = by_name.get(key) or [k for name in close for k in by_name[name]]
        if found:
            raw.pop(key)
            problems.append(f"unknown option '{key}'. Did you mean '{found[0]}'?")
    return problems


def _validate(raw: dict, architecture: architectures.Architecture) -> ComposedOptions:
    translation = translate_metatrain(raw)
    problems: list[str] = list(translation.problems) + _misplaced(raw, architecture)

    def attempt(parse: Callable[[Any, str], Any], data: Any, where: str) -> Any:
        try:
            return parse(data, where)
        except OptionsProblems as error:
            problems.extend(error.problems)
            return None

    run = attempt(lambda d, w: parse_options(RunOptions, d, w), raw, "")
    arch = raw.get("architecture") or {}
    model = attempt(
        lambda d, w: parse_options(architecture.hypers_class, d, w), arch.get("model"), "architecture.model"
    )
    trainer = attempt(lambda d, w: parse_options(TrainerHypers, d, w), arch.get("training"), "architecture.training")
    # dataset blocks too, so that their typos come in the same message as the others
    for key in DATASETS:
        value = raw.get(key)
        if value is not None and not (isinstance(value, (int, float)) and not isinstance(value, bool)):
            blocks = attempt(parse_dataset_list, value, key) or []
            for number, block in enumerate(blocks):
                problems.extend(unit_problems(block, key if not isinstance(value, list) else f"{key}[{number}]"))
    if problems:
        raise OptionsProblems(problems)
    chosen = run.seed is None
    if chosen:
        run.seed = random.SystemRandom().randrange(2**31)
        raw["seed"] = run.seed
    default_precision = run.base_precision is None
    if default_precision:  # written out, so that the run folder's options say which ran
        run.base_precision = raw["base_precision"] = architecture.default_precision
    return ComposedOptions(
        raw=raw,
        run=run,
        model_hypers=model,
        trainer_hypers=trainer,
        chosen_seed=chosen,
        precision_origin="default" if default_precision else "given",
        notes=translation.notes,
    )
