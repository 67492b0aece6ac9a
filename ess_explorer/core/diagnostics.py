"""Capacity (TSS), utilisation and the memory diagnostics of docs/math.md.

The paper gives no numeric thresholds; ours are parameters with documented defaults:
a unit is *saturated* when its utilisation >= 0.9 (it uses all the memory it could and may
need more) and *collapsed* when it is <= 0.1 (capacity left unused).

Utilisation of a unit over a prompt is a ratio of peaks over time: max_t ESS(t) against the
peak of what it is judged by (``reduce="mean"``: the means instead). Not the peak of the
ratio: at t = 1 every generic head has ESS = 1 = its capacity, so max_t of ESS(t)/TSS(t)
would call all attention saturated. What it is judged by (``against``):

- ``"ceiling"`` (the default): the attainable ceiling min(TSS(t), t, L - t) (`attainable_ceiling`).
  H_t has t columns and L - t rows, so no unit of any family can exceed it. A softmax head
  that uses all it can scores 1 (saturated), whatever the prompt length.
- ``"tss"``: TSS alone, the paper's ESS/TSS. Attention's TSS = t reaches L - 1 while its ESS
  cannot pass about L/2, so by this ratio attention is never saturated (a full-rank head
  scores about (L/2) / (L-1) = 0.5) and collapses more easily on longer prompts.
For a recurrent unit with L >= 2 N the two agree (both peaks are N).

Modulation at separators (one definition, `separator_modulation`, used by the layer
diagnostics, the explorer, the report, the zoo cards and claim, and the sweep statistics):

    modulation = 1 - min_{t in sep..sep+lag} X(t) / mean_{t in the window cuts before sep} X(t)

where X(t) is the layer total in scalars, sum over units of multiplicity x the unit's value
at the cut t (the aggregation over units); window = MODULATION_WINDOW = 4, lag =
MODULATION_LAG = 1 (a trained model may drop its state on the separator or on the token after
it). 0 means no drop, 1 means the past is emptied. docs/math.md notes that ESS already dips
*before* EOS because fewer future outputs remain; comparing with the cuts just before the
separator measures the extra drop. Over layers, a model's modulation is that of its
`strongest_layer` (the layer that resets is the one that carries the memory). Two values X:

- the **count** (`layer_modulation(..., measure="count")`, the default): tolerance-ESS at the reset-aware scope
  MODULATION_SCOPE = "unit" (tau = tol x the largest sigma_1 over the unit's cuts). With the
  per-cut scope a near-reset is invisible: a decay scaled by 1e-4 at the separator scales the
  whole cut H_sep by 1e-4, which a per-cut relative tolerance cancels, so the per-cut
  modulation is that of the operator without the reset (negative while ESS still grows;
  docs/conventions.md). Entropy-ESS has the same blindness (p = sigma / sum sigma). A count
  only falls when a direction drops below tau: a past scaled by 0.26 keeps every direction
  above 1e-3 and the count does not move.
- the **graded** modulation (`measure="graded"`): X = the nuclear norm of the cut,
  sum_k sigma_k(H_t), scale-aware by construction (no tolerance, no scope). A separator that
  scales the whole past by c scales ||H_sep||_* by c, so the graded modulation reads a partial
  reset as a partial drop (about 1 - c when the cuts before are dominated by their near past;
  its exact value for a diagonal SSM is in tests/test_modulation.py).
"""

from __future__ import annotations

import numpy as np

from .ess import DEFAULT_TOL, MODULATION_SCOPE, check_scope, check_variant

__all__ = [
    "FAMILIES",
    "SATURATED_AT",
    "COLLAPSED_AT",
    "unit_kind",
    "theoretical_state_size",
    "utilisation",
    "attainable_ceiling",
    "AGAINST",
    "classify_utilisation",
    "layer_diagnostics",
    "MODULATION_WINDOW",
    "MODULATION_LAG",
    "modulation_at",
    "MODULATION_MEASURES",
    "units_total",
    "separator_modulation",
    "cut_nuclear_norms",
    "modulation_values",
    "layer_modulation",
    "strongest_layer",
]

