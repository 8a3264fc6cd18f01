"""The normalised SOAP features with hand-written derivatives, for training and validation.

Training on forces differentiates the forces with respect to the weights: autograd goes
through the backward pass of the descriptor a second time, op by op. The descriptor does
not depend on the weights, so all that second pass needs of it is a derivative along a
direction of the positions (a JVP). :class:`SoapFeatures` gives autograd exactly that:

- forward: the power spectrum of :class:`~.soap.SoapPowerSpectrum`, normalised per atom
  as the networks' layer norms do (their scale and shift stay in the networks);
- backward: :class:`SoapFeaturesVjp`, the pair-vector gradient, itself differentiable
  with respect to the incoming gradient;
- its backward: the JVP of the features along the incoming pair-vector direction.

Everything the forward computes depends on the positions alone, which training does not
change: the trainer keeps it per structure (:func:`kept_inputs`, through
``Model.precompute``), so that a force-training step only reads the features and what
their derivatives need.

Second derivatives with respect to the positions are not provided: the derivatives this
graph gives are those of the energy, and of the forces and stress with respect to the
weights, which is what training and validation ask for (flat batches). Exported models
keep the plain torch operations of :mod:`.soap`, whose derivatives autograd knows to any
order.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List

import torch


@dataclass
class _Saved:
    """What the derivatives of one batch's features need, all without autograd history."""

    descriptor: torch.nn.Module  # the SoapPowerSpectrum: constants and layout
    n_atoms: int
    slots: int
    rows: torch.Tensor  # (2 pairs x L + 1,) padded slot of each directed pair and l
    unit: torch.Tensor  # (pairs, 3)
    inverse_distance: torch.Tensor  # (pairs, 1)
    radial: torch.Tensor  # (pairs, (L + 1) N)
    radial_derivative: torch.Tensor  # (pairs, (L + 1) N), d/dr
    harmonics: torch.Tensor  # (pairs, (L + 1) W), W = 2L + 1 padded m
    harmonics_gradient: torch.Tensor  # (pairs, 3, (L + 1) W), on the sphere (SoapPowerSpectrum.harmonics)
    padded_radial: torch.Tensor  # (atoms x L + 1 x types, slots, N)
    padded_harmonics: torch.Tensor  # (atoms x L + 1 x types, slots, W)
    blocks: torch.Tensor  # expansion, (atoms x L + 1, types x N, W)
    raw: torch.Tensor | None  # (atoms, features) before the normalisation, when there is one
    mean: torch.Tensor | None  # (atoms, 1), of the raw features
    inverse_std: torch.Tensor | None  # (atoms, 1)


def _normalize_jacobian(saved: _Saved, values: torch.Tensor, weights: torch.Tensor | None) -> torch.Tensor:
    """The layer norm's Jacobian (symmetric) applied to per-atom feature rows, times
    ``weights`` (per column) first if given.

    The layer norm's own backward kernel, whose weight multiplies before the projection:
    one pass over the rows, where the same formula as torch operations (two means, three
    products) makes several.
    """
    if saved.raw is None:
        return values if weights is None else values * weights
    return torch.ops.aten.native_layer_norm_backward(
        values, saved.raw, saved.raw.shape[1:], saved.mean, saved.inverse_std, weights, None, [True, False, False]
    )[0]


class SoapFeatures(torch.autograd.Function):
    """(Normalised) power spectrum of the half-list pairs ``vectors``; see the module text.

    ``kept``, when given, is what :func:`kept_inputs` computed of the batch's structures
    (concatenated structure by structure) and ``order`` the batch's atoms as ``types``
    takes them: the features and what their derivatives need are then read, not computed.
    """

    @staticmethod
    def forward(ctx, vectors, descriptor, types, first, second, eps, kept=None, order=None):
        if kept is None:
            saved, features = _forward(descriptor, types, first, second, vectors.detach(), eps)
        else:
            saved, features = _kept_forward(descriptor, types, first, second, eps, kept, order)
        ctx.saved = saved
        return features

    @staticmethod
    def backward(ctx, grad_features):
        return SoapFeaturesVjp.apply(grad_features, ctx.saved), None, None, None, None, None, None, None


class SoapFeaturesVjp(torch.autograd.Function):
    """Gradient of the features with respect to the pair vectors, linear in ``grad_features``."""

    @staticmethod
    def forward(ctx, grad_features, saved):
        ctx.saved = saved
        return _vector_gradient(saved, grad_features)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, direction):
        return _feature_jvp(ctx.saved, direction), None


