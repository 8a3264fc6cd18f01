"""Real spherical harmonics, their rotations and their couplings, for every architecture.

One convention serves all of mtt: the real spherical harmonics Y_l^m orthonormal on the
sphere, with featomic's signs (so that SOAP-BPNN's descriptor equals featomic's). At run
time they are fixed polynomials of the unit vector (:class:`SphericalHarmonics`); the
Wigner matrices that rotate them and the Clebsch-Gordan coefficients that couple them are
computed once, numerically, in that same basis, so no other library's sign or ordering
convention has to be matched.

No ``from __future__ import annotations`` here: TorchScript compiles
:class:`SphericalHarmonics`.
"""

import functools
import math
from typing import Optional, Tuple

import numpy as np
import torch


def reference_harmonics(unit: np.ndarray, max_l: int) -> np.ndarray:
    """Real spherical harmonics of unit vectors from associated Legendre functions.

    Returns (points, max_l + 1, 2 max_l + 1); entry [:, l, l + m] is Y_l^m.
    """
    x, y, z = unit[:, 0], unit[:, 1], unit[:, 2]
    phi = np.arctan2(y, x)
    sin_theta = np.sqrt(np.clip(1 - z * z, 0, None))
    size = max_l + 1
    legendre = np.zeros((size, size, len(z)))  # P_l^m without the Condon-Shortley phase
    legendre[0, 0] = 1.0
    for m in range(1, size):
        legendre[m, m] = (2 * m - 1) * sin_theta * legendre[m - 1, m - 1]
    for m in range(size - 1):
        legendre[m + 1, m] = (2 * m + 1) * z * legendre[m, m]
    for m in range(size):
        for l in range(m + 2, size):
            legendre[l, m] = ((2 * l - 1) * z * legendre[l - 1, m] - (l + m - 1) * legendre[l - 2, m]) / (l - m)
    result = np.zeros((len(z), size, 2 * max_l + 1))
    for l in range(size):
        for m in range(l + 1):
            norm = math.sqrt((2 * l + 1) / (4 * math.pi) * math.factorial(l - m) / math.factorial(l + m))
            if m == 0:
                result[:, l, l] = norm * legendre[l, 0]
            else:
                result[:, l, l + m] = math.sqrt(2) * norm * legendre[l, m] * np.cos(m * phi)
                result[:, l, l - m] = math.sqrt(2) * norm * legendre[l, m] * np.sin(m * phi)
    return result


def sphere_points(max_l: int, seed: int = 0) -> np.ndarray:
    """Enough random directions to fit the harmonics' polynomials (and their rotations) exactly."""
    points = np.random.default_rng(seed).normal(size=(40 * (max_l + 1) ** 2 + 200, 3))
    return points / np.linalg.norm(points, axis=1, keepdims=True)


