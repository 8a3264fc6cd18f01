"""Command-line overrides in Hydra's grammar, repaired where users trip on it.

A bare ``distributed=true`` is a config-group choice, not a boolean; a value with ``=``,
``,`` or quotes in it (a checkpoint path) needs quoting; a YAML path where an override is
expected gets a message instead of Hydra's "missing EQUAL".
"""

from __future__ import annotations

import re

from ..errors import OptionsError

#: the packaged config groups: a value chooses one of their files
GROUPS = ("architecture", "distributed", "dataset")
#: what Hydra's override grammar reads as a plain, unquoted value
_PLAIN_VALUE = re.compile(r"[\w\-+./:*?@|% ]*", re.ASCII)
BOOLEAN_WORDS = {"true": "true", "on": "true", "yes": "true", "false": "false", "off": "false", "no": "false"}


def split_overrides(overrides: list[str]) -> tuple[dict[str, str], list[str]]:
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
            groups[bare] = BOOLEAN_WORDS.get(value.strip().strip("'\"").lower(), value.strip("'\""))
        elif key.startswith(("+", "~")):
            values.append(override)
        else:
            # add-or-override: unknown keys are then reported by our validation with a
            # "did you mean", rather than by Hydra's struct check
            values.append(f"++{key}={quote_if_needed(value)}")
    return groups, values


def quote_if_needed(value: str) -> str:
    """Quote values Hydra's grammar would reject or misread, such as paths containing '=',
    ',' (a sweep to Hydra), '~', quotes or brackets; lists, mappings, interpolations and
    values the user quoted are left to Hydra."""
    quoted = len(value) > 1 and value[:1] in "'\"" and value[-1:] == value[:1]
    if quoted or value[:1] in "[{" or "${" in value or _PLAIN_VALUE.fullmatch(value):
        return value
    # in quotes, Hydra reads backslashes as escapes only before a quote or the closing one
    escaped = re.sub(r"(\\+)(?='|$)", lambda m: m.group(1) * 2, value).replace("'", "\\'")
    return f"'{escaped}'"
