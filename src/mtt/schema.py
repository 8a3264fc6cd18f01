"""Typed options: dataclasses with a docstring per field, and a strict parser.

Every option mtt accepts is a field of one of these dataclasses, so the same definition
gives the defaults fed to Hydra, the validation of the user's file (unknown keys, wrong
types, missing values, all reported at once) and the options reference in the docs.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from typing import Any, Iterator, Literal, Union

import yaml

from .errors import OptionsProblems, did_you_mean

#: marks an option the user must give
REQUIRED: Any = dataclasses.MISSING


def option(default: Any = REQUIRED, doc: str = "") -> Any:
    """A dataclass field carrying its documentation; mutable defaults are copied."""
    if isinstance(default, (dict, list)):
        value = default
        return dataclasses.field(
            default_factory=lambda: typing.cast(Any, type(value))(value),
            metadata={"doc": doc},
        )
    if dataclasses.is_dataclass(default):
        value = default
        return dataclasses.field(default_factory=lambda: dataclasses.replace(value), metadata={"doc": doc})
    return dataclasses.field(default=default, metadata={"doc": doc})


def defaults_of(cls: type) -> dict:
    """The defaults of a dataclass as plain data; required fields are left out."""
    result = {}
    for field in dataclasses.fields(cls):
        if field.default is not dataclasses.MISSING:
            result[field.name] = field.default
        elif field.default_factory is not dataclasses.MISSING:
            value = field.default_factory()
            result[field.name] = dataclasses.asdict(value) if dataclasses.is_dataclass(value) else value
    return result


def to_plain(value: Any) -> Any:
    """Dataclass instances back to plain dictionaries (for YAML and checkpoints)."""
    if dataclasses.is_dataclass(value):
        return {f.name: to_plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, dict):
        return {k: to_plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [to_plain(v) for v in value]
    return value


@dataclasses.dataclass
class OptionEntry:
    """One option of a walk over the option dataclasses (:func:`walk_options`): what the
    options reference of the docs and `mtt options` show."""

    key: str  # dotted, as users write it: architecture.training.batch_size
    type: str  # in words: int, 'mse' | 'mae', mapping of str to float, ...
    default: Any  # the default value, REQUIRED when the option has none
    doc: str
    depth: int  # 0 for the fields of the class walked, 1 for those of a nested one, ...
    nested: bool  # its keys are listed after it (a group of options)

    @property
    def required(self) -> bool:
        return self.default is REQUIRED

    def default_yaml(self) -> str:
        """The default as it is written in YAML."""
        return flow_yaml(to_plain(self.default))


def flow_yaml(value: Any) -> str:
    """A value as an options file writes it, on one line: false, not False; {a: 1}."""
    return yaml.safe_dump(value, default_flow_style=True, allow_unicode=True).strip().removesuffix("\n...")


def _nested_dataclass(annotation: Any) -> tuple[type | None, str]:
    """The dataclass whose keys go below an option, and the key segment before them: a
    dataclass field nests its keys directly, a union with one (``loss: mse`` or ``loss:
    {type: mse}``) too, and ``dict[str, Dataclass]`` nests them under ``<name>``."""
    if isinstance(annotation, type) and dataclasses.is_dataclass(annotation):
        return annotation, ""
    origin = typing.get_origin(annotation)
    if origin in (Union, types.UnionType):
        for choice in typing.get_args(annotation):
            if isinstance(choice, type) and dataclasses.is_dataclass(choice):
                return choice, ""
    if origin is dict:
        _, value = typing.get_args(annotation)
        if isinstance(value, type) and dataclasses.is_dataclass(value):
            return value, "<name>"
    return None, ""


def walk_options(
    cls: type, prefix: str = "", type_names: dict[str, str] | None = None, depth: int = 0
) -> Iterator[OptionEntry]:
    """Every option of ``cls``, in the order of the code, nested dataclasses expanded;
    ``type_names`` names the type of options declared as ``Any`` (parsed elsewhere)."""
    names = type_names or {}
    hints = typing.get_type_hints(cls)
    for field in dataclasses.fields(cls):
        key = f"{prefix}.{field.name}" if prefix else field.name
        annotation = hints[field.name]
        if field.default is not dataclasses.MISSING:
            default = field.default
        elif field.default_factory is not dataclasses.MISSING:
            default = field.default_factory()
        else:
            default = REQUIRED
        nested, segment = _nested_dataclass(annotation)
        has_keys = nested is not None and bool(dataclasses.fields(nested))
        kind = names.get(key) or ("any" if annotation is Any else describe_type(annotation))
        yield OptionEntry(key, kind, default, field.metadata.get("doc", ""), depth, has_keys)
        if has_keys:
            yield from walk_options(nested, f"{key}.{segment}" if segment else key, names, depth + 1)


def parse_options(cls: type, data: Any, path: str) -> Any:
    """Build ``cls`` from ``data``; raise one :class:`OptionsError` listing every problem."""
    problems: list[str] = []
    result = _parse(cls, data, path, problems)
    if problems:
        raise OptionsProblems(problems)
    return result


def describe_type(annotation: Any) -> str:
    """A short human name for a type annotation (used in messages and docs)."""
    origin = typing.get_origin(annotation)
    if annotation is type(None):
        return "null"
    if origin is Literal:
        return " | ".join(repr(a) for a in typing.get_args(annotation))
    if origin in (Union, types.UnionType):
        return " | ".join(describe_type(a) for a in typing.get_args(annotation))
    if origin is list:
        return f"list of {describe_type(typing.get_args(annotation)[0])}"
    if origin is dict:
        key, value = typing.get_args(annotation)
        return f"mapping of {describe_type(key)} to {describe_type(value)}"
    if dataclasses.is_dataclass(annotation):
        return "mapping"
    return getattr(annotation, "__name__", str(annotation))


def _parse(annotation: Any, value: Any, path: str, problems: list[str]) -> Any:
    origin = typing.get_origin(annotation)
    if dataclasses.is_dataclass(annotation):
        return _parse_dataclass(annotation, value, path, problems)
    if annotation is Any:
        return value
    if origin in (Union, types.UnionType):
        if value is None and type(None) in typing.get_args(annotation):
            return None  # null chooses None, not a dataclass of defaults
        for choice in typing.get_args(annotation):
            attempt: list[str] = []
            parsed = _parse(choice, value, path, attempt)
            if not attempt:
                return parsed
        # report the problems of the most specific choice: a mapping for a dataclass
        for choice in typing.get_args(annotation):
            if dataclasses.is_dataclass(choice) and isinstance(value, dict):
                return _parse(choice, value, path, problems)
        problems.append(f"'{path}' must be {describe_type(annotation)}, got {value!r}")
        return None
    if origin is Literal:
        allowed = typing.get_args(annotation)
        if value in allowed and type(value) in {type(a) for a in allowed}:
            return value
        hint = did_you_mean(str(value), [str(a) for a in allowed])
        problems.append(f"'{path}' must be one of {', '.join(repr(a) for a in allowed)}, got {value!r}.{hint}")
        return None
    if origin is list:
        if not isinstance(value, (list, tuple)):
            problems.append(f"'{path}' must be a list, got {value!r}")
            return None
        (item,) = typing.get_args(annotation)
        return [_parse(item, v, f"{path}[{i}]", problems) for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            problems.append(f"'{path}' must be a mapping, got {value!r}")
            return None
        key_type, item = typing.get_args(annotation)
        return {
            _parse(key_type, k, f"{path}.{k}", problems): _parse(item, v, f"{path}.{k}", problems)
            for k, v in value.items()
        }
    return _parse_scalar(annotation, value, path, problems)


def _parse_scalar(annotation: Any, value: Any, path: str, problems: list[str]) -> Any:
    if annotation is type(None):
        if value is None:
            return None
    elif annotation is bool:
        if isinstance(value, bool):
            return value
    elif annotation is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif annotation is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
    elif annotation is str:
        if isinstance(value, str):
            return value
    else:
        raise TypeError(f"unsupported option type {annotation!r} at {path}")
    problems.append(f"'{path}' must be {describe_type(annotation)}, got {value!r}")
    return None


def _parse_dataclass(cls: type, value: Any, path: str, problems: list[str]) -> Any:
    if value is None:
        value = {}
    if not isinstance(value, dict):
        problems.append(f"'{path}' must be a mapping of options, got {value!r}")
        return None
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    known_problems = len(problems)
    prefix = f"{path}." if path else ""
    for key in value:
        if key not in fields:
            problems.append(f"unknown option '{prefix}{key}'.{did_you_mean(str(key), fields, prefix)}")
    kwargs = {}
    for name, field in fields.items():
        if name in value:
            kwargs[name] = _parse(hints[name], value[name], f"{prefix}{name}", problems)
        elif field.default is dataclasses.MISSING and field.default_factory is dataclasses.MISSING:
            problems.append(f"missing required option '{prefix}{name}'")
    if len(problems) > known_problems:
        return None
    try:
        return cls(**kwargs)
    except (TypeError, ValueError) as error:
        # a check of __post_init__: a line that starts with an option's name is tied to its key
        for line in str(error).splitlines():
            name, _, rest = line.partition(" ")
            problems.append(f"'{prefix}{name}' {rest}" if name in fields and rest else f"'{path}': {line}")
        return None
