"""Statistics over the prompts of a sweep table (sweep/table.py), with bootstrap intervals.

Conventions
- A prompt is the sampling unit: per prompt, units are first reduced to one value (the mean
  over units, each weighted by its ``multiplicity``), then values are averaged over prompts.
- Intervals are percentile bootstrap intervals over prompts: ``n_boot`` resamples of the
  prompts with replacement (the same resamples for every group, drawn from ``seed``, so
  intervals are reproducible and groups are resampled jointly). A group seen in fewer
  prompts than a resample draws gets its mean over the drawn prompts that have it.
- Runs stay apart: every result is per (model, checkpoint_step) besides ``by``.

summarize      mean ESS per (model, layer, t) with intervals (``by`` chooses the groups)
modulation     the project's one modulation at every occurrence of a token
               (core/diagnostics.py: separator_modulation: layer total in scalars, window 4,
               lag 1), the count or the graded (nuclear-norm) one, with intervals
utilisation    per (prompt, layer, unit): peak ESS over peak TSS (core/diagnostics.py)
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from ..core.diagnostics import MODULATION_LAG, MODULATION_MEASURES, MODULATION_WINDOW, separator_modulation
from ..core.diagnostics import utilisation as _ratio
from ..core.ess import check_variant

__all__ = ["summarize", "modulation", "utilisation", "bootstrap_mean", "resample_weights", "as_table"]

RUN = ["model", "checkpoint_step"]


def as_table(table) -> pd.DataFrame:
    """A sweep table from a DataFrame, a SweepResult or a sweep folder."""
    if isinstance(table, pd.DataFrame):
        return table
    if hasattr(table, "table") and callable(table.table):
        return table.table()
    if isinstance(table, (str, Path)):
        from .table import read_table

        return read_table(table)
    raise ValueError(f"expected a sweep table (DataFrame), a SweepResult or a sweep folder, got {type(table).__name__}")


def _column(variant: str) -> str:
    if variant == "causal":
        return "causal_ess"
    return f"{check_variant(variant)}_ess"


def resample_weights(n_prompts: int, *, n_boot: int = 1000, seed: int = 0) -> np.ndarray:
    """(n_boot, n_prompts): how often each prompt is drawn in each bootstrap resample (a
    multinomial draw of n_prompts from ``seed``). The one source of resamples, so every
    statistic of the package resamples the same way."""
    if not isinstance(n_boot, int) or n_boot < 1:
        raise ValueError(f"n_boot must be a positive integer, got {n_boot!r}")
    return np.random.default_rng(seed).multinomial(n_prompts, np.full(n_prompts, 1 / n_prompts), size=n_boot)


def bootstrap_mean(sums: np.ndarray, counts: np.ndarray, *, confidence=0.95, n_boot=1000, seed=0):
    """Mean and percentile interval of many groups at once.

    sums, counts : (P, G) per prompt and group, the sum of the values and how many there
        are (0 where the prompt lacks the group). Returns (mean, low, high), each (G,).
    """
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must lie in (0, 1), got {confidence}")
    n_prompts = sums.shape[0]
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = sums.sum(0) / counts.sum(0)
    # Resample counts of each prompt (multinomial) -> every resample's mean is a matrix product.
    weights = resample_weights(n_prompts, n_boot=n_boot, seed=seed)
    low, high = np.empty_like(mean), np.empty_like(mean)
    alpha = (1 - confidence) / 2
    for start in range(0, sums.shape[1], 2048):  # columns in chunks: (n_boot, chunk) at a time
        block = slice(start, start + 2048)
        with np.errstate(invalid="ignore", divide="ignore"):
            means = (weights @ sums[:, block]) / (weights @ counts[:, block])
        low[block] = np.nanquantile(means, alpha, axis=0) if means.size else means[:0]
        high[block] = np.nanquantile(means, 1 - alpha, axis=0) if means.size else means[:0]
    return mean, low, high


def _per_prompt(frame: pd.DataFrame, keys: list[str], value: str) -> pd.DataFrame:
    """Mean over units (weighted by multiplicity) of ``value`` per keys + prompt_id."""
    weight = frame["multiplicity"].to_numpy(dtype=np.float64)
    work = frame[keys + ["prompt_id"]].copy()
    work["_num"] = frame[value].to_numpy(dtype=np.float64) * weight
    work["_den"] = weight
    grouped = work.groupby(keys + ["prompt_id"], dropna=False, sort=True)[["_num", "_den"]].sum()
    grouped["value"] = grouped["_num"] / grouped["_den"]
    return grouped["value"].reset_index()


def _over_prompts(per_prompt: pd.DataFrame, keys: list[str], **boot) -> pd.DataFrame:
    """mean, low, high, n_prompts per keys of a per-prompt frame (columns keys, prompt_id, value)."""
    sums = per_prompt.pivot_table(index="prompt_id", columns=keys, values="value", aggfunc="sum")
    counts = per_prompt.assign(value=1.0).pivot_table(index="prompt_id", columns=keys, values="value", aggfunc="sum")
    sums, counts = sums.fillna(0.0), counts.reindex_like(sums).fillna(0.0)
    mean, low, high = bootstrap_mean(sums.to_numpy(), counts.to_numpy(), **boot)
    index = sums.columns.to_frame(index=False)
    index.columns = keys
    result = index.assign(mean=mean, low=low, high=high, n_prompts=(counts.to_numpy() > 0).sum(0))
    return result[result.n_prompts > 0].reset_index(drop=True)


def _keys(table: pd.DataFrame, by) -> list[str]:
    by = [by] if isinstance(by, str) else list(by)
    missing = [k for k in by if k not in table.columns]
    if missing:
        raise ValueError(f"by names columns the table lacks: {missing}; columns: {list(table.columns)}")
    if "prompt_id" in by:
        raise ValueError("prompt_id cannot be in by: the statistics are over prompts")
    return RUN + [k for k in by if k not in RUN]


def _fill_steps(table: pd.DataFrame) -> pd.DataFrame:
    # groupby/pivot drop a null key; -1 stands for "no step" while grouping (restored below).
    return table.assign(checkpoint_step=table["checkpoint_step"].astype("Int64").fillna(-1).astype(np.int64))


def _restore_steps(frame: pd.DataFrame) -> pd.DataFrame:
    steps = frame["checkpoint_step"].astype("Int64")
    return frame.assign(checkpoint_step=steps.mask(steps == -1))


def summarize(
    table,
    by=("model", "layer", "t"),
    *,
    variant: str = "tolerance",
    confidence: float = 0.95,
    n_boot: int = 1000,
    seed: int = 0,
) -> pd.DataFrame:
    """Mean ESS over prompts per group, with a bootstrap interval.

    table : a sweep table (or SweepResult / sweep folder). by : the group columns (always
    also per model and checkpoint_step). variant : "tolerance", "entropy" or "causal".
    Returns columns model, checkpoint_step, *by, mean, low, high, n_prompts.
    """
    table = as_table(table)
    value = _column(variant)
    if value not in table.columns:
        raise ValueError(f"the table has no {value} column")
    keys = _keys(table, by)
    per_prompt = _per_prompt(_fill_steps(table), keys, value)
    return _restore_steps(_over_prompts(per_prompt, keys, confidence=confidence, n_boot=n_boot, seed=seed))


def _matches(tokens: pd.Series, token: str) -> np.ndarray:
    return (tokens.astype(str).str.strip() == token.strip()).to_numpy()


def modulation(
    table,
    token: str,
    *,
    by=("model", "layer"),
    measure: str = "count",
    variant: str = "tolerance",
    window: int = MODULATION_WINDOW,
    lag: int = MODULATION_LAG,
    confidence: float = 0.95,
    n_boot: int = 1000,
    seed: int = 0,
) -> pd.DataFrame:
    """Modulation at every occurrence of ``token`` (compared after stripping surrounding
    whitespace: "|", the EOS string, any token), averaged over occurrences.

    Per (prompt, layer), the one modulation of core/diagnostics.py (`separator_modulation`:
    the layer total in scalars, 1 - its lowest value at the token..token + lag over its mean
    over the ``window`` cuts before). ``measure`` "count": the table's ``variant`` column, the
    ESS at the sweep's scope (reset-aware "unit" by default; a per-cut sweep cannot see a reset
    at the token itself); "graded": the ``nuclear_norm`` column (scale-aware, no scope). Then
    the mean over every occurrence in every prompt, with a bootstrap interval over prompts (a
    prompt's occurrences are drawn together). Returns columns model, checkpoint_step, *by,
    mean, low, high, n_prompts, n_occurrences. ValueError when the token never occurs.
    """
    table = as_table(table)
    if measure not in MODULATION_MEASURES:
        raise ValueError(f"measure must be one of {list(MODULATION_MEASURES)}, got {measure!r}")
    value = "nuclear_norm" if measure == "graded" else _column(variant)
    if value not in table.columns or table[value].isna().all():
        raise ValueError(f"the table has no {value} values (a sweep written before the column existed: rerun it)")
    hits = _matches(table["token"], token)
    if not hits.any():
        raise ValueError(f"the token {token!r} does not occur in the table; pick a token string from its token column")
    keys = _keys(table, by)
    table = _fill_steps(table)
    rows = []
    group_keys = RUN + ["prompt_id", "layer"]
    for key, frame in table.groupby(group_keys, sort=True):
        frame = frame.sort_values(["unit", "t"])
        positions = np.sort(frame["t"].unique())
        units = frame["unit"].unique()
        values = frame[value].to_numpy(dtype=np.float64).reshape(len(units), len(positions))
        weight = frame.drop_duplicates("unit")["multiplicity"].to_numpy(dtype=np.float64)
        first = frame[frame["unit"] == units[0]]
        separators = first["t"].to_numpy()[_matches(first["token"], token)]
        if not len(separators):
            continue
        scores = separator_modulation(values, weight, positions, separators, window=window, lag=lag)  # (S,)
        base = dict(zip(group_keys, key))
        extra = {k: frame[k].iloc[0] for k in keys if k not in base}
        for score in scores[np.isfinite(scores)]:
            rows.append({**base, **extra, "value": float(score)})
    if not rows:
        raise ValueError(f"no occurrence of {token!r} has {window} earlier cuts with ESS > 0 to compare with")
    occurrences = pd.DataFrame(rows)
    summed = occurrences.groupby(keys + ["prompt_id"], sort=True)["value"].agg(["sum", "count"]).reset_index()
    sums = summed.pivot_table(index="prompt_id", columns=keys, values="sum", aggfunc="sum").fillna(0.0)
    counts = summed.pivot_table(index="prompt_id", columns=keys, values="count", aggfunc="sum").reindex_like(sums)
    counts = counts.fillna(0.0)
    mean, low, high = bootstrap_mean(
        sums.to_numpy(), counts.to_numpy(), confidence=confidence, n_boot=n_boot, seed=seed
    )
    result = sums.columns.to_frame(index=False)
    result.columns = keys
    result = result.assign(
        mean=mean,
        low=low,
        high=high,
        n_prompts=(counts.to_numpy() > 0).sum(0),
        n_occurrences=counts.to_numpy().sum(0).astype(np.int64),
    )
    return _restore_steps(result.reset_index(drop=True))


def utilisation(table, *, variant: str = "tolerance") -> pd.DataFrame:
    """Per (model, checkpoint_step, prompt_id, layer, unit): utilisation = max_t ESS / max_t TSS
    over the cuts where TSS > 0 (core/diagnostics.py's ratio of peaks). Columns: those keys,
    family, multiplicity, utilisation; its distribution per layer is the figure's input."""
    table = as_table(table)
    value = _column(variant)
    valid = table["tss"].to_numpy(dtype=np.float64) > 0
    work = _fill_steps(table)[RUN + ["prompt_id", "layer", "unit", "family", "multiplicity"]].copy()
    work["_ess"] = np.where(valid, table[value].to_numpy(dtype=np.float64), 0.0)
    work["_tss"] = np.where(valid, table["tss"].to_numpy(dtype=np.float64), 0.0)
    keys = RUN + ["prompt_id", "layer", "unit"]
    peaks = (
        work.groupby(keys, sort=True)
        .agg(
            family=("family", "first"),
            multiplicity=("multiplicity", "first"),
            _ess=("_ess", "max"),
            _tss=("_tss", "max"),
        )
        .reset_index()
    )
    peaks["utilisation"] = _ratio(peaks["_ess"].to_numpy(), peaks["_tss"].to_numpy())
    return _restore_steps(peaks.drop(columns=["_ess", "_tss"]))
