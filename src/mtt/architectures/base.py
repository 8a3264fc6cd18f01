"""What every architecture's model is: a metatomic-compatible module with a baseline.

An architecture turns a batch of structures, given as flat tensors (:class:`FlatBatch`:
types, positions, pairs with their vectors), into per-atom contributions
(``per_atom_outputs``): one function, for training and for the exported model. This base
class adds the per-element composition baseline and the target scale that the framework
fits, sums atoms into structures and packs the results as metatensor ``TensorMap``; in
an exported model its ``forward`` builds the flat batch from metatomic systems, so the
same module runs in training and, wrapped by metatomic's ``AtomisticModel``, in ASE,
LAMMPS and i-PI.
"""

from typing import Dict, Iterable, List, Optional, Tuple

import torch
from metatensor.torch import Labels, TensorBlock, TensorMap
from metatomic.torch import ModelOutput, NeighborListOptions, System

from ..data.dataset import DatasetInfo
from ..data.flat_batch import FlatBatch, batch_of_systems


def keep_step_memory_hint(like: torch.Tensor) -> torch.Tensor:
    """A zero of ``like``'s dtype, for an engine's process to keep each step's memory.

    glibc serves large blocks with ``mmap`` and hands the top of the heap back to the
    system once more than twice that threshold is free there, so an engine's CPU step
    faults in, and zero-fills, the pages of its large tensors again at every step. The
    threshold starts at 128 KiB and rises to the size of any mapped block that is freed,
    up to 32 MiB (mallopt(3), "dynamic mmap threshold"): allocating and freeing a block
    just under that, never touched, makes the process keep up to twice as much for the
    next step, as ``mtt.allocator`` does for training, without asking the engine for
    anything. Where the allocator was set otherwise (``MALLOC_*`` variables, ``mallopt``,
    another allocator), glibc keeps those settings. The zero is for the caller to add to
    its outputs: TorchScript removes an allocation that nothing uses, and folds one whose
    size is a constant.
    """
    block = torch.empty([(31 << 20) + 0 * like.shape[0]], dtype=torch.uint8)
    return block[:0].sum().to(like.dtype)


def output_name(target: str) -> str:
    """Name of a target among metatomic outputs: 'energy' and its variants ('energy/xtb':
    another level of theory) are standard, others are ours."""
    return target if target == "energy" or target.startswith("energy/") else f"mtt::{target}"


class CompositionBaseline(torch.nn.Module):
    """Per-element offsets and a scale per target, fitted by the framework before training."""

    def __init__(self, atomic_types: List[int], n_targets: int):
        super().__init__()
        index = torch.full((max(atomic_types) + 1,), -1, dtype=torch.long)
        index[torch.tensor(atomic_types)] = torch.arange(len(atomic_types))
        self.register_buffer("type_to_index", index)
        self.register_buffer("weights", torch.zeros(len(atomic_types), n_targets, dtype=torch.float64))
        self.register_buffer("scales", torch.ones(n_targets, dtype=torch.float64))

    def forward(self, types: torch.Tensor, raw: torch.Tensor) -> torch.Tensor:
        """Per-atom outputs: the element's offset plus the scaled network contribution."""
        offsets = self.weights.to(raw.dtype)[self.type_to_index[types.long()]]
        return offsets + raw * self.scales.to(raw.dtype)


def uncertainty_name(output: str) -> str:
    """metatomic's name of the uncertainty of an energy output: 'energy_uncertainty', or
    'energy_uncertainty/xtb' for 'energy/xtb'."""
    return "energy_uncertainty" + output[len("energy") :]


def ensemble_name(output: str) -> str:
    """metatomic's name of the ensemble of an energy output: 'energy_ensemble', or
    'energy_ensemble/xtb' for 'energy/xtb'."""
    return "energy_ensemble" + output[len("energy") :]


