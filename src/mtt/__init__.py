"""mtt: train machine-learning models of atoms from a short YAML file."""

__version__ = "0.1.0"