def _forward(descriptor, types, first, second, vectors, eps):
    """Features of a batch and what their derivatives need."""
    d = descriptor
    n_atoms, n_types, size, n_radial = len(types), d.n_types, d.max_angular + 1, d.n_radial
    width = 2 * d.max_angular + 1

    distances = torch.linalg.vector_norm(vectors, dim=1, keepdim=True)
    inverse_distance = 1.0 / distances
    unit = vectors * inverse_distance
    radial, radial_derivative = d.radial(distances.reshape(-1), True)
    harmonics, harmonics_gradient = d.harmonics(unit, True)

    species = d.type_to_index[types.long()]
    rows, slots = d.neighbor_slots(species, first, second)
    padded_radial, padded_harmonics = d.padded(radial, harmonics, rows, n_atoms, slots)
    blocks = d.expansion_of_padded(padded_radial, padded_harmonics, species).reshape(
        n_atoms * size, n_types * n_radial, width
    )

    features = d.power_spectrum(blocks, n_atoms)
    raw = mean = inverse_std = None
    if eps is not None:
        # layer norm's own kernel, which also returns the mean and 1 / std (cheaper than
        # var_mean); ctx keeps the input, not its own output, which would be a reference
        # cycle that only the garbage collector frees, keeping each step's graph
        raw = features
        features, mean, inverse_std = torch.native_layer_norm(features, features.shape[1:], None, None, eps)
    saved = _Saved(
        descriptor,
        n_atoms,
        slots,
        rows,
        unit,
        inverse_distance,
        radial,
        radial_derivative,
        harmonics,
        harmonics_gradient,
        padded_radial,
        padded_harmonics,
        blocks,
        raw,
        mean,
        inverse_std,
    )
    return saved, features


def _pair_widths(descriptor) -> List[int]:
    """Columns of :func:`kept_inputs`' pair rows: unit vector, 1 / distance, radial part and
    its derivative, harmonics and their polynomials' gradient, both directions' slots."""
    size, width = descriptor.max_angular + 1, 2 * descriptor.max_angular + 1
    radial = size * descriptor.n_radial
    return [3, 1, radial, radial, size * width, 3 * size * width, 2]


def kept_inputs(descriptor, types, first, second, vectors, eps) -> Dict[str, torch.Tensor]:
    """What the features of one structure and their derivatives need, to be kept by the
    trainer (the structures do not move): ``inputs`` (the features, a row per atom),
    ``atoms`` (their mean and 1 / std before the normalisation, the expansion) and
    ``pairs`` (the pairs' radial and angular parts and neighbour slots)."""
    saved, features = _forward(descriptor, types, first, second, vectors, eps)
    n_pairs = len(first)
    centers, neighbor_types = descriptor.directed_pairs(descriptor.type_to_index[types.long()], first, second)
    slot = descriptor.slot_in_group(centers, neighbor_types, len(types))
    pairs = torch.cat(
        [
            saved.unit,
            saved.inverse_distance,
            saved.radial,
            saved.radial_derivative,
            saved.harmonics,
            saved.harmonics_gradient.reshape(n_pairs, -1),
            slot.reshape(2, n_pairs).t().to(vectors.dtype),
        ],
        dim=1,
    )
    atoms = [saved.blocks.reshape(saved.n_atoms, -1)]
    if eps is not None:
        atoms = [saved.mean, saved.inverse_std] + atoms
    return {"inputs": features, "atoms": torch.cat(atoms, dim=1), "pairs": pairs}


def _kept_forward(d, types, first, second, eps, kept, order):
    """:func:`_forward` of a batch from its structures' :func:`kept_inputs`."""
    inputs, atoms, pairs = kept
    n_atoms, n_pairs = len(types), len(first)
    size, width = d.max_angular + 1, 2 * d.max_angular + 1
    features = inputs.index_select(0, order)
    atoms = atoms.index_select(0, order)
    unit, inverse_distance, radial, radial_derivative, harmonics, harmonics_gradient, slot = pairs.split(
        _pair_widths(d), dim=1
    )
    species = d.type_to_index[types.long()]
    slot = slot.t().reshape(-1).long()
    slots = int(slot.max()) + 1 if n_pairs > 0 else 1
    rows = d.slot_rows(*d.directed_pairs(species, first, second), slot, slots)
    padded_radial, padded_harmonics = d.padded(radial, harmonics, rows, n_atoms, slots)
    raw = mean = inverse_std = None
    if eps is not None:
        mean, inverse_std, atoms = atoms.split([1, 1, atoms.shape[1] - 2], dim=1)
        # contiguous: the layer norm's backward kernel reads them as such, whatever their strides
        mean, inverse_std = mean.contiguous(), inverse_std.contiguous()
        raw = torch.addcmul(mean, features, 1 / inverse_std)  # the layer norm's backward takes its input
    blocks = atoms.reshape(n_atoms * size, d.n_types * d.n_radial, width)
    saved = _Saved(
        d,
        n_atoms,
        slots,
        rows,
        unit,
        inverse_distance,
        radial,
        radial_derivative,
        harmonics,
        harmonics_gradient.reshape(n_pairs, 3, size * width),
        padded_radial,
        padded_harmonics,
        blocks,
        raw,
        mean,
        inverse_std,
    )
    return saved, features