MODULATION_WINDOW = 4  # cuts before the separator that give the reference
MODULATION_LAG = 1  # the drop may come on the separator or on the token after it
MODULATION_MEASURES = ("count", "graded")  # tolerance-ESS at the reset-aware scope; nuclear norm

SATURATED_AT = 0.9
COLLAPSED_AT = 0.1
# What utilisation divides by (module docstring): the attainable ceiling (default) or TSS.
AGAINST = ("ceiling", "tss")

# family -> (unit kind, what its capacity is); one line each so the table reads as docs.
FAMILIES = {
    "softmax_attention": ("head", "t: the KV cache holds every past token (min(t, window - 1) with a sliding window)"),
    "chunked_attention": ("head", "t mod C: the past tokens of the current chunk of length C"),
    "linear_attention": ("head", "d_k: the key size"),
    "gated_linear_attention": ("head", "d_k: the key size"),
    "mamba": ("channel", "N: d_state"),
    "mamba2": ("head", "N: d_state (shared by the head's channels)"),
    "lti_ssm": ("channel", "N: the state size"),
    "short_conv": ("channel", "k - 1: kernel length minus one"),
    "gated_deltanet": ("head", "d_k: the key size (the state each of the head's d_v value channels carries)"),
    "kda": ("head", "d_k: the key size (the state each of the head's d_v value channels carries)"),
    "rg_lru": ("channel", "1: one scalar state per channel (RG-LRU)"),
    "lightning_attention": ("head", "d_k: the key size (linear attention with a per-head decay)"),
    "rwkv": ("channel", "1: the WKV numerator state per channel (the denominator is T's row scale)"),
    "mlstm": ("head", "d_k: the key size of the matrix memory (the normaliser is T's row scale)"),
}


def unit_kind(family: str) -> str:
    """What one unit of a family is: "head" or "channel" ("unit" for an unknown family)."""
    return FAMILIES[family][0] if family in FAMILIES else "unit"


def theoretical_state_size(
    family: str,
    positions,
    *,
    state_size: int | None = None,
    window: int | None = None,
    kernel_size: int | None = None,
) -> np.ndarray:
    """TSS of one unit at each cut t in ``positions``: shape (P,), float.

    Only softmax attention has a capacity that depends on t; every recurrent family has a
    fixed state. Raises ValueError for an unknown family or a missing size.
    """
    if family not in FAMILIES:
        raise ValueError(f"unknown family {family!r}; known: {sorted(FAMILIES)}")
    t = np.asarray(positions, dtype=np.float64)
    if family == "softmax_attention":
        return np.minimum(t, window - 1) if window else t.copy()
    if family == "chunked_attention":
        if not window or window < 1:
            raise ValueError("chunked_attention needs window (the chunk length C)")
        return np.mod(t, window)
    if family == "short_conv":
        if not kernel_size or kernel_size < 1:
            raise ValueError("short_conv needs kernel_size (the conv length, e.g. config.conv_L_cache)")
        return np.full_like(t, kernel_size - 1)
    if not state_size or state_size < 1:
        raise ValueError(f"{family} needs state_size (d_k or d_state)")
    return np.full_like(t, state_size)


def utilisation(ess, tss) -> np.ndarray:
    """ESS / TSS elementwise, 0 where TSS is 0."""
    ess = np.asarray(ess, dtype=np.float64)
    tss = np.broadcast_to(np.asarray(tss, dtype=np.float64), ess.shape)
    return np.divide(ess, tss, out=np.zeros_like(ess), where=tss > 0)


