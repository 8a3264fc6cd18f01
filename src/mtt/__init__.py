"""mtt: train machine-learning models of atoms from a short YAML file."""

__version__ = "0.1.0"

import time as _time

#: when this process started mtt: the train log says how long its first step took to come
STARTED = _time.monotonic()