def _scatter_to_products(saved: _Saved, grad_features: torch.Tensor) -> torch.Tensor:
    """d loss / d products, (atoms x L + 1, types x N, types x N).

    The features of each pair of types a <= b are the products' block (a, b), l by l: one
    block copy per pair of types (cheaper than a gather of single columns); the products
    of pairs a > b get no gradient (the features count each pair once).
    """
    d = saved.descriptor
    n_atoms, size, n_types, n = saved.n_atoms, d.max_angular + 1, d.n_types, d.n_radial
    weighted = _normalize_jacobian(saved, grad_features, None) * d.feature_weights.to(grad_features.dtype)
    per_pair = weighted.view(n_atoms, -1, size, n, n)  # (atom, pair, l, n1, n2), featomic's order
    products = torch.zeros((n_atoms, size, n_types, n, n_types, n), dtype=weighted.dtype, device=weighted.device)
    for pair, (a, b) in enumerate(d.type_pairs):
        products[:, :, a, :, b, :] = per_pair[:, pair]
    return products.view(-1, n_types * n, n_types * n)


def _vector_gradient(saved: _Saved, grad_features: torch.Tensor) -> torch.Tensor:
    """d loss / d pair vectors, (pairs, 3), from d loss / d features."""
    d = saved.descriptor
    n_pairs = len(saved.unit)
    size, n_radial = d.max_angular + 1, d.n_radial
    width = 2 * d.max_angular + 1
    # products = blocks blocks^T: d / d blocks = (G + G^T) blocks, the transpose left to the
    # matrix product (adding a transposed copy first takes longer than a second product)
    grad_products = _scatter_to_products(saved, grad_features)
    grad_blocks = torch.baddbmm(torch.bmm(grad_products, saved.blocks), grad_products.transpose(1, 2), saved.blocks)
    grad_expansion = grad_blocks.reshape(-1, n_radial, width)  # (atom, l, type), n, m
    # back to each directed pair's slot: radial and angular parts
    grad_radial = torch.bmm(saved.padded_harmonics, grad_expansion.transpose(1, 2))  # (batch, slot, n)
    grad_radial = grad_radial.reshape(-1, n_radial).index_select(0, saved.rows).reshape(2, n_pairs, size * n_radial)
    grad_harmonics = torch.bmm(saved.padded_radial, grad_expansion)  # (batch, slot, m)
    grad_harmonics = grad_harmonics.reshape(-1, width).index_select(0, saved.rows).reshape(2, n_pairs, size * width)
    # both directions on the half pair: the reversed vector flips odd l
    grad_radial = grad_radial[0] + grad_radial[1]
    grad_harmonics = grad_harmonics[0] + grad_harmonics[1] * d.harmonic_parity.to(grad_features.dtype)
    along = (grad_radial * saved.radial_derivative).sum(dim=1, keepdim=True)
    tangential = torch.bmm(saved.harmonics_gradient, grad_harmonics[:, :, None]).reshape(n_pairs, 3)
    # the radial part changes along the unit vector, the harmonics across it (/ |u|)
    return tangential * saved.inverse_distance + saved.unit * along


def _feature_jvp(saved: _Saved, direction: torch.Tensor) -> torch.Tensor:
    """Change of the features, (atoms, features), along a change of the pair vectors."""
    d = saved.descriptor
    dtype = direction.dtype
    along = (saved.unit * direction).sum(dim=1, keepdim=True)
    d_radial = saved.radial_derivative * along
    d_harmonics = torch.bmm(direction[:, None, :], saved.harmonics_gradient).reshape(len(direction), -1)
    d_harmonics = d_harmonics * saved.inverse_distance
    padded_d_radial, padded_d_harmonics = d.padded(d_radial, d_harmonics, saved.rows, saved.n_atoms, saved.slots)
    # the expansion is bilinear in the radial and angular parts
    d_expansion = torch.baddbmm(
        torch.bmm(padded_d_radial.transpose(1, 2), saved.padded_harmonics),
        saved.padded_radial.transpose(1, 2),
        padded_d_harmonics,
    )
    d_blocks = d_expansion.reshape(saved.blocks.shape)
    half = torch.bmm(d_blocks, saved.blocks.transpose(1, 2))
    # d products = half + half^T, needed only in the blocks a <= b that are features: one
    # sum per pair of types, in featomic's order (cheaper than a sum of the whole
    # matrices and a gather of single columns)
    size, n_types, n = d.max_angular + 1, d.n_types, d.n_radial
    half = half.view(saved.n_atoms, size, n_types, n, n_types, n)
    per_pair = [half[:, :, a, :, b, :] + half[:, :, b, :, a, :].transpose(-1, -2) for a, b in d.type_pairs]
    d_features = torch.stack(per_pair, dim=1).reshape(saved.n_atoms, -1)
    return _normalize_jacobian(saved, d_features, d.feature_weights.to(dtype))