def attainable_ceiling(layer, variant: str = "tolerance") -> np.ndarray:
    """(U, P) min(TSS(t), t, L - t) of a LayerESS: the most ESS a unit can have at each cut.

    ``rank_bound`` is min(t, L - t) (the shape of H_t), capped by the operator's own rank
    limit where it has one, so the minimum with TSS is the ceiling. Causal ESS counts the
    reachability factor R_t (state x t), not H_t: no L - t bounds it (a softmax head's is t),
    so its ceiling is min(TSS(t), t).
    """
    tss = np.asarray(layer.tss, dtype=np.float64)
    if check_variant(variant) == "causal":
        return np.minimum(tss, np.asarray(layer.positions, dtype=np.float64)[None, :])
    return np.minimum(tss, np.asarray(layer.rank_bound, dtype=np.float64))


def check_against(against: str) -> str:
    if against not in AGAINST:
        raise ValueError(f"against must be one of {list(AGAINST)}, got {against!r}")
    return against


def classify_utilisation(value, saturated: float = SATURATED_AT, collapsed: float = COLLAPSED_AT):
    """'saturated' (>= saturated), 'collapsed' (<= collapsed) or 'normal'; elementwise for arrays."""
    if not 0 <= collapsed < saturated:
        raise ValueError(f"need 0 <= collapsed < saturated, got collapsed={collapsed}, saturated={saturated}")
    value = np.asarray(value, dtype=np.float64)
    labels = np.where(value >= saturated, "saturated", np.where(value <= collapsed, "collapsed", "normal"))
    return labels.item() if labels.ndim == 0 else labels


def _reduce_time(values: np.ndarray, reduce: str, valid: np.ndarray) -> np.ndarray:
    """max or mean over t (the last axis) of the valid cuts; 0 for a unit with none."""
    if reduce not in ("max", "mean"):
        raise ValueError(f"reduce must be 'max' or 'mean', got {reduce!r}")
    kept = np.where(valid, values, 0.0)  # ESS and TSS are >= 0, so 0 never wins a max
    if reduce == "max":
        return kept.max(-1, initial=0.0)
    count = valid.sum(-1)
    return np.divide(kept.sum(-1), count, out=np.zeros(values.shape[:-1]), where=count > 0)


def layer_diagnostics(
    layer,
    *,
    variant: str = "tolerance",
    reduce: str = "max",
    saturated: float = SATURATED_AT,
    collapsed: float = COLLAPSED_AT,
    against: str = "ceiling",
) -> dict:
    """Per-unit and per-layer utilisation and flags for one LayerESS.

    ``against`` "ceiling" (default) judges each unit against its attainable ceiling, "tss"
    against TSS (the paper's ratio; module docstring). Cuts where TSS is 0 (t = 0) are left
    out. Returns a dict with per-unit arrays ``unit_utilisation`` (U,), ``unit_state`` (U,)
    labels, and layer summaries ``utilisation`` (mean over units), ``state`` (its label),
    ``n_saturated``, ``n_collapsed``, ``mean_ess``, ``total_ess`` and ``total_tss`` (at the
    peak cut); both ratios whatever ``against`` says: ``ceiling_utilisation`` and
    ``tss_utilisation`` (mean over units), with the means over units of the peaks they
    divide, ``peak_ess``, ``peak_ceiling`` and ``peak_tss`` (``reduce`` over t).
    ``variant`` "causal" reads the stored causal ESS (NaN for units without a realisation,
    which then give NaN summaries).
    Totals count scalars, so they compare across families (docs/conventions.md): ESS weighs
    each unit by its ``multiplicity`` (the channels that share its T; 1 when the layer has
    none), TSS by its ``state_weight`` (the state it stands for: softmax attention's KV cache;
    the multiplicity when the layer has none).
    """
    check_variant(variant)
    check_against(against)
    ess = {
        "tolerance": layer.tolerance_ess,
        "entropy": layer.entropy_ess,
        "causal": getattr(layer, "causal_ess", None),
    }[variant]
    if ess is None:
        raise ValueError("this layer has no causal ESS")
    ess = np.asarray(ess, dtype=np.float64)
    tss = np.asarray(layer.tss, dtype=np.float64)
    valid = tss > 0
    peaks = {
        "ess": _reduce_time(ess, reduce, valid),
        "tss": _reduce_time(tss, reduce, valid),
        "ceiling": _reduce_time(attainable_ceiling(layer, variant), reduce, valid),
    }
    ratios = {name: utilisation(peaks["ess"], peaks[name]) for name in AGAINST}
    unit_util = ratios[against]
    states = classify_utilisation(unit_util, saturated, collapsed)
    layer_util = float(unit_util.mean()) if unit_util.size else 0.0
    weight = np.asarray(
        getattr(layer, "multiplicity", None)
        if getattr(layer, "multiplicity", None) is not None
        else np.ones(ess.shape[0]),
        dtype=np.float64,
    )[:, None]
    total_ess = (weight * ess).sum(0)
    state_weight = getattr(layer, "state_weight", None)
    tss_weight = weight if state_weight is None else np.asarray(state_weight, dtype=np.float64)[:, None]
    return {
        "variant": variant,
        "reduce": reduce,
        "against": against,
        "thresholds": {"saturated": saturated, "collapsed": collapsed},
        "unit_utilisation": unit_util,
        "unit_state": np.atleast_1d(states),
        "utilisation": layer_util,
        "state": classify_utilisation(layer_util, saturated, collapsed),
        "n_saturated": int(np.sum(np.atleast_1d(states) == "saturated")),
        "n_collapsed": int(np.sum(np.atleast_1d(states) == "collapsed")),
        **{f"{name}_utilisation": float(ratio.mean()) if ratio.size else 0.0 for name, ratio in ratios.items()},
        **{f"peak_{name}": float(peak.mean()) if peak.size else 0.0 for name, peak in peaks.items()},
        "mean_ess": float(ess[:, valid.any(0)].mean()) if valid.any() else 0.0,
        "total_ess": float(total_ess.max()) if total_ess.size else 0.0,
        "total_tss": float((tss_weight * tss).sum(0).max()) if tss.size else 0.0,
    }