class LastLayerUncertainty(torch.nn.Module):
    """The calibrated last-layer posterior of a trained model (LLPR: Bigi, Chong, Ceriotti and
    Grasselli, arXiv 2403.02251): the inverse of the regularised covariance of the training
    structures' last-layer features, and one calibrated factor per output column (zero:
    no uncertainty for that column).

    An output's variance for a structure with summed features ``f`` is
    ``factor**2 * f @ inverse @ f``. An atom's local variance is the same form of its own
    features with ``local_inverse``, the inverse of the regularised covariance of the
    training *atoms'* features, and ``local_factors``, calibrated so that the atoms'
    variances add up to the structures' squared errors: the structures' posterior alone
    leaves an atom's share of the energy unconstrained in the directions along which sums
    over a structure's atoms hardly vary (a fixed composition), and its local variances
    there are many times the structure's. An ensemble of last-layer weights sampled from that
    posterior, ``ensemble[column]`` (features, members), gives each member's deviation
    ``f @ ensemble[column]``, whose derivatives are the members' forces. It is fitted by
    the framework after training (:mod:`mtt.training.uncertainty`); checkpoints of an mtt
    without it load as unfitted.
    """

    def __init__(self, n_features: int, n_columns: int):
        super().__init__()
        self.register_buffer("inverse", torch.zeros(n_features, n_features, dtype=torch.float64))
        self.register_buffer("factors", torch.zeros(n_columns, dtype=torch.float64))
        # no member until fitted: their number is a training option
        self.register_buffer("ensemble", torch.zeros(n_columns, n_features, 0, dtype=torch.float64))
        self.register_buffer("local_inverse", torch.zeros(n_features, n_features, dtype=torch.float64))
        self.register_buffer("local_factors", torch.zeros(n_columns, dtype=torch.float64))

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003
        for local, structure in (("local_inverse", "inverse"), ("local_factors", "factors")):
            # fitted before local posteriors: atoms keep the structures' one, as then
            if prefix + local not in state_dict and prefix + structure in state_dict:
                state_dict[prefix + local] = state_dict[prefix + structure].clone()
        for name, value in self._buffers.items():
            if value is None:
                continue
            if prefix + name not in state_dict:  # checkpoints from before uncertainties: unfitted
                state_dict[prefix + name] = torch.zeros_like(value)
            elif name == "ensemble":  # as many members as the checkpoint's fit sampled
                self._buffers[name] = torch.zeros(
                    state_dict[prefix + name].shape, dtype=value.dtype, device=value.device
                )
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def members(self, features: torch.Tensor, column: int) -> torch.Tensor:
        """Every ensemble member's deviation from output ``column``, (rows, members)."""
        return features.to(torch.float64) @ self.ensemble[column].to(torch.float64)

    def forward(self, features: torch.Tensor, column: int, local: bool = False) -> torch.Tensor:
        """Standard deviations of output ``column``, (rows, 1), for rows of features: of
        structures (summed features), or of atoms with ``local``."""
        inverse = self.local_inverse if local else self.inverse
        factor = self.local_factors[column] if local else self.factors[column]
        # in float64 even in a model cast to float32: the quadratic form cancels large terms
        rows = features.to(torch.float64)
        variances = (rows @ inverse.to(torch.float64) * rows).sum(1, keepdim=True)
        return factor.to(torch.float64) * torch.sqrt(variances.clamp(min=0.0))


class ShallowEnsemble(torch.nn.Module):
    """Last-layer members trained with the model (a shallow ensemble: Kellner and Ceriotti,
    arXiv 2402.16621): ``deviations[column]`` (features, members) are each member's
    last-layer weights minus the architecture's own head, centred over the members so that
    the ensemble's mean is the head and the model's own predictions are unchanged. Attached
    by the framework when ``training.shallow_ensemble`` asks for it; after training the
    fit of :mod:`mtt.training.uncertainty` copies them, calibrated, into the exported
    ``energy_ensemble``."""

    def __init__(self, n_columns: int, n_features: int, members: int):
        super().__init__()
        # as spread as the last layer's own weights starts, a tenth of it: the likelihood
        # needs distinct members to begin with, and shrinks or widens them from there
        start = torch.randn(n_columns, n_features, members) * (0.1 / max(1, n_features) ** 0.5)
        self.deviations = torch.nn.Parameter(start)

    def forward(self, features: torch.Tensor, column: int) -> torch.Tensor:
        """Every member's deviation from output ``column`` for rows of features, (rows, members)."""
        deviations = self.deviations[column]
        return features @ (deviations - deviations.mean(1, keepdim=True))


