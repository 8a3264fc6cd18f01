"""Options of a run: the user's YAML file composed with packaged defaults by Hydra.

This package is the only place that imports Hydra. It uses the Compose API inside mtt's
own command line, so `mtt train options.yaml key=value` takes overrides in Hydra's grammar.
"""

from .loader import ComposedOptions, load_options

__all__ = ["ComposedOptions", "load_options"]