def modulation_at(
    ess_over_time, positions, separators, window: int = MODULATION_WINDOW, lag: int = MODULATION_LAG
) -> np.ndarray:
    """Modulation score at each separator: 1 - X(after) / mean(X over the window before),
    where X(after) is the lowest X at sep..sep+lag (lag = 0 looks at the separator only).
    The arithmetic of the one definition (`separator_modulation` sums units first).

    ess_over_time: (..., P) values aligned with ``positions`` (the t of each column).
    separators: iterable of t. Returns (..., S); NaN where no earlier position exists or
    the value before the separator is 0 (nothing to drop).
    """
    if lag < 0:
        raise ValueError(f"lag must be >= 0, got {lag}")
    ess = np.asarray(ess_over_time, dtype=np.float64)
    positions = np.asarray(positions)
    column = {int(t): i for i, t in enumerate(positions)}
    if window < 1:
        raise ValueError(f"window must be >= 1, got {window}")
    scores = []
    for sep in separators:
        sep = int(sep)
        if sep not in column:
            raise ValueError(
                f"separator position {sep} was not computed (positions cover {positions.min()}..{positions.max()})"
            )
        before = [column[t] for t in range(sep - window, sep) if t in column and t > 0]
        if not before:
            scores.append(np.full(ess.shape[:-1], np.nan))
            continue
        ref = ess[..., before].mean(-1)
        with np.errstate(all="ignore"):
            after = ess[..., [column[t] for t in range(sep, sep + lag + 1) if t in column]].min(-1)
            scores.append(np.where(ref > 0, 1.0 - after / ref, np.nan))
    return np.stack(scores, axis=-1) if scores else np.zeros(ess.shape[:-1] + (0,))


def units_total(per_unit, multiplicity) -> np.ndarray:
    """(P,) the layer total in scalars of a per-unit value (U, P): sum over units of
    multiplicity x value (``multiplicity`` (U,) or None: each unit 1)."""
    values = np.atleast_2d(np.asarray(per_unit, dtype=np.float64))
    weight = np.ones(values.shape[0]) if multiplicity is None else np.asarray(multiplicity, dtype=np.float64)
    if weight.shape != (values.shape[0],):
        raise ValueError(f"multiplicity must have one value per unit ({values.shape[0]}), got shape {weight.shape}")
    return (weight[:, None] * values).sum(0)