class Model(torch.nn.Module):
    """Base class of the models of all architectures."""

    # declared for TorchScript, which cannot infer the type of an empty list
    output_starts: List[int]
    output_widths: List[int]
    output_properties: List[int]
    output_vectors: List[bool]
    output_per_atom: List[bool]

    def __init__(self, info: DatasetInfo):
        super().__init__()
        self.atomic_types: List[int] = list(info.atomic_types)
        self.output_names: List[str] = [output_name(t) for t in info.targets]
        # the columns of every output among the per-atom outputs, target after target: one
        # per property, or x, y and z of each property for vectors
        self.output_starts: List[int] = []
        self.output_widths: List[int] = []
        self.output_properties: List[int] = []
        self.output_vectors: List[bool] = []
        self.output_per_atom: List[bool] = []
        start = 0
        for target in info.targets.values():
            self.output_starts.append(start)
            self.output_widths.append(target.width)
            self.output_properties.append(target.properties)
            self.output_vectors.append(target.vector)
            self.output_per_atom.append(target.per_atom)
            start += target.width
        self.n_columns = start
        self.composition = CompositionBaseline(self.atomic_types, self.n_columns)
        #: for each output, its uncertainty's name, or "" for outputs that have none (all
        #: but energies per structure); :meth:`offer_last_layer_features` sizes the posterior
        self.uncertainty_names: List[str] = [
            uncertainty_name(name) if name.startswith("energy") and not t.per_atom and not t.vector else ""
            for name, t in zip(self.output_names, info.targets.values())
        ]
        #: the same for the ensembles of those outputs
        self.ensemble_names: List[str] = [
            ensemble_name(name) if uncertain else ""
            for name, uncertain in zip(self.output_names, self.uncertainty_names)
        ]
        self.uncertainty = LastLayerUncertainty(0, self.n_columns)
        self._xyz = Labels("xyz", torch.tensor([[0], [1], [2]]))

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003
        # a model trained with a shallow ensemble keeps its members, whatever it is rebuilt for
        # (a restart, fine-tuning, mtt calibrate or export)
        trained = state_dict.get(prefix + "shallow_ensemble.deviations")
        if trained is not None and not hasattr(self, "shallow_ensemble"):
            self.shallow_ensemble = ShallowEnsemble(*trained.shape).to(trained.dtype)
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    @torch.jit.unused
    def offer_last_layer_features(self, n_features: int) -> None:
        """Called by an architecture's ``__init__`` that implements
        :meth:`per_atom_outputs_and_features`: its models then get last-layer uncertainties."""
        self.uncertainty = LastLayerUncertainty(n_features, self.n_columns)

    # -- what an architecture implements -------------------------------------------------
    def per_atom_outputs(self, batch: FlatBatch) -> torch.Tensor:
        """Network contribution of every atom of ``batch``, (atoms, ``n_columns``): the
        columns of each target from ``output_starts``, ``output_widths`` of them; a vector
        target's are x, y and z of each property, and must rotate with the structure (what
        the framework sums over atoms for a per-structure target must be too).

        The same function runs in training, with the trainer's batches (and what it keeps
        in ``batch.data``), and in the exported model, with batches built from the
        engine's systems (``batch.data`` empty); forces and stress are autograd's
        derivatives of its output with respect to the positions and pair vectors.
        """
        raise NotImplementedError

    def per_atom_outputs_and_features(self, batch: FlatBatch) -> Tuple[torch.Tensor, torch.Tensor]:
        """:meth:`per_atom_outputs`, and every atom's last-layer features (atoms, n): the
        inputs of the linear map that gives the scalar outputs, so that an atom's scalar
        contributions are those features times the last weights. An architecture that
        implements it calls :meth:`offer_last_layer_features` with n; the framework then
        fits last-layer uncertainties of its energies."""
        raise NotImplementedError("this architecture offers no last-layer features")

    def requested_neighbor_lists(self) -> List[NeighborListOptions]:
        """Neighbour lists the model reads (``batch.neighbors``, in this order)."""
        return []

    @torch.jit.unused
    def interaction_range(self) -> float:
        """How far, in Å, an atom's energy depends on other atoms (declared to simulation
        engines: a message-passing model's is its layers times its cutoff)."""
        return 0.0

    @torch.jit.unused
    def adapt_to_data(self, batches: Iterable[FlatBatch]) -> None:
        """Fit what the model takes from the training data before training starts: the
        statistics that normalise its layers (an average number of neighbours, say), kept
        in persistent buffers so that checkpoints and exported models have them. Called
        once for a new run, with the training set's batches; the default takes nothing."""

    @torch.jit.unused
    def precompute(self, batch: FlatBatch, derivatives: bool) -> Dict[str, torch.Tensor]:
        """Data about one structure that does not depend on the weights, kept by the trainer.

        The trainer calls this once per training or validation structure (a batch of that
        structure alone; ``derivatives`` when forces or stress are trained) and gives the
        result back in ``batch.data`` at every step, rows concatenated structure by
        structure, when every structure of the batch has them (within the memory budget
        ``training.cache_memory_mb``). A model given such data must return the same values
        and first derivatives as without it. The default keeps nothing.
        """
        return {}

    @torch.jit.unused
    def heads(self) -> List[torch.nn.Module]:
        """The modules from the last features to the outputs: what fine-tuning with
        ``method: heads`` trains, the rest frozen. An architecture that does not say
        cannot be fine-tuned that way."""
        raise NotImplementedError

    @torch.jit.unused
    def inherited_name(self, name: str, old: "Model") -> Optional[str]:
        """The name in ``old``'s state of this model's state entry ``name``, or None for an
        entry that is new (an element ``old`` never saw): architectures whose entries are
        numbered by element say how (see :meth:`inherit`)."""
        return name

    @torch.jit.unused
    def indexed_axes(self, name: str, old: "Model") -> List[Tuple[int, List[Tuple[int, int]]]]:
        """For the state entry ``name``, its axes numbered by element, target or anything
        else ``old`` has fewer of: (axis, [(index here, index in old), ...]) each, so that
        :meth:`inherit` copies those rows and leaves the new ones as they are."""
        return []

    @torch.jit.unused
    def inherit(self, old: "Model") -> None:
        """Start from the weights of ``old``, a trained model of this architecture with the
        same hyperparameters whose elements and targets are among this model's (fine-tuning).

        Every state entry is copied from ``old``'s, by :meth:`inherited_name` and along the
        axes of :meth:`indexed_axes`; what is new (an element's weights, a target's head)
        keeps its initial values. The baseline is copied for the elements and targets both
        have (the framework refits the rest).
        """
        from ..errors import CheckpointError

        theirs = old.state_dict()
        for name, mine in self.state_dict().items():
            if name.startswith("shallow_ensemble."):  # the checkpoint's members, when it trained as many
                if name in theirs and theirs[name].shape == mine.shape:
                    with torch.no_grad():
                        mine.copy_(theirs[name])
                continue
            source = self.inherited_name(name, old)
            if source is None or name == "composition.type_to_index":  # new, or made from the elements
                continue
            if name.startswith("uncertainty."):  # fitted again for the fine-tuned weights
                continue
            previous = theirs[source]
            axes = self.indexed_axes(name, old)
            if name == "composition.weights":
                axes = [(0, shared_indices(self.atomic_types, old.atomic_types)), (1, self.shared_outputs(old))]
            elif name == "composition.scales":
                axes = [(0, self.shared_outputs(old))]
            if not axes:
                if previous.shape != mine.shape:
                    raise CheckpointError(
                        f"the weights '{name}' of the checkpoint have shape {tuple(previous.shape)}, the model "
                        f"here needs {tuple(mine.shape)}: this architecture cannot take new elements or targets.",
                        hint="Fine-tune on the checkpoint's elements and targets, or train a new model.",
                    )
                mine.copy_(previous)
                continue
            with torch.no_grad():
                mine.copy_(copied_along(mine, previous, axes))

    @torch.jit.unused
    def shared_outputs(self, old: "Model") -> List[Tuple[int, int]]:
        """(column here, column in ``old``) of the outputs both models have."""
        pairs = []
        for mine, theirs in shared_indices(self.output_names, old.output_names):
            if self.output_widths[mine] != old.output_widths[theirs]:
                raise ValueError(f"output {self.output_names[mine]} changed its shape")
            start, previous = self.output_starts[mine], old.output_starts[theirs]
            pairs += [(start + k, previous + k) for k in range(self.output_widths[mine])]
        return pairs

    # -- what the framework provides ----------------------------------------------------
    def outputs_of_batch(self, batch: FlatBatch) -> Dict[str, torch.Tensor]:
        """Each output of a batch, with the baseline: (structures, width) per structure, or
        (atoms, width) for per-atom targets."""
        return self._outputs_of_raw(batch, self.per_atom_outputs(batch))

    @torch.jit.unused
    def outputs_and_members_of_batch(self, batch: FlatBatch) -> Tuple[Dict[str, torch.Tensor], Dict[str, torch.Tensor]]:
        """:meth:`outputs_of_batch`, and for each energy output the deviations of the shallow
        ensemble's members from it, (structures, members): a member's energy is the
        output's plus its deviation. For a model with ``shallow_ensemble`` attached."""
        raw, features = self.per_atom_outputs_and_features(batch)
        outputs = self._outputs_of_raw(batch, raw)
        summed = torch.zeros((batch.n_structures, features.shape[1]), dtype=features.dtype, device=features.device)
        summed = summed.index_add(0, batch.structure, features)
        deviations: Dict[str, torch.Tensor] = {}
        for i, name in enumerate(self.output_names):
            if self.uncertainty_names[i] != "":
                column = self.output_starts[i]
                scale = self.composition.scales[column].to(features.dtype)  # the head's output is scaled so
                deviations[name] = self.shallow_ensemble(summed, column) * scale
        return outputs, deviations

    def _outputs_of_raw(self, batch: FlatBatch, raw: torch.Tensor) -> Dict[str, torch.Tensor]:
        per_atom = self.composition(batch.types, raw)
        totals = torch.zeros((batch.n_structures, per_atom.shape[1]), dtype=per_atom.dtype, device=per_atom.device)
        totals = totals.index_add(0, batch.structure, per_atom)
        results: Dict[str, torch.Tensor] = {}
        for i, name in enumerate(self.output_names):
            start, stop = self.output_starts[i], self.output_starts[i] + self.output_widths[i]
            results[name] = per_atom[:, start:stop] if self.output_per_atom[i] else totals[:, start:stop]
        return results

    def _block(self, i: int, values: torch.Tensor, samples: Labels) -> TensorBlock:
        """Output ``i``'s columns of ``values`` as metatensor's block: (samples, [xyz,] properties)."""
        device = values.device
        properties = Labels("_", torch.arange(self.output_properties[i], device=device, dtype=torch.int32)[:, None])
        if self.output_vectors[i]:
            values = values.reshape(values.shape[0], self.output_properties[i], 3).transpose(1, 2)
            return TensorBlock(values=values, samples=samples, components=[self._xyz.to(device)], properties=properties)
        return TensorBlock(values=values, samples=samples, components=[], properties=properties)

    def forward(
        self,
        systems: List[System],
        outputs: Dict[str, ModelOutput],
        selected_atoms: Optional[Labels] = None,
    ) -> Dict[str, TensorMap]:
        """metatomic's model interface: per-structure or per-atom outputs as TensorMaps.

        One system's per-structure outputs of all atoms, the case of every MD step, take the
        fewest operations: numbering atoms within their systems is a noticeable part of a
        small molecule's energy and forces.
        """
        batch = batch_of_systems(systems, self.requested_neighbor_lists())
        types = batch.types
        device = types.device
        uncertain = False
        for name in self.uncertainty_names + self.ensemble_names:
            if name != "" and name in outputs:
                uncertain = True
        if uncertain:  # the features cost nothing extra, but only their requests compute them
            raw, features = self.per_atom_outputs_and_features(batch)
        else:
            raw = self.per_atom_outputs(batch)
            features = raw[:, :0]
        per_atom = self.composition(types, raw)
        if device.type == "cpu":
            per_atom = per_atom + keep_step_memory_hint(per_atom)
        keys = Labels("_", torch.zeros((1, 1), dtype=torch.int32, device=device))
        per_atom_requested = False
        for name in self.output_names:
            if name in outputs and outputs[name].sample_kind == "atom":
                per_atom_requested = True

        results: Dict[str, TensorMap] = {}
        if len(systems) == 1 and selected_atoms is None and not per_atom_requested and not uncertain:
            totals = per_atom.sum(0, keepdim=True)
            samples = Labels(["system"], torch.zeros((1, 1), dtype=torch.int32, device=device))
            for i, name in enumerate(self.output_names):
                if name in outputs:
                    start = self.output_starts[i]
                    block = self._block(i, totals[:, start : start + self.output_widths[i]], samples)
                    results[name] = TensorMap(keys, [block])
            return results

        n_atoms = torch.tensor([len(s) for s in systems], device=device)
        first_atom = torch.cumsum(n_atoms, 0) - n_atoms
        system_of_atom = batch.structure
        atom_numbers = torch.arange(len(types), device=device)
        if selected_atoms is not None:
            selected = torch.zeros(len(types), dtype=torch.bool, device=device)
            chosen = selected_atoms.values.to(device)
            selected[first_atom[chosen[:, 0]] + chosen[:, 1]] = True
            per_atom = per_atom[selected]
            features = features[selected]
            system_of_atom = system_of_atom[selected]
            atom_numbers = atom_numbers[selected]
        atom_in_system = atom_numbers - first_atom[system_of_atom]
        system_samples = Labels(["system"], torch.arange(len(systems), device=device, dtype=torch.int32)[:, None])
        for i, name in enumerate(self.output_names):
            if name not in outputs:
                continue
            start = self.output_starts[i]
            values = per_atom[:, start : start + self.output_widths[i]]
            if outputs[name].sample_kind == "atom":
                samples = Labels(["system", "atom"], torch.stack([system_of_atom, atom_in_system], 1).to(torch.int32))
            else:
                summed = torch.zeros((len(systems), values.shape[1]), dtype=values.dtype, device=device)
                values = summed.index_add(0, system_of_atom, values)
                samples = system_samples
            results[name] = TensorMap(keys, [self._block(i, values, samples)])
        if uncertain:
            one = Labels("_", torch.zeros((1, 1), dtype=torch.int32, device=device))
            for i, name in enumerate(self.uncertainty_names):
                if name == "" or name not in outputs:
                    continue
                local = outputs[name].sample_kind == "atom"
                if local:  # an atom's own uncertainty: its local one
                    rows = features
                    samples = Labels(
                        ["system", "atom"], torch.stack([system_of_atom, atom_in_system], 1).to(torch.int32)
                    )
                else:  # a structure's: of its summed features, not a sum of its atoms'
                    rows = torch.zeros((len(systems), features.shape[1]), dtype=features.dtype, device=device)
                    rows, samples = rows.index_add(0, system_of_atom, features), system_samples
                values = self.uncertainty(rows, self.output_starts[i], local).to(per_atom.dtype)
                block = TensorBlock(values=values, samples=samples, components=[], properties=one)
                results[name] = TensorMap(keys, [block])
            for i, name in enumerate(self.ensemble_names):
                if name == "" or name not in outputs:
                    continue
                start = self.output_starts[i]
                energies = per_atom[:, start : start + 1]
                rows = features
                if outputs[name].sample_kind == "atom":
                    samples = Labels(
                        ["system", "atom"], torch.stack([system_of_atom, atom_in_system], 1).to(torch.int32)
                    )
                else:
                    rows = torch.zeros((len(systems), features.shape[1]), dtype=features.dtype, device=device)
                    rows = rows.index_add(0, system_of_atom, features)
                    summed = torch.zeros((len(systems), 1), dtype=energies.dtype, device=device)
                    energies, samples = summed.index_add(0, system_of_atom, energies), system_samples
                values = energies + self.uncertainty.members(rows, start).to(energies.dtype)
                members = torch.arange(values.shape[1], device=device, dtype=torch.int32)[:, None]
                block = TensorBlock(
                    values=values, samples=samples, components=[], properties=Labels("ensemble_member", members)
                )
                results[name] = TensorMap(keys, [block])
        return results