def harmonics_as_products(max_l: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """The harmonics as products of a polynomial in x and y and one in z, on the sphere.

    Y_l^m = Q_l^|m|(z) A_m(x, y), where A_m is the real (m >= 0) or imaginary (m < 0) part
    of (x + i y)^|m| and Q a polynomial of degree l - |m|. Returns the coefficients of A on
    the monomials x^a y^b ((L+1)^2, 2L + 1 columns L + m) and of Q on the powers of z
    (L + 1, (L+1)(2L+1) columns l (2L + 1) + L + m, the m of each l centred in its 2L + 1
    columns, zero where |m| > l): two small products instead of one over all
    (L+1)(L+2)(L+3)/6 monomials of degree up to L, of which each harmonic uses few.
    """
    size, width = max_l + 1, 2 * max_l + 1
    xy = np.zeros((size, size, width))  # [a, b, L + m]: coefficient of x^a y^b in A_m
    for m in range(size):
        for k in range(m + 1):  # (x + i y)^m = sum_k C(m, k) x^(m-k) (i y)^k
            part = math.comb(m, k) * (-1) ** (k // 2)
            xy[m - k, k, max_l + (m if k % 2 == 0 else -m)] += part
    points = sphere_points(max_l)
    x_powers, y_powers, z_powers = (points[:, axis, None] ** np.arange(size) for axis in range(3))
    along_xy = np.einsum("pa,pb,abc->pc", x_powers, y_powers, xy)
    reference = reference_harmonics(points, max_l)
    z = np.zeros((size, size * width))
    for l in range(size):
        for m in range(-l, l + 1):
            column = max_l + m
            design = z_powers[:, : l - abs(m) + 1] * along_xy[:, column, None]
            target = reference[:, l, l + m]
            fitted, *_ = np.linalg.lstsq(design, target, rcond=None)
            if np.abs(design @ fitted - target).max() > 1e-10:
                raise ArithmeticError(f"Y_{l}^{m} is not a polynomial in z times A_{m}(x, y)")
            fitted[np.abs(fitted) < 1e-13] = 0.0
            z[: len(fitted), l * width + column] = fitted
    return torch.tensor(xy.reshape(size * size, width)), torch.tensor(z)


class SphericalHarmonics(torch.nn.Module):
    """Y_l^m of unit vectors for l = 0 to ``max_l``, times ``scale``.

    ``compact`` columns are l^2 + l + m, the (L+1)^2 harmonics one after the other;
    otherwise l (2L + 1) + L + m, each l padded to 2L + 1 columns with its m centred (what
    batched products over m want).
    """

    def __init__(self, max_l: int, compact: bool = True, scale: float = 1.0):
        super().__init__()
        xy, z = harmonics_as_products(max_l)
        width = 2 * max_l + 1
        m_of_column = [m for l in range(max_l + 1) for m in range(-max_l, max_l + 1)]
        if compact:
            columns = [l * width + max_l + m for l in range(max_l + 1) for m in range(-l, l + 1)]
            z = z[:, columns]
            m_of_column = [m for l in range(max_l + 1) for m in range(-l, l + 1)]
        self.max_l = max_l
        self.compact = compact
        # constants, rebuilt from the hyperparameters: not part of the checkpoints
        self.register_buffer("xy_coefficients", xy, persistent=False)
        self.register_buffer("z_coefficients", z * scale, persistent=False)
        # the column of A_m (x, y) that each harmonic's column multiplies
        self.register_buffer("xy_column", torch.tensor([max_l + m for m in m_of_column]), persistent=False)

    def _along_xy(self, x: torch.Tensor, y: torch.Tensor, coefficients: torch.Tensor) -> torch.Tensor:
        """A_m(x, y) for every column of the harmonics (compact), or once per m (padded)."""
        size = self.max_l + 1
        along = (x[:, :, None] * y[:, None, :]).reshape(len(x), size * size) @ coefficients
        if self.compact:
            return along.index_select(1, self.xy_column)
        return along.repeat(1, size)

    def powers(self, unit: torch.Tensor) -> torch.Tensor:
        """The powers 0 to L of the unit vectors' components, (pairs, xyz, power)."""
        power_list = [torch.ones_like(unit)]
        for _ in range(self.max_l):
            power_list.append(power_list[-1] * unit)
        return torch.stack(power_list, dim=2)

    def forward(self, unit: torch.Tensor) -> torch.Tensor:
        return self.with_gradient(unit, False)[0]

    def with_gradient(self, unit: torch.Tensor, gradient: bool) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
        """The harmonics, (pairs, columns), and with ``gradient`` their gradient on the
        sphere, (pairs, 3, columns): the polynomials' gradient without its part along the
        unit vector, so that the change of Y(u / |u|) along a change d of u is d . gradient / |u|."""
        size = self.max_l + 1
        dtype = unit.dtype
        xy_coefficients, z_coefficients = self.xy_coefficients.to(dtype), self.z_coefficients.to(dtype)
        powers = self.powers(unit)
        x, y, z = powers[:, 0], powers[:, 1], powers[:, 2]
        along_xy = self._along_xy(x, y, xy_coefficients)
        along_z = z @ z_coefficients
        harmonics = along_z * along_xy
        if not gradient:
            return harmonics, None
        # d/du u^a = a u^(a - 1), for the three components at once
        exponents = torch.arange(1, size, dtype=dtype, device=unit.device)
        lowered = torch.cat([torch.zeros_like(powers[:, :, :1]), powers[:, :, :-1] * exponents], dim=2)
        dx, dy, dz = lowered[:, 0], lowered[:, 1], lowered[:, 2]
        d_along_x = self._along_xy(dx, y, xy_coefficients)
        d_along_y = self._along_xy(x, dy, xy_coefficients)
        d_along_z = dz @ z_coefficients
        full = torch.stack([along_z * d_along_x, along_z * d_along_y, d_along_z * along_xy], dim=1)
        radial_part = torch.bmm(unit[:, None, :], full)
        return harmonics, torch.baddbmm(full, unit[:, :, None], radial_part, alpha=-1.0)


@functools.lru_cache(maxsize=None)
def _rotation_samples(max_l: int) -> np.ndarray:
    return sphere_points(max_l, seed=1)


def wigner_d(l: int, rotation: np.ndarray) -> np.ndarray:
    """The (2l + 1) x (2l + 1) matrix D with Y_l(R u) = D Y_l(u) in this basis (columns m)."""
    points = _rotation_samples(l)
    before = reference_harmonics(points, l)[:, l, : 2 * l + 1]
    after = reference_harmonics(points @ rotation.T, l)[:, l, : 2 * l + 1]
    solution, *_ = np.linalg.lstsq(before, after, rcond=None)
    return solution.T


def random_rotations(count: int, seed: int = 0) -> list[np.ndarray]:
    """Rotation matrices (determinant 1) drawn from a fixed seed."""
    rng = np.random.default_rng(seed)
    rotations = []
    for _ in range(count):
        q, r = np.linalg.qr(rng.normal(size=(3, 3)))
        q = q * np.sign(np.diag(r))
        if np.linalg.det(q) < 0:
            q[:, 0] = -q[:, 0]
        rotations.append(q)
    return rotations


def _complex_clebsch_gordan(l1: int, l2: int, l3: int) -> np.ndarray:
    """<l1 m1 l2 m2 | l3 m3> in the Condon-Shortley convention (Racah's formula), indexed by
    l + m of each."""
    f = math.factorial
    result = np.zeros((2 * l1 + 1, 2 * l2 + 1, 2 * l3 + 1))
    common = (2 * l3 + 1) * f(l3 + l1 - l2) * f(l3 - l1 + l2) * f(l1 + l2 - l3) / f(l1 + l2 + l3 + 1)
    for m1 in range(-l1, l1 + 1):
        for m2 in range(-l2, l2 + 1):
            m3 = m1 + m2
            if abs(m3) > l3:
                continue
            total = 0.0
            for k in range(0, l1 + l2 - l3 + 1):
                terms = (l1 + l2 - l3 - k, l1 - m1 - k, l2 + m2 - k, l3 - l2 + m1 + k, l3 - l1 - m2 + k)
                if min(terms) < 0:
                    continue
                total += (-1) ** k / (f(k) * math.prod(f(t) for t in terms))
            norm = f(l3 + m3) * f(l3 - m3) * f(l1 - m1) * f(l1 + m1) * f(l2 - m2) * f(l2 + m2)
            result[l1 + m1, l2 + m2, l3 + m3] = math.sqrt(common * norm) * total
    return result


@functools.lru_cache(maxsize=None)
def _complex_to_real(l: int) -> np.ndarray:
    """Q with Y_real[l + a] = sum_m Q[l + a, l + m] Y_l^m, the complex harmonics in the
    Condon-Shortley convention: this module's Y_l^{+m} and Y_l^{-m} (m > 0) are sqrt(2) N P_l^m
    cos(m phi) and sin(m phi), with P_l^m free of the Condon-Shortley phase."""
    q = np.zeros((2 * l + 1, 2 * l + 1), dtype=complex)
    q[l, l] = 1.0
    for m in range(1, l + 1):
        sign = (-1) ** m
        q[l + m, l + m], q[l + m, l - m] = sign / math.sqrt(2), 1 / math.sqrt(2)
        q[l - m, l + m], q[l - m, l - m] = sign / (1j * math.sqrt(2)), -1 / (1j * math.sqrt(2))
    return q


@functools.lru_cache(maxsize=None)
def clebsch_gordan(l1: int, l2: int, l3: int) -> np.ndarray:
    """The real coupling C (2 l1 + 1, 2 l2 + 1, 2 l3 + 1) of l1 x l2 into l3 in this basis:
    sum_ab C[a, b, c] x_a y_b transforms as Y_l3 when x and y transform as Y_l1 and Y_l2.

    The one equivariant map (up to its scale) for |l1 - l2| <= l3 <= l1 + l2: Racah's
    coefficients turned to this real basis (real for l1 + l2 + l3 even, imaginary for odd,
    of which the imaginary part is taken); normalised to unit Frobenius norm times
    sqrt(2 l3 + 1), with the sign that makes its largest entry positive (a fixed convention).
    """
    if not abs(l1 - l2) <= l3 <= l1 + l2:
        raise ValueError(f"{l1} x {l2} has no part of degree {l3}")
    q1, q2, q3 = (_complex_to_real(l) for l in (l1, l2, l3))
    inverse1, inverse2 = np.linalg.inv(q1), np.linalg.inv(q2)
    complex_coupling = np.einsum("cz,xyz,xa,yb->abc", q3, _complex_clebsch_gordan(l1, l2, l3), inverse1, inverse2)
    coupling = complex_coupling.real if (l1 + l2 + l3) % 2 == 0 else complex_coupling.imag
    if np.abs(complex_coupling.imag if (l1 + l2 + l3) % 2 == 0 else complex_coupling.real).max() > 1e-10:
        raise ArithmeticError(f"the real coupling {l1} x {l2} -> {l3} is not real or imaginary")
    coupling = coupling * (math.sqrt(2 * l3 + 1) / np.linalg.norm(coupling))
    coupling = coupling * np.sign(coupling.flat[np.argmax(np.abs(coupling))])
    coupling[np.abs(coupling) < 1e-12] = 0.0
    return coupling
