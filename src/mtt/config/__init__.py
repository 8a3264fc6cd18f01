"""Options of a run: the user's YAML file composed with packaged defaults by Hydra.

This package is the only place that imports Hydra. It uses the Compose API inside mtt's
own command line, so `mtt train options.yaml key=value` takes overrides in Hydra's grammar.
"""

__all__ = ["ComposedOptions", "load_options"]


def __getattr__(name: str):
    # imported on first use: the option dataclasses (config.schema) are needed by modules
    # that the loader itself imports, and Hydra is slow to import
    if name in __all__:
        from . import loader

        return getattr(loader, name)
    raise AttributeError(name)
