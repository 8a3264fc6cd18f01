"""Model predictions for a batch: per-structure values and, by autograd, forces and stress.

Derivatives are the framework's job, so every architecture gets forces and stress the
same way metatomic engines compute them from an exported model.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from metatomic.torch import ModelOutput

from ..architectures.base import output_name
from ..data.batching import Batch
from ..data.dataset import DatasetInfo


@dataclass
class Predictions:
    values: dict[str, torch.Tensor]  # (structures, width), or (atoms, width) for per-atom targets
    forces: dict[str, torch.Tensor]
    stress: dict[str, torch.Tensor]
    #: a model with a shallow ensemble: its members' deviations from each energy, (structures, members)
    members: dict[str, torch.Tensor] = field(default_factory=dict)


def predict(model: Any, batch: Batch, info: DatasetInfo, create_graph: bool) -> Predictions:
    """Run ``model`` (an architecture's model, or :class:`mtt.inference.EvaluatedModel`) on
    a batch; ``create_graph`` keeps derivatives differentiable (training)."""
    members = {}
    if batch.flat is not None and getattr(model, "shallow_ensemble", None) is not None:
        outputs, members = model.outputs_and_members_of_batch(batch.flat)
    elif batch.flat is not None:
        outputs = model.outputs_of_batch(batch.flat)
    else:
        requested = {
            output_name(t.name): ModelOutput(sample_kind="atom" if t.per_atom else "system")
            for t in info.targets.values()
        }
        results = model(batch.systems, requested)
        outputs = {}
        for name, result in results.items():
            block = result.block()
            values = block.values
            if len(block.components) == 1:  # a vector, (samples, xyz, properties): property by property
                values = values.transpose(1, 2)
            outputs[name] = values.reshape(len(values), -1)
    values, forces, stress = {}, {}, {}
    for target in info.targets.values():  # a fine-tuned model may have more outputs
        values[target.name] = outputs[output_name(target.name)]
        if not (target.forces or target.stress):
            continue
        inputs = list(batch.positions)
        if target.stress:
            inputs.extend(batch.strains)
        # retain_graph: the link from the batch's leaves to its neighbour vectors is reused
        grads = torch.autograd.grad(values[target.name].sum(), inputs, create_graph=create_graph, retain_graph=True)
        if target.forces:
            forces[target.name] = -torch.cat(grads[: len(batch.positions)])
        if target.stress:
            strains = [g.reshape(-1, 3, 3) for g in grads[len(batch.positions) :]]
            stress[target.name] = torch.cat(strains) / batch.volumes[:, None, None]
    by_target = {t.name: members[output_name(t.name)] for t in info.targets.values() if output_name(t.name) in members}
    return Predictions(values, forces, stress, by_target)
