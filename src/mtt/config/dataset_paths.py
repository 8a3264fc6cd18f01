"""Dataset paths of the composed options: absolute, so the run folder's options.yaml runs
from anywhere, with the ``dataset`` group's defaults filled into every block."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..data.options import expand_short_forms


def resolve_datasets(value: Any, base_dir: Path, defaults: dict) -> Any:
    """A dataset entry with absolute paths (relative ones are taken from ``base_dir``) and
    the default reader and length unit in each block."""
    return _apply_dataset_defaults(_absolute_paths(value, base_dir), defaults)


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


def _apply_dataset_defaults(value: Any, defaults: dict) -> Any:
    if isinstance(value, list):
        return [_apply_dataset_defaults(v, defaults) for v in value]
    value = expand_short_forms(value)
    if isinstance(value, dict) and isinstance(value.get("systems"), dict):
        value = {**value, "systems": {**defaults, **value["systems"]}}
    return value
