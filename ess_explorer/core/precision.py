"""The two accuracy contracts of the spectra, and the guard that keeps a fast route inside one.

    "ess"    (the default for ESS): tolerance-ESS identical to an exact SVD's at every cut,
             except where a singular value lies within 1e-6 (relative) of tau; entropy-ESS
             and causal ESS within 1e-5 (relative). Float64 eigenvalues of Grams (dense
             units) and of Gramians (diagonal recurrences, core/gramian_naive.py) meet it;
             they resolve a singular value only down to about sqrt(error), i.e. 1e-7 to 1e-6
             of sigma_1, which no count at tau = 1e-3 sigma_1 and no entropy reads.
    "exact"  every singular value within 1e-6 sigma_k + 1e-10 sigma_1 of an SVD of the cut:
             the square-root sweeps, and SVDs of every cut the Gram guard does not pass.
             The reference in the tests, and the route for spectra drawn far below tau.

Why the guard reads tau: a route whose eigenvalues lambda_k = sigma_k^2 carry an absolute
error e moves a singular value near tau by about e / (2 tau). The count at tau is therefore
certain, to the contract's 1e-6 relative band, when e <= 2e-6 tau^2. The smallest tau any
scope can use is tol * sigma_1 of the cut itself (a relative tolerance: "unit" and "layer"
refer to a larger sigma_1) or tol (an absolute one), so the guard checks that one. A cut
that fails it is computed by the exact route.

The same bound keeps the values a view draws within the contract: |s - sigma| <= e / sigma,
at most sqrt(2 TAU_BAND) tau_min (the `resolution`) for every value above it. A cut whose
error is larger (up to WINDOW_ERROR sigma_1^2) still counts exactly where no computed
eigenvalue lies within that error of tau^2: every true one is then on the same side of tau^2
as its estimate. This needs tau itself, so it applies where tau is the cut's own (scope "cut",
or an absolute tolerance). It certifies counts, not values: its values near the resolution may
be off by several times what the contract allows (an absolute tolerance of 1e-4 against
sigma_1 near 1 showed 3.9x), so it serves only the routes whose values are not kept (causal
ESS, core/causal.py); the routes whose spectra are kept and drawn (core/gramian.py,
core/row_scaled.py) redo every cut past the strict bound exactly.

Entropy-ESS reads the whole spectrum, so the values a route cannot resolve (those whose squares
lie within its error of zero) move it by whatever entropy they carry. Mostly that is little
(measured: 2e-7 on Mamba-like channels, 4e-9 on attention heads; on layer 0 of a random
Mamba-130m at L = 512, 2.6e-6 at the worst of its 784,896 cuts, where a Cholesky shift of
N eps tr P instead of eps tr P gave 1.008e-5: the shift sets that noise floor,
core/gramian_naive.py). But a cut with one dominant value and hundreds below the route's
resolution has its entropy made of them: a head with all its weight on token 0 at L = 1024
(1.1e-5 off), a Mamba2-like head whose inputs are all written along one direction of its state
(2e-5). `Accuracy.resolves_entropy` therefore sends to the exact route every cut whose computed
unresolved values carry more than NOISE_ENTROPY of entropy (nats: about the relative change of
entropy-ESS), half the contract's 1e-5, which leaves the other half to the routes' rounding
(measured at 1.2e-6 at most). It reads the values as computed, which is what went wrong in those
cases (rounding lifts values whose true size is far below the route's resolution): their
entropy is then at most what they carry as computed; a true value that rounding pushed down to
zero it cannot see, and none was found. It reads the values within the route's actual noise
floor, not its error bound: GRAM_NOISE (core/gram.py) for a Gram (the dense path and
core/row_scaled.py), GRAMIAN_NOISE (core/gramian_naive.py) for the Gramians; the bounds would
redo a third of a Mamba2 layer's channel cuts, values the routes do resolve. At the floors no
cut is redone among a random GPT-2-small's at L = 512, a Mamba-130m-shaped layer's at
L = 1024, layer 0 of a random Mamba2-130m at L = 256, or trained-like heads' at L = 1024.

Values past the structural rank are exactly zero and set so.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..options import DEFAULT_PRECISION, PRECISIONS

# No torch import: the CLI builds its --precision choices from here before torch loads.

__all__ = ["PRECISIONS", "DEFAULT_PRECISION", "Accuracy", "check_precision", "TAU_BAND", "ROUNDOFF"]

TAU_BAND = 1e-6  # the contract's band around tau within which a count may differ
ROUNDOFF = 1e-13  # below this times sigma_1 a singular value is float64 round-off, not signal
WINDOW_ERROR = 1e-10  # the largest error (relative to sigma_1^2) the window test accepts
NOISE_ENTROPY = 5e-6  # the entropy (nats) unresolved values may carry: half the contract (`Accuracy.resolves_entropy`)
# `squares_underflow`'s margin over sqrt(tiny / eps): it covers sums of up to a million squared
# terms. Float64: cuts with sigma_1 below about 1e-70.
UNDERFLOW_MARGIN = 1e6


def check_precision(precision: str) -> str:
    """The one place that accepts a precision name; anything else is a ValueError."""
    if not (isinstance(precision, str) and precision in PRECISIONS):
        raise ValueError(
            f"precision must be one of {', '.join(map(repr, PRECISIONS))}; got {precision!r} "
            "('ess': fast, every ESS as an exact SVD would give it; 'exact': every singular value exact)"
        )
    return precision


@dataclass(frozen=True)
class Accuracy:
    """What the spectra will be read for: the contract, and the tolerance that counts them.

    precision "exact" asks every route for exact spectra; "ess" lets the fast routes answer
    where `certain` says their error cannot change a count (module docstring)."""

    precision: str = DEFAULT_PRECISION
    tol: float = 1e-3
    relative: bool = True
    scope: str = "cut"  # "cut" lets `certain` test the window around the cut's own tau

    def __post_init__(self):
        check_precision(self.precision)

    @property
    def fast(self) -> bool:
        return self.precision == "ess"

    @property
    def resolution(self) -> float:
        """How far a kept singular value may be from the exact one under this contract: that
        times sigma_1 of its cut (a relative tolerance) or absolute; 0 for "exact" (whose
        1e-6 sigma_k + 1e-10 sigma_1 is the SVD's own). From `certain`: |s^2 - sigma^2| <= e
        gives |s - sigma| <= sqrt(e) <= sqrt(2 TAU_BAND) tau_min."""
        return (2 * TAU_BAND) ** 0.5 * float(self.tol) if self.fast else 0.0

    def drawn_floor(self) -> tuple[float, float]:
        """(relative, absolute): a kept singular value below max(relative * sigma_1, absolute)
        is neither drawn (views/) nor checked (verification.py). Float64 round-off under both
        contracts; under "ess" its resolution too (a value there may be off by as much as
        itself), so that what is drawn is exact where drawn."""
        if self.relative:
            return max(ROUNDOFF, self.resolution), 0.0
        return ROUNDOFF, self.resolution

    def smallest_tau(self, top):
        """The smallest tau any scope can count a cut at whose largest eigenvalue is ``top``
        (sigma_1^2): tol sigma_1 of the cut itself, or tol where the tolerance is absolute."""
        return self.tol * top.clamp_min(0).sqrt() if self.relative else top.new_full(top.shape, float(self.tol))

    def shifted_error(self, top, rounding, shift):
        """The error `certain` reads for a route whose eigenvalues carry ``rounding`` and whose
        singular values were each moved by at most ``shift`` before it (Weyl: a perturbation
        of the matrix of that 2-norm): a value s within shift of sigma near tau has
        |s^2 - tau^2| <= (2 tau + shift) shift whenever it could cross tau, so the shift costs
        that, not the (2 sigma_1 + shift) shift it costs at sigma_1, a thousand times more at
        tol = 1e-3."""
        return rounding + (2 * self.smallest_tau(top) + shift) * shift

    def certain(self, top, error, values=None):
        """Where a cut whose largest eigenvalue is ``top`` (sigma_1^2) and whose eigenvalues
        carry the absolute error ``error`` (same shape) counts exactly: error <= 2e-6 tau_min^2
        (which also keeps its values within the resolution), or, given all its eigenvalues
        ``values`` (..., K) and a tau of its own, none of them within ``error`` of tau^2 (the
        count alone: give ``values`` only where the values are not kept; module docstring)."""
        tau_squared = self.smallest_tau(top) ** 2
        underflow = squares_underflow(top)
        sure = error.isfinite() & (error <= 2 * TAU_BAND * tau_squared) & ~underflow
        if values is None or (self.relative and self.scope != "cut") or bool(sure.all()):
            return sure
        # the window test, where it can help
        maybe = ~sure & ~underflow & error.isfinite() & (error <= WINDOW_ERROR * top)
        near = ((values[maybe] - tau_squared[maybe][..., None]).abs() <= error[maybe][..., None]).any(-1)
        sure[maybe] = ~near
        return sure

    def resolves_entropy(self, squares, error):
        """Where the values of a cut whose squares ``squares`` (..., K) lie within the route's
        ``error`` (...) of zero, the ones it cannot resolve, carry at most NOISE_ENTROPY of its
        entropy -sum p log p (p = sigma / sum(sigma)), so that entropy-ESS stays well within the
        contract's 1e-5 (module docstring)."""
        return unresolved_entropy(squares, error) <= NOISE_ENTROPY


def squares_underflow(top):
    """Where a cut whose largest square is ``top`` (sigma_1^2, any shape) is too small for a
    route that squares its values (a Gram, a Gramian: entries of order sigma_1^2), since it
    squares them again: in its error bound, a Frobenius norm (torch's and the kernels' alike
    sum squares unscaled), and in the Gramian kernel's Sturm count (its tridiagonal's
    off-diagonal). Below UNDERFLOW_MARGIN sqrt(tiny / eps) (tiny: the smallest normal number)
    those squares have lost their relative precision to underflow, or are zero, and a bound of
    zero certifies nothing (a Mamba channel whose inputs are written near 1e-90 had P_t near
    1e-180, an error bound of 0 and causal ESS up to 4 too high); below about tiny / eps so
    have the values' own squares (a reset of decay 1e-200 leaves a cut near 1e-200, its
    squares at 0). Such a cut goes to a route that works on the values themselves (an SVD,
    a square-root sweep), which keeps them down to about 1e-300: ESS counts them against the
    cut's own sigma_1 like any other. An all-zero cut goes there too, and an SVD gives it
    zeros."""
    import torch  # loaded by then: ``top`` is a tensor (this module is imported before torch)

    info = torch.finfo(top.dtype)
    return top < UNDERFLOW_MARGIN * (info.tiny / info.eps) ** 0.5


def zero_subnormal_cuts(sigma):
    """``sigma`` (..., K), each row a cut's values in descending order, with every row whose
    largest value lies below its dtype's smallest normal number (float64: 2.2e-308) set to
    zero. There a value keeps fewer than its dtype's bits (float64 spaces them 4.9e-324
    apart: 2e-3 relative at 2e-321), the cut's entries have lost as much, and the routes that
    multiply through a realisation's factors lose the rest (the sweep read a Mamba2 channel's
    cut of sigma_1 = 2.25e-321 as zero, where its SVD counted one value). Every route and the
    verification read such a cut as zero, so no answer depends on the route; a cut whose
    sigma_1 is normal keeps every value, however small (docs/spectra.md). Rows already zero
    (cut 0, padding) are left alone, so the common case copies nothing (filling them copied
    every spectrum: 5% of two Mamba2 layers' time at L = 256 on one thread)."""
    import torch  # loaded by then: ``sigma`` is a tensor

    top = sigma[..., :1]
    below = (top < torch.finfo(sigma.dtype).tiny) & (top > 0)
    return sigma.masked_fill(below, 0.0) if bool(below.any()) else sigma


def unresolved_entropy(squares, error):
    """`unresolved_entropy_reference` by the compiled kernel where it applies (a large float64
    job on a CPU with numba: core/entropy_kernel.py), else by the reference."""
    from . import entropy_kernel  # torch is loaded by then: ``squares`` is a tensor

    if entropy_kernel.applies(squares):
        return entropy_kernel.unresolved_entropy(squares, error)
    return unresolved_entropy_reference(squares, error)


def unresolved_entropy_reference(squares, error):
    """The entropy (nats) that the values sigma with 0 < sigma^2 = ``squares`` (..., K,
    descending) <= ``error`` (...) contribute to -sum p log p, p = sigma / sum(sigma): (...).
    Only the cuts whose smallest square is within the error can hold any (the zeros past a
    cut's rank count too), so only theirs are computed: 5% of a Mamba-130m-shaped layer's at
    L = 1024 (0.1 s for all of them -> 0.03 s)."""
    out = squares.new_zeros(squares.shape[:-1])
    rows = squares[..., -1] <= error
    if bool(rows.any()):
        some, within = squares[rows], error[rows][..., None]
        sigma = some.clamp_min(0).sqrt()
        p = sigma / sigma.sum(-1, keepdim=True).clamp_min(1e-300)
        out[rows] = -p.xlogy(p).masked_fill_((some > within) | (some <= 0), 0.0).sum(-1)
    return out


EXACT = Accuracy("exact")
