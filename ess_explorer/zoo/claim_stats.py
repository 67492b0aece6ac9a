"""The statistics of the zoo's claim: correlations over (model, K) points, a bootstrap that
resamples the independent units (architectures, then training seeds within each), and the
multiple-testing corrections of every comparison that is run.

Resampling: the points of one trained model (its K values) move together, and the models of
one architecture differ only by their seed (initialisation and data stream), so a resample
draws architectures with replacement and, within each drawn architecture, its seeds with
replacement. With one seed per architecture the inner draw is the identity and this is the
bootstrap over architectures alone (``seeds_per_architecture`` states it).

Tests: each comparison is the difference Spearman(predictor, accuracy) - Spearman(TSS-based
predictor, accuracy); its two-sided bootstrap p-value is 2 (c + 1) / (n + 1), c the smaller
count of the n defined resamples on either side of 0 (never 0: at n = 2000, at least 0.001). Every test that is run is reported with its
Holm-adjusted p-value and its Bonferroni-widened interval (level 1 - alpha / m); a test
*holds* when the Holm-adjusted p is below alpha.
"""

from __future__ import annotations

import numpy as np
from scipy import stats

__all__ = ["correlations", "hierarchical_draws", "bootstrap", "holm", "corrected_tests"]

ALPHA = 0.05


def _stats(acc: np.ndarray, x: np.ndarray) -> dict:
    if len(acc) < 3 or np.ptp(x) == 0 or np.ptp(acc) == 0:
        return {"spearman": float("nan"), "pearson": float("nan"), "pearson_log10": float("nan")}
    return {
        "spearman": float(stats.spearmanr(x, acc)[0]),
        "pearson": float(stats.pearsonr(x, acc)[0]),
        "pearson_log10": float(stats.pearsonr(np.log10(np.maximum(x, 1e-12)), acc)[0]),
    }


def correlations(rows: list[dict], predictors) -> dict:
    """{predictor: {spearman, pearson, pearson_log10}} of accuracy over the given points;
    NaN where a predictor is missing from a point or constant."""
    acc = np.array([r["accuracy"] for r in rows], dtype=np.float64)
    out = {}
    for key in predictors:
        x = np.array([r.get(key, np.nan) for r in rows], dtype=np.float64)
        out[key] = _stats(acc, x) if np.isfinite(x).all() else _stats(acc[:0], x[:0])
    return out


def hierarchical_draws(rows: list[dict], n_boot: int, seed: int) -> tuple[list[list[int]], dict]:
    """``n_boot`` resamples of the point indices: architectures with replacement, then the
    seeds of each drawn architecture with replacement (a model's points together). Returns
    (draws, design) with design {"architectures": A, "seeds_per_architecture": {arch: n}}."""
    by_arch: dict[str, dict] = {}
    for i, r in enumerate(rows):
        by_arch.setdefault(r["architecture"], {}).setdefault(r["model"], []).append(i)
    archs = sorted(by_arch)
    rng = np.random.default_rng(seed)
    draws = []
    for _ in range(n_boot):
        sample: list[int] = []
        for a in rng.integers(0, len(archs), size=len(archs)):
            models = sorted(by_arch[archs[a]])
            for m in rng.integers(0, len(models), size=len(models)):
                sample.extend(by_arch[archs[a]][models[m]])
        draws.append(sample)
    design = {"architectures": len(archs), "seeds_per_architecture": {a: len(by_arch[a]) for a in archs}}
    return draws, design


def _interval(values: list, level: float) -> list:
    if not values:
        return [float("nan")] * 2
    q = [(1 - level) / 2 * 100, (1 + level) / 2 * 100]
    return [float(x) for x in np.percentile(values, q)]


def bootstrap(rows: list[dict], predictors, comparisons: dict, n_boot: int, seed: int, level: float = 0.95) -> dict:
    """Percentile intervals of every correlation and the bootstrap distribution of every
    comparison {name: (predictor, reference)} = Spearman(predictor) - Spearman(reference).

    Returns {"correlations": {predictor: {stat: [lo, hi]}}, "differences": {name: [draws]},
    "design": ..., "n_boot", "seed", "level", "resampled"}; undefined resamples (a constant
    column) are left out of each statistic.
    """
    draws, design = hierarchical_draws(rows, n_boot, seed)
    per_stat: dict = {k: {"spearman": [], "pearson": [], "pearson_log10": []} for k in predictors}
    differences: dict = {name: [] for name in comparisons}
    for pick in draws:
        corr = correlations([rows[i] for i in pick], predictors)
        for key, values in corr.items():
            for stat, v in values.items():
                if np.isfinite(v):
                    per_stat[key][stat].append(v)
        for name, (pred, ref) in comparisons.items():
            d = corr[pred]["spearman"] - corr[ref]["spearman"]
            if np.isfinite(d):
                differences[name].append(d)
    one_seed = all(n == 1 for n in design["seeds_per_architecture"].values())
    return {
        "correlations": {k: {s: _interval(v, level) for s, v in d.items()} for k, d in per_stat.items()},
        "differences": differences,
        "design": design,
        "resampled": "architectures (one seed each: no seed level)"
        if one_seed
        else "architectures, then seeds within each",
        "n_boot": n_boot,
        "seed": seed,
        "level": level,
    }


def holm(p_values: list[float]) -> list[float]:
    """Holm's step-down adjusted p-values (same order as given): the k-th smallest p times
    (m - k + 1), made non-decreasing, capped at 1."""
    p = np.asarray(p_values, dtype=np.float64)
    order = np.argsort(p, kind="stable")
    m = len(p)
    adjusted = np.empty(m)
    running = 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * p[i]))
        adjusted[i] = running
    return adjusted.tolist()


def corrected_tests(observed: dict, draws: dict, alpha: float = ALPHA) -> dict:
    """Every comparison with its correction. ``observed`` {name: difference on all points},
    ``draws`` {name: bootstrap differences}. Returns {name: {difference, interval (1 - alpha),
    bonferroni_interval (1 - alpha / m), p, p_holm, holds}} and "m" (tests run)."""
    names = [n for n in observed if draws.get(n)]
    m = len(names)
    p_raw = []
    for n in names:
        d = np.asarray(draws[n])
        p_raw.append(min(1.0, 2 * (min((d <= 0).sum(), (d >= 0).sum()) + 1) / (len(d) + 1)))
    adjusted = holm(p_raw) if names else []
    out = {}
    for n, p, ph in zip(names, p_raw, adjusted):
        out[n] = {
            "difference": float(observed[n]),
            "interval": _interval(draws[n], 1 - alpha),
            "bonferroni_interval": _interval(draws[n], 1 - alpha / m),
            "p": float(p),
            "p_holm": float(ph),
            "holds": bool(ph < alpha),
            "n_defined": len(draws[n]),
        }
    return {"tests": out, "m": m, "alpha": alpha, "correction": "Holm (p), Bonferroni (intervals)"}
