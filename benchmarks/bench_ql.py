"""The lane QL of core/tridiagonal_kernel.py against LAPACK, one core (prints; not a test).

    python benchmarks/bench_ql.py                 # n = 16, 64, 128, 256
    python benchmarks/bench_ql.py --sizes 16 32

For each kind of symmetric tridiagonal that the engine meets (Householder forms of Grams with
flat, graded, reverse-graded and rank-deficient spectra) and for classic hard ones (Wilkinson's
W+, glued Wilkinson matrices, Clement's matrix), 64 lanes at once: the kernel's time per 64
matrices, LAPACK's as the baseline (`dsterf`, the same root-free QL, one matrix at a time through
scipy, about a microsecond of Python per call included), their ratio, and the kernel's worst
eigenvalue error against dsterf's over the lanes, relative to each matrix's largest eigenvalue.
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # LAPACK's baseline on one core too, as the kernel
os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np  # noqa: E402
import scipy.linalg.lapack  # noqa: E402

from ess_explorer.core import compiled, gramian_kernel  # noqa: E402
from ess_explorer.core.compiled import LANES  # noqa: E402
from ess_explorer.core.tridiagonal_kernel import _tridiagonal_eigenvalues  # noqa: E402


def gram_forms(n: int, grade: float, rank: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(d, e) (n, LANES): the Householder forms of LANES Grams of rank ``rank`` whose rows decay
    by exp(-grade 16 i / n), trace one (the scale the callers give the QL)."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, rank, LANES)) * np.exp(-np.arange(n) * grade * 16 / n)[:, None, None]
    m = np.ascontiguousarray(np.einsum("ikw,jkw->ijw", x, x))
    m /= np.einsum("iiw->w", m)
    d, e, v, pv = (np.empty((n, LANES)) for _ in range(4))
    gramian_kernel._tridiagonal(m, n, d, e, v, pv)
    return d, e


def wilkinson(n: int) -> tuple[np.ndarray, np.ndarray]:
    half = (n - 1) // 2
    return np.abs(np.arange(-half, n - half)).astype(float), np.ones(n)


def classic_forms(kind: str, n: int) -> tuple[np.ndarray, np.ndarray]:
    """(d, e) (n, LANES), every lane the same matrix, scaled to unit absolute sum."""
    if kind == "wilkinson":
        d, e = wilkinson(n)
    elif kind == "glued wilkinson":  # blocks of W21+ joined by 1e-12
        d, e = (np.resize(x, n) for x in wilkinson(21))
        e[20::21] = 1e-12
    else:  # clement
        k = np.arange(1, n + 1)
        d, e = np.zeros(n), np.sqrt(k * (n - k).clip(min=0))
    e = e.copy()
    e[-1] = 0.0
    scale = np.abs(d).sum() + 2 * np.abs(e).sum()
    return np.repeat((d / scale)[:, None], LANES, 1), np.repeat((e / scale)[:, None], LANES, 1)


def dsterf(d: np.ndarray, e: np.ndarray) -> np.ndarray:
    """(LANES, n) ascending: LAPACK's dsterf of each lane."""
    out = np.empty((d.shape[1], d.shape[0]))
    for w in range(d.shape[1]):
        out[w], info = scipy.linalg.lapack.dsterf(d[:, w], e[:-1, w])
        assert info == 0
    return out


def best_of(fn, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def case(label: str, d: np.ndarray, e: np.ndarray, show: bool = True) -> None:
    n = d.shape[0]
    failed = np.zeros(LANES, dtype=np.bool_)

    def kernel() -> np.ndarray:
        values = d.copy()
        _tridiagonal_eigenvalues(values, e.copy(), n, failed)
        return values

    values = kernel()  # compiled or loaded here, not timed
    if not show:
        return
    exact = dsterf(d, e)
    error = np.abs(np.sort(values.T, axis=-1) - exact).max(-1) / np.abs(exact).max(-1)
    repeats = max(3, 20_000 // (n * n))
    ours = best_of(kernel, repeats)
    lapack = best_of(lambda: dsterf(d, e), repeats)
    print(
        f"  {label:<24} n = {n:4d}  kernel {ours * 1e3:8.3f} ms  dsterf {lapack * 1e3:8.3f} ms  "
        f"{lapack / ours:5.1f}x   worst error {error.max():.1e}{'  FAILED LANES' if failed.any() else ''}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[16, 64, 128, 256])
    args = parser.parse_args()
    if not compiled.available():
        raise SystemExit("numba is not installed: the lane QL does not run here (pip install numba)")
    case("", *gram_forms(8, 0.5, 24), show=False)
    print(f"lane QL, {LANES} tridiagonals per call, one core (best of several runs)")
    for n in args.sizes:
        for label, grade, rank in (
            ("flat Gram", 0.0, 3 * n),
            ("graded Gram", 0.5, 3 * n),
            ("steeply graded Gram", 3.0, 3 * n),
            ("reverse-graded Gram", -1.0, 3 * n),
            ("rank-5 Gram", 0.5, 5),
        ):
            case(label, *gram_forms(n, grade, rank))
        for kind in ("wilkinson", "glued wilkinson", "clement"):
            case(kind, *classic_forms(kind, n - (1 - n % 2)))


if __name__ == "__main__":
    main()
