"""metatrain's options that mtt reads in its own terms, so that metatrain's options files
run unchanged: per-target ``loss`` blocks, the training section's ``distributed``, and the
options mtt has no use for, which are dropped with a note (or refused where ignoring them
would train another model than the file asks for).

metatrain's ``early_stopping_patience``, ``scheduler_patience`` and ``scheduler_factor``
are mtt options of the same name and meaning (:class:`mtt.training.hypers.TrainerHypers`).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

from ..schema import flow_yaml
from ..training.hypers import LossHypers
from ..training.loss import term_label

UNUSED = "a metatrain option that mtt does not use"
LOSS_TYPES = ("mse", "mae", "huber")
#: the training keys mtt ignores: what each means to metatrain, and the values that are
#: mtt's behaviour anyway (any other value is refused)
IGNORED_TRAINING = {
    "per_structure_targets": ("mtt compares energies per atom, and other targets per structure", None),
    "log_separate_blocks": ("mtt logs one figure per target and derivative", None),
    "distributed_port": ("mtt derives the port from the SLURM job id; distributed.port sets one", None),
    "fit_composition_model": ("mtt always fits the per-element baseline", (True,)),
}
#: metatrain's SOAP-BPNN model keys that mtt's SOAP-BPNN does not have, with the values
#: that describe mtt's model (others would ask for another model)
IGNORED_SOAP_BPNN = {
    "add_lambda_basis": (True, False),
    "heads": ({},),
    "zbl": (False,),
    "long_range": None,  # a mapping: only `enable: false` is mtt's
}


@dataclass
class Translation:
    notes: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)


def translate_metatrain(raw: dict) -> Translation:
    """Rewrite metatrain's options of the composed ``raw`` options in place, in mtt's terms."""
    done = Translation()
    architecture = raw.get("architecture")
    if not isinstance(architecture, dict):
        return done
    training = architecture.get("training")
    if isinstance(training, dict):
        _training(training, raw, done)
        if isinstance(training.get("loss"), dict) and not set(training["loss"]) <= {f.name for f in fields(LossHypers)}:
            training["loss"] = _loss(training["loss"], _target_names(raw), done)
    model = architecture.get("model")
    if architecture.get("name") == "soap_bpnn" and isinstance(model, dict):
        _soap_bpnn(model, done)
    return done


def _training(training: dict, raw: dict, done: Translation) -> None:
    where = "architecture.training"
    if "distributed" in training:  # metatrain's switch; mtt's is the top-level group
        value = training.pop("distributed")
        if value is True:
            raw.setdefault("distributed", {})["enabled"] = True
            done.notes.append(f"{where}.distributed: metatrain's switch, read as distributed: true")
        else:
            done.notes.append(f"{where}.distributed: {UNUSED} (mtt's is the top-level distributed: false)")
    for key, (meaning, accepted) in IGNORED_TRAINING.items():
        if key not in training:
            continue
        value = training.pop(key)
        if accepted is not None and value not in accepted:
            done.problems.append(f"'{where}.{key}: {flow_yaml(value)}' is {UNUSED}, and {meaning}: remove it")
        else:
            done.notes.append(f"{where}.{key}: {UNUSED} ({meaning}); ignored")


def _target_names(raw: dict) -> list[str]:
    blocks = raw.get("training_set")
    blocks = blocks if isinstance(blocks, list) else [blocks]
    names: list[str] = []
    for block in blocks:
        if isinstance(block, dict) and isinstance(block.get("targets"), dict):
            names += [name for name in block["targets"] if name not in names]
    return names


def _loss(blocks: dict, targets: list[str], done: Translation) -> dict:
    """metatrain's per-target loss blocks as mtt's {type, weights, types, huber_delta}."""
    weights: dict[str, float] = {}
    types: dict[str, str] = {}
    deltas: set[float] = set()
    for target, block in blocks.items():
        where = f"architecture.training.loss.{target}"
        if target not in targets:
            done.problems.append(
                f"'{where}' names no target of training_set ({', '.join(targets) or 'none'})"
                + ("; mtt's own keys are type, weights, types and huber_delta" if targets else "")
            )
            continue
        terms = {"values": block}
        if isinstance(block, dict):
            gradients = block.get("gradients") if isinstance(block.get("gradients"), dict) else {}
            terms["forces"] = block.get("forces", gradients.get("positions"))
            terms["stress"] = block.get("stress", block.get("virial", gradients.get("strain")))
        for kind, term in terms.items():
            if term is None:
                continue
            label = term_label(target, kind)
            place = where if kind == "values" else f"{where}.{kind}"
            _term(term, label, place, weights, types, deltas, done)
    if len(deltas) > 1:
        done.problems.append(
            f"'architecture.training.loss': Huber losses with different deltas ({sorted(deltas)}); mtt has one "
            "huber_delta for every term"
        )
    loss: dict[str, Any] = {"type": "mse", "weights": weights, "types": types}
    if deltas:
        loss["huber_delta"] = deltas.pop()
    done.notes.append(f"architecture.training.loss: metatrain's per-target blocks, read as {loss}")
    return loss


def _term(
    term: Any,
    label: str,
    where: str,
    weights: dict[str, float],
    types: dict[str, str],
    deltas: set[float],
    done: Translation,
) -> None:
    if isinstance(term, str):
        term = {"type": term}
    if not isinstance(term, dict):
        done.problems.append(f"'{where}' must be a loss type or a mapping of type, weight, ..., got {term!r}")
        return
    kind = term.get("type", "mse")
    if kind not in LOSS_TYPES:
        done.problems.append(f"'{where}.type' must be one of {', '.join(map(repr, LOSS_TYPES))}, got {kind!r}")
    else:
        types[label] = kind
    if "weight" in term:
        weights[label] = term["weight"]
    if term.get("reduction", "mean") != "mean":
        done.problems.append(
            f"'{where}.reduction: {term['reduction']}' is not supported: every term of mtt's loss is a mean"
        )
    if "delta" in term:
        deltas.add(float(term["delta"]))
    if "sliding_factor" in term:
        done.notes.append(f"{where}.sliding_factor: {UNUSED}; ignored")
    unknown = set(term) - {"type", "weight", "reduction", "delta", "sliding_factor", "forces", "stress", "virial"}
    unknown.discard("gradients")
    for key in sorted(unknown):
        done.problems.append(f"unknown option '{where}.{key}' of a metatrain loss term")


def _soap_bpnn(model: dict, done: Translation) -> None:
    for key, accepted in IGNORED_SOAP_BPNN.items():
        if key not in model:
            continue
        value = model.pop(key)
        where = f"architecture.model.{key}"
        if key == "long_range":
            fine = not isinstance(value, dict) or not value.get("enable", False)
        else:
            fine = value in accepted
        if fine:
            done.notes.append(f"{where}: {UNUSED} (mtt's SOAP-BPNN has none); ignored")
        else:
            done.problems.append(
                f"'{where}: {flow_yaml(value)}' asks for what mtt's SOAP-BPNN does not have ({UNUSED})"
            )
