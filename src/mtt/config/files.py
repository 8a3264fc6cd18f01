"""Reading YAML files: the user's options file and the dataset files of `mtt eval`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from ..errors import OptionsError


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
