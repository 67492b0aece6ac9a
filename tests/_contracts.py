"""The "exact" accuracy contract as the tests assert it: every value within
1e-6 sigma_k + 1e-10 sigma_1 of its own cut's exact value (the bound that
`ess_explorer.verification` checks a result against). Torch tensors or numpy arrays."""

from __future__ import annotations

from ess_explorer.verification import EXACT_ABSOLUTE, EXACT_RELATIVE


def assert_exact_contract(values, exact) -> None:
    """``values`` against ``exact`` ones of the same shape (..., K), descending per cut."""
    error = abs(values - exact)
    past = error - (EXACT_RELATIVE * exact + EXACT_ABSOLUTE * exact[..., :1])
    assert bool((past <= 0).all()), f"a value is {float(past.max()):.3g} past the exact contract"


def assert_spectra_match(factored, dense) -> None:
    """A factored path's spectra (..., N) against the dense SVD's (..., K): the dense values
    past N are rounding (within 1e-10 sigma_1), the first N within the exact contract."""
    width = factored.shape[-1]
    assert bool((dense[..., width:] <= EXACT_ABSOLUTE * dense[..., :1] + 1e-300).all()), "dense has more modes than N"
    assert_exact_contract(factored, dense[..., :width])
