"""Numbers behind the teaching notebook (notebooks/01_what_is_ess.ipynb), kept out of it.

Tensors and tables only (the charts are in views/teaching_charts.py):

* ``lti_ssm``: a time-invariant diagonal recurrence (S4-like) with known decays;
* ``realisation_factors``: the two factors ``H_t = O_t R_t`` of a diagonal recurrence
  at one cut (the argument that a state of size n bounds ``rank(H_t)`` by n);
* ``truncation_errors``: the Eckart-Young table, the worst-case error of the best state of
  size m at one cut;
* ``attainable_ceiling``: ``min(TSS, t, L - t)``, the most ESS a unit can reach at t
  (core/diagnostics.py, re-exported here);
* ``memory_at_cut``: per layer, total ESS, TSS and ceiling (in scalars) at one cut of an ESSResult;
* ``recall_answers``: what a causal LM answers at the queried positions of a recall prompt.

Conventions are the package's (``ess_explorer.result.CONVENTION``): 0-based time,
``H_t = T[t:, :t]`` (past inputs u_0..u_{t-1} -> outputs y_t..y_{L-1}), diagonal excluded.
"""

from __future__ import annotations

import numpy as np
import torch

from .core.diagnostics import attainable_ceiling
from .core.operators import DiagonalSSM

IGNORE = -100  # label of a position that asks nothing (the causal-LM convention)


def lti_ssm(length: int, n: int, decay: float, seed: int = 4) -> DiagonalSSM:
    """A time-invariant diagonal SSM, batch (1,): n modes with decays spread evenly over
    (0, decay] (``decay * linspace(1, 1/n, n)``), random b and c drawn with ``seed``.

    Its Hankel singular values fall off geometrically, so tolerance-ESS stays below n.
    """
    if not 0 < decay < 1:
        raise ValueError(f"decay must lie in (0, 1) for a stable recurrence, got {decay}")
    if n < 1 or length < 2:
        raise ValueError(f"need n >= 1 and length >= 2, got n={n}, length={length}")
    g = torch.Generator().manual_seed(seed)
    modes = decay * torch.linspace(1.0, 1.0 / n, n, dtype=torch.float64)
    a = modes.expand(length, n).clone()
    b = torch.randn(n, generator=g, dtype=torch.float64).expand(length, n).clone()
    c = torch.randn(n, generator=g, dtype=torch.float64).expand(length, n).clone()
    return DiagonalSSM(a[None], b[None], c[None])


def realisation_factors(ssm: DiagonalSSM, t: int, index: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """(O_t, R_t) of the recurrence h_i = a_i * h_{i-1} + b_i u_i, y_i = c_i . h_i at cut t.

    R_t (N, t): column j is the state after step t - 1 left by input u_j,
    ``(prod_{s=j+1}^{t-1} a_s) * b_j``. O_t (L - t, N): row i - t maps that state to y_i,
    ``c_i * prod_{s=t}^{i} a_s``. Then ``O_t @ R_t == T[t:, :t]``. ``index``: which
    operator of a batched ssm (flat index over its batch shape).
    """
    length = ssm.length
    if not 1 <= t <= length - 1:
        raise ValueError(f"the cut t must lie in 1..L-1 = 1..{length - 1}, got {t}")
    a, b, c = (x.reshape(-1, length, x.shape[-1])[index] for x in (ssm.a, ssm.b, ssm.c))
    reach = torch.stack([torch.prod(a[j + 1 : t], dim=0) * b[j] for j in range(t)], dim=1)
    observe = torch.stack([c[i] * torch.prod(a[t : i + 1], dim=0) for i in range(t, length)], dim=0)
    return observe, reach


def truncation_errors(H: torch.Tensor, max_state: int) -> list[dict]:
    """The best state of m numbers at one cut, m = 0..max_state (Eckart-Young).

    H (rows, cols) is a cut ``H_t``. For each m: ``worst`` = the spectral norm of
    ``H - H_m`` with ``H_m`` the rank-m SVD truncation (the worst error over unit-norm
    pasts), and ``sigma_next`` = sigma_{m+1}(H) (0 past the rank). Eckart-Young says the two
    are equal and that no other state of m numbers does better.
    """
    U, S, Vh = torch.linalg.svd(H, full_matrices=False)
    rows = []
    for m in range(max_state + 1):
        H_m = U[:, :m] @ torch.diag(S[:m]) @ Vh[:m]
        worst = float(torch.linalg.matrix_norm(H - H_m, ord=2))
        rows.append({"state size m": m, "worst-case error": worst, "sigma_{m+1}": float(S[m]) if m < len(S) else 0.0})
    return rows


def memory_at_cut(result, t: int) -> list[dict]:
    """Per layer of an ESSResult at cut t: family, units, and the layer totals in scalars
    (sum over units of multiplicity x value, docs/conventions.md) of tolerance-ESS,
    entropy-ESS, TSS and the attainable ceiling."""
    rows = []
    for index, lay in sorted(result.layers.items()):
        column = {int(p): k for k, p in enumerate(np.asarray(lay.positions))}
        if int(t) not in column:
            raise ValueError(f"layer {index}: the cut t = {t} was not computed (positions {lay.positions[:3]}...)")
        k = column[int(t)]
        weight = np.asarray(lay.multiplicity, dtype=np.float64)
        rows.append(
            {
                "layer": index,
                "family": lay.family,
                "units": int(lay.n_units),
                "ESS": float(lay.total("tolerance")[k]),
                "entropy-ESS": float(lay.total("entropy")[k]),
                "TSS": float(lay.total_tss()[k]),
                "ceiling": float(weight @ attainable_ceiling(lay)[:, k]),
            }
        )
    return rows


@torch.no_grad()
def recall_answers(model, input_ids: torch.Tensor, labels: torch.Tensor) -> dict:
    """What a causal LM answers where ``labels`` asks something (labels != -100).

    input_ids, labels: (L,) or (1, L). The answer at position p is the arg-max of the
    logits at p - 1. Returns positions (Q,), predicted (Q,), target (Q,) ids and
    correct (Q,) booleans, as numpy arrays.
    """
    ids = torch.as_tensor(input_ids).reshape(1, -1)
    lab = torch.as_tensor(labels).reshape(1, -1)
    if ids.shape != lab.shape:
        raise ValueError(f"input_ids {tuple(ids.shape)} and labels {tuple(lab.shape)} must have one shape")
    logits = model(input_ids=ids).logits  # (1, L, V)
    positions = torch.nonzero(lab[0] != IGNORE).flatten()
    if len(positions) and int(positions.min()) == 0:
        raise ValueError("position 0 cannot be asked: nothing precedes it")
    predicted = logits[0, positions - 1].argmax(-1)
    target = lab[0, positions]
    return {
        "positions": positions.numpy(),
        "predicted": predicted.numpy(),
        "target": target.numpy(),
        "correct": (predicted == target).numpy(),
    }
