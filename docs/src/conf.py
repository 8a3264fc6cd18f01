"""Sphinx configuration of mtt's documentation.

Build it with ``tox -e docs``, or from the repository root with::

    pip install -e ".[docs]"
    sphinx-build -W --keep-going -b html docs/src docs/_build/html

The examples of ``examples/`` are run while the docs build (sphinx-gallery).
"""

import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE / "_ext"))

import mtt  # noqa: E402

project = "mtt"
author = "The mtt developers"
copyright = "the mtt developers"
release = mtt.__version__
version = mtt.__version__

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "sphinx.ext.viewcode",
    "sphinx_gallery.gen_gallery",
    "mtt_docs",
]

exclude_patterns = ["_build", "_ext"]
templates_path = []

# -- HTML ---------------------------------------------------------------------------------
html_theme = "furo"
html_title = f"mtt {release}"
html_static_path = ["_static"]
html_css_files = ["mtt.css"]
pygments_style = "friendly"
pygments_dark_style = "monokai"


# -- autodoc ------------------------------------------------------------------------------
def _name_torchscript_classes():
    """Show metatensor's and metatomic's TorchScript classes by name in signatures.

    Their Python objects (System, Labels, TensorMap, ...) are ``torch.ScriptClass``
    instances, whose repr is an address: without this, type hints read
    ``List[<torch.ScriptClass object at 0x...>]``.
    """
    import metatensor.torch
    import metatomic.torch
    import torch

    names = {}
    for module in (metatensor.torch, metatomic.torch):
        for name, value in vars(module).items():
            if isinstance(value, torch.ScriptClass):
                names[id(value)] = name
    torch.ScriptClass.__repr__ = lambda self: names.get(id(self), "ScriptClass")


_name_torchscript_classes()
autodoc_inherit_docstrings = False  # not torch.nn.Module's generic text on forward()
autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_default_options = {"members": True}
autoclass_content = "both"

# -- examples (sphinx-gallery) ------------------------------------------------------------
# Every examples/plot_*.py runs while the docs build, on the data the repository ships
# (examples/data) or that the example makes, so a fresh clone builds them all; an example
# that fails stops the build instead of being left out.
# run the examples with the machine's cores, as a user would; 2 is what CI has
os.environ.setdefault("OMP_NUM_THREADS", "2")

sphinx_gallery_conf = {
    "examples_dirs": [str(ROOT / "examples")],
    "gallery_dirs": ["examples"],
    "filename_pattern": r"/plot_",
    "ignore_pattern": r"(__init__\.py|generate_emt_dataset\.py|ensemble_calculator\.py)",
    "within_subsection_order": "mtt_docs.ExampleOrder",
    "download_all_examples": False,
    "remove_config_comments": True,
    "min_reported_time": 1,
    "abort_on_example_error": True,
    "only_warn_on_example_error": False,
    "matplotlib_animations": False,
    "show_memory": False,
    "show_signature": False,
    "capture_repr": (),
    "write_computation_times": False,  # no sg_execution_times.rst in the sources
}