def shared_indices(mine: List, theirs: List) -> List[Tuple[int, int]]:
    """(index in ``mine``, index in ``theirs``) of every item both lists have."""
    return [(i, theirs.index(item)) for i, item in enumerate(mine) if item in theirs]


def copied_along(
    mine: torch.Tensor, theirs: torch.Tensor, axes: List[Tuple[int, List[Tuple[int, int]]]]
) -> torch.Tensor:
    """``mine`` with the entries of ``theirs`` at the index pairs of every axis in ``axes``
    (the other axes have the same size in both)."""
    result = mine.clone()
    target: List = [slice(None)] * mine.dim()
    source: List = [slice(None)] * mine.dim()
    for axis, pairs in axes:
        target[axis] = torch.tensor([p[0] for p in pairs], dtype=torch.long)
        source[axis] = torch.tensor([p[1] for p in pairs], dtype=torch.long)
    if any(len(pairs) == 0 for _, pairs in axes):
        return result
    result[_open_mesh(target)] = theirs[_open_mesh(source)].to(result.dtype)
    return result


def _open_mesh(index: List) -> Tuple:
    """Advanced indices of several axes as an open mesh (their outer product), slices kept."""
    tensors = [i for i in index if isinstance(i, torch.Tensor)]
    if len(tensors) <= 1:
        return tuple(index)
    shape_rank = len(tensors)
    result, k = [], 0
    for i in index:
        if isinstance(i, torch.Tensor):
            shape = [1] * shape_rank
            shape[k] = -1
            result.append(i.reshape(shape))
            k += 1
        else:
            result.append(i)
    return tuple(result)
