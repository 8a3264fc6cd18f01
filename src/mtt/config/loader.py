"""Compose the options of a run: packaged defaults < options.yaml < command line."""

from __future__ import annotations

import random
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from hydra import compose, initialize_config_module
from hydra.core.config_store import ConfigStore
from hydra.core.global_hydra import GlobalHydra
from hydra.errors import HydraException
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from .. import architectures
from ..errors import OptionsError
from ..data.options import expand_short_forms, parse_dataset_list
from ..training.hypers import TrainerHypers
from .options import RunOptions
from .schema import defaults_of, parse_options

GROUPS = ("architecture", "distributed", "dataset")
DATASETS = ("training_set", "validation_set", "test_set")
#: what Hydra's override grammar reads as a plain, unquoted value
_PLAIN_VALUE = re.compile(r"[\w\-+./:*?@|% ]*", re.ASCII)
_BOOLEAN_WORDS = {"true": "true", "on": "true", "yes": "true", "false": "false", "off": "false", "no": "false"}


@dataclass
class ComposedOptions:
    """The composed options as plain data, and their parsed, typed parts."""

    raw: dict
    run: RunOptions
    model_hypers: Any
    trainer_hypers: TrainerHypers

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.raw, sort_keys=False)


def read_options_file(path: Path) -> dict:
    """The user's YAML file as a dictionary, with clear errors for the usual mistakes."""
    data = read_yaml(path)
    if not isinstance(data, dict):
        raise OptionsError(f"'{path}' must hold a mapping of options (key: value), not {type(data).__name__}.")
    return data


def read_yaml(path: Path) -> Any:
    """Any YAML file (an empty one is an empty mapping), with clear errors."""
    if not path.exists():
        raise OptionsError(
            f"options file '{path}' does not exist.",
            hint="Give the path of your options.yaml: `mtt train options.yaml`.",
        )
    try:
        with path.open() as stream:  # a named stream: YAML errors then name the file
            data = yaml.safe_load(stream)
    except yaml.YAMLError as error:
        raise OptionsError(f"'{path}' is not valid YAML:\n{error}") from error
    return {} if data is None else data


def _split_overrides(overrides: list[str]) -> tuple[dict[str, str], list[str]]:
    """Separate config-group choices from value overrides, and normalise both."""
    groups, values = {}, []
    for override in overrides:
        if "=" not in override:
            if override.endswith((".yaml", ".yml")):
                raise OptionsError(
                    f"'{override}' looks like a second options file; mtt takes one.",
                    hint="Overrides come after the file as key=value, e.g. architecture.training.num_epochs=5.",
                )
            raise OptionsError(
                f"override '{override}' has no '='.",
                hint="Write overrides as key=value, e.g. seed=3 or distributed=true.",
            )
        key, value = override.split("=", 1)
        bare = key.lstrip("+~")
        if not bare:
            raise OptionsError(
                f"override '{override}' has no key before '='.",
                hint="Write overrides as key=value, e.g. seed=3 or distributed=true.",
            )
        if bare == "architecture.name" and not key.startswith("~"):
            # the name picks the architecture's defaults, exactly as architecture=NAME does
            groups["architecture"] = value.strip().strip("'\"")
        elif bare in GROUPS and "." not in bare:
            groups[bare] = _BOOLEAN_WORDS.get(value.strip().strip("'\"").lower(), value.strip("'\""))
        elif key.startswith(("+", "~")):
            values.append(override)
        else:
            # add-or-override: unknown keys are then reported by our validation with a
            # "did you mean", rather than by Hydra's struct check
            values.append(f"++{key}={_quote_if_needed(value)}")
    return groups, values


def _quote_if_needed(value: str) -> str:
    """Quote values Hydra's grammar would reject or misread, such as paths containing '=',
    ',' (a sweep to Hydra), '~', quotes or brackets; lists, mappings, interpolations and
    values the user quoted are left to Hydra."""
    quoted = len(value) > 1 and value[:1] in "'\"" and value[-1:] == value[:1]
    if quoted or value[:1] in "[{" or "${" in value or _PLAIN_VALUE.fullmatch(value):
        return value
    # in quotes, Hydra reads backslashes as escapes only before a quote or the closing one
    escaped = re.sub(r"(\\+)(?='|$)", lambda m: m.group(1) * 2, value).replace("'", "\\'")
    return f"'{escaped}'"


