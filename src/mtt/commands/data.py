"""`mtt data convert` and `mtt data info`: datasets converted once, to be streamed from disk."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from ase.data import chemical_symbols

from ..config.files import read_yaml
from ..data.convert import convert as convert_blocks
from ..data.convert import dataset_digest, folder_size, output_path
from ..data.options import parse_dataset_list, unit_problems
from ..data.store import Store, StoredSet, array_layout
from ..errors import DataError, OptionsProblems
from ..outputs.logs import setup_logging


def _megabytes(size: int) -> str:
    return f"{size / 1e6:,.1f} MB"


def convert(dataset_file: str, output: str, processes: int | None) -> None:
    """Convert the dataset block(s) of ``dataset_file`` and say where it went."""
    setup_logging(None)
    path = Path(dataset_file)
    content = read_yaml(path)
    if isinstance(content, dict) and "training_set" in content:
        raise DataError(
            f"'{path}' is a training options file; `mtt data convert` takes a dataset file: one dataset block "
            "(systems and targets) or a list of them.",
            hint="Write the training_set block in its own file, e.g. {systems: train.xyz, targets: {energy: ...}}.",
        )
    blocks = parse_dataset_list(content, "dataset")
    problems = [p for i, block in enumerate(blocks) for p in unit_problems(block, f"dataset[{i}]")]
    if problems:
        raise OptionsProblems(problems)
    written = convert_blocks(blocks, path.parent, output_path(output), "dataset", processes)
    rate = written["structures"] / max(written["seconds"], 1e-9)
    print(
        f"wrote {written['path']}: {written['structures']:,} structures, {written['atoms']:,} atoms, "
        f"{_megabytes(written['bytes'])} ({_megabytes(written['source_bytes'])} of source files), "
        f"in {written['seconds']:.1f} s ({rate:,.0f} structures/s, {written['processes']} "
        f"process{'es' if written['processes'] > 1 else ''})"
    )


def info(dataset: str, verify: bool) -> None:
    """Print what a converted dataset holds."""
    store = Store(Path(dataset))
    described = store.description
    n_atoms = store.n_atoms
    counts = StoredSet(store, np.arange(described.n_structures), described.targets).type_counts()
    periodic = int(np.asarray(store.array("pbc")).all(axis=1).sum())
    lines = [
        ("path", str(store.path)),
        ("format", f"mtt converted dataset, version {described.version}"),
        ("structures", f"{described.n_structures:,} ({periodic:,} periodic in 3 directions)"),
        (
            "atoms",
            f"{described.n_atoms:,}; {int(n_atoms.min())} to {int(n_atoms.max())} per structure, "
            f"{float(n_atoms.mean()):.1f} on average",
        ),
        ("elements", ", ".join(f"{chemical_symbols[z]} ({n:,} atoms)" for z, n in counts.items())),
    ]
    for target in described.targets:
        extras = (" + forces [eV/Å]" if target.forces else "") + (" + stress [eV/Å^3]" if target.stress else "")
        unit = target.unit or "no unit"
        lines.append(
            ("target", f"{target.name} [{unit}]{extras}" + (f": {target.description}" if target.description else ""))
        )
    lines.append(("size on disk", _megabytes(folder_size(store.path))))
    lines.append(("converted from", ", ".join(described.sources)))
    if verify:
        names = list(
            array_layout(described.n_structures, described.n_atoms, len(described.elements), described.targets)
        )
        intact = dataset_digest(store.path, names) == described.digest
        if not intact:
            raise DataError(
                f"the arrays of '{store.path}' differ from what was written (their sha256 digest changed): "
                "the dataset is corrupt.",
                hint="Convert it again with `mtt data convert`.",
            )
        lines.append(("verified", "every array has the digest written at conversion"))
    width = max(len(name) for name, _ in lines)
    for name, value in lines:
        print(f"{name:<{width}}  {value}")