def separator_modulation(
    per_unit, multiplicity, positions, separators, *, window: int = MODULATION_WINDOW, lag: int = MODULATION_LAG
) -> np.ndarray:
    """(S,) THE modulation of one layer at each separator (module docstring): `modulation_at`
    of the layer total in scalars (`units_total`) of ``per_unit`` (U, P), the count at the
    reset-aware scope or the nuclear norm of each cut (`modulation_values` gives either)."""
    return modulation_at(units_total(per_unit, multiplicity), positions, separators, window=window, lag=lag)


def cut_nuclear_norms(layer) -> np.ndarray:
    """(U, P) nuclear norm sum_k sigma_k(H_t) of each cut of a LayerESS, from its kept singular
    values: exact where the spectrum is complete (``spectra_complete``), else a lower bound
    (the values left out are each below the smallest kept one)."""
    return np.asarray(layer.singular_values, dtype=np.float64).sum(-1)


def modulation_values(
    layer,
    measure: str = "count",
    *,
    tol: float = DEFAULT_TOL,
    relative: bool = True,
    scope: str = MODULATION_SCOPE,
    variant: str = "tolerance",
) -> np.ndarray:
    """(U, P) the per-unit value X whose layer total the modulation compares (module docstring).

    ``measure="count"``: tolerance-ESS recounted from the kept singular values at (tol,
    relative, scope) (``LayerESS.tolerance_ess_at``; sigma_1 is always kept, so the reference is
    exact, and a count that reaches the kept K is a lower bound); scope defaults to the
    reset-aware "unit"; with ``relative=False`` the scope is "cut" (an absolute tolerance has
    none); ``variant="entropy"`` takes the stored entropy-ESS (no scope).
    ``measure="graded"``: the nuclear norm of each cut (`cut_nuclear_norms`; no tolerance).
    """
    if measure not in MODULATION_MEASURES:
        raise ValueError(f"measure must be one of {list(MODULATION_MEASURES)}, got {measure!r}")
    if measure == "graded":
        return cut_nuclear_norms(layer)
    if variant not in ("tolerance", "entropy"):
        raise ValueError(f"variant must be 'tolerance' or 'entropy', got {variant!r}")
    scope = scope if relative else "cut"
    check_scope(scope, relative)
    if variant == "tolerance":
        return np.asarray(layer.tolerance_ess_at(tol, relative, scope)[0], dtype=np.float64)
    return np.asarray(layer.entropy_ess, dtype=np.float64)


def layer_modulation(
    layer,
    separators,
    *,
    measure: str = "count",
    window: int = MODULATION_WINDOW,
    lag: int = MODULATION_LAG,
    **count_options,
) -> np.ndarray:
    """(S,) modulation of one layer (a LayerESS) at each separator: `separator_modulation` of
    `modulation_values` (``measure`` "count": tolerance-ESS at the reset-aware scope, with the
    count's ``tol``, ``relative``, ``scope`` and ``variant`` as there; "graded": the nuclear norm
    of the cuts, which sees a partial reset the count cannot)."""
    values = modulation_values(layer, measure, **count_options)
    multiplicity = getattr(layer, "multiplicity", None)
    return separator_modulation(values, multiplicity, layer.positions, separators, window=window, lag=lag)


def strongest_layer(per_layer: dict):
    """The key of the largest finite value of ``per_layer`` ({layer: modulation}): the model's
    modulation is its strongest layer's. ValueError when no value is finite."""
    finite = {k: float(v) for k, v in per_layer.items() if v is not None and np.isfinite(v)}
    if not finite:
        raise ValueError("no layer has a finite modulation (no separator with earlier cuts of nonzero ESS)")
    return max(finite, key=finite.get)