def _absolute_paths(node: Any, base_dir: Path) -> Any:
    """Make every dataset path absolute, so the composed file runs from anywhere."""
    if isinstance(node, str):
        path = Path(node).expanduser()  # ~/data.xyz is in the home folder, as in a shell
        return str(path if path.is_absolute() else (base_dir / path).resolve())
    if isinstance(node, list):
        return [_absolute_paths(n, base_dir) for n in node]
    if isinstance(node, dict):
        node = dict(node)
        if isinstance(node.get("systems"), (str, dict)):
            systems = node["systems"]
            if isinstance(systems, str):
                node["systems"] = _absolute_paths(systems, base_dir)
            elif isinstance(systems.get("read_from"), str):
                node["systems"] = {**systems, "read_from": _absolute_paths(systems["read_from"], base_dir)}
        for target in (node.get("targets") or {}).values():
            if isinstance(target, dict) and isinstance(target.get("read_from"), str):
                target["read_from"] = _absolute_paths(target["read_from"], base_dir)
        return node
    return node


def _store_configs(user: dict, chosen: architectures.Architecture) -> None:
    """Register the defaults that come from code, and the user's file, with Hydra."""
    store = ConfigStore.instance()
    base = defaults_of(RunOptions)
    for group in GROUPS:
        base.pop(group)
    store.store(name="base", node=base)
    trainer = defaults_of(TrainerHypers)
    for name in architectures.available():
        # only the chosen architecture is imported; its model defaults come from its hypers
        model = defaults_of(chosen.hypers_class) if name == chosen.name else {}
        store.store(group="architecture", name=name, node={"name": name, "model": model, "training": trainer})
    store.store(name="user_options", node=user)


def load_options(path: str | Path, overrides: list[str] | None = None) -> ComposedOptions:
    """Compose, validate and type the options of a run."""
    path = Path(path)
    user = read_options_file(path)
    groups, values = _split_overrides(list(overrides or []))

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
    if isinstance(distributed, str) and distributed.strip().lower() in _BOOLEAN_WORDS:
        distributed = _BOOLEAN_WORDS[distributed.strip().lower()] == "true"  # `distributed: "true"`
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
            raw[key] = _apply_dataset_defaults(_absolute_paths(raw[key], path.parent.resolve()), raw["dataset"])
    return _validate(raw, architecture)


def _apply_dataset_defaults(value: Any, defaults: dict) -> Any:
    if isinstance(value, list):
        return [_apply_dataset_defaults(v, defaults) for v in value]
    value = expand_short_forms(value)
    if isinstance(value, dict) and isinstance(value.get("systems"), dict):
        value = {**value, "systems": {**defaults, **value["systems"]}}
    return value


def _validate(raw: dict, architecture) -> ComposedOptions:
    problems: list[str] = []

    def attempt(parse, data, where):
        try:
            return parse(data, where)
        except OptionsError as error:
            problems.extend(line[4:] for line in error.message.splitlines()[1:])
            return None

    run = attempt(lambda d, w: parse_options(RunOptions, d, w), raw, "")
    arch = raw.get("architecture") or {}
    model = attempt(lambda d, w: parse_options(architecture.hypers_class, d, w), arch.get("model"), "architecture.model")
    trainer = attempt(lambda d, w: parse_options(TrainerHypers, d, w), arch.get("training"), "architecture.training")
    # dataset blocks too, so that their typos come in the same message as the others
    for key in DATASETS:
        value = raw.get(key)
        if value is not None and not (isinstance(value, (int, float)) and not isinstance(value, bool)):
            attempt(parse_dataset_list, value, key)
    if problems:
        raise OptionsError(
            f"{len(problems)} problem{'s' if len(problems) > 1 else ''} in the options:\n"
            + "\n".join(f"  - {p}" for p in problems),
            hint="Fix these in the options file or in the command-line overrides.",
        )
    if run.seed is None:
        run.seed = random.SystemRandom().randrange(2**31)
        raw["seed"] = run.seed
    return ComposedOptions(raw=raw, run=run, model_hypers=model, trainer_hypers=trainer)
