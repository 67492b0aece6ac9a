"""Advice from ESS: the state each layer uses on a sweep's data, and what a smaller or
recurrent layer would need to keep it (docs/advice.md).

    advise(table_or_results, quantile=0.99)  -> Advice (one LayerAdvice per model, step, layer)

Conventions
- A cut is one (prompt, unit, t) with 1 <= t <= L - 1 (H_0 is empty: ESS(0) = 0 says nothing
  about the state a layer needs). Per-unit numbers pool every cut of every unit of the layer,
  each counted once; numbers "in scalars" are per (prompt, t) layer totals,
  sum over units of multiplicity x ESS (docs/conventions.md).
- The state that covers a quantile q is the smallest integer n with P(ESS <= n) >= q (the
  inverted CDF). For entropy-ESS, which is not an integer, ESS <= n is ceil(ESS) <= n: the
  advice is always a whole state size.
- Recurrent layer: the state it has is its TSS per unit; the advised state is the size n that
  covers q of its cuts. A model whose units keep n each keeps n x (channels) scalars.
- Attention layer (its state grows with t): the state it has is its KV cache, 2 x KV heads x
  head_dim x TSS(t) scalars at t (GQA: the KV heads, not the query heads), and what a cut can
  reach is the ceiling min(TSS, t, L - t) per query head (docs/conventions.md). Its use of
  that ceiling is the mean over cuts of the layer total of ESS over the layer total of the
  ceiling. A recurrent unit with a state of n would reproduce the fraction of cuts whose ESS
  is at most n (coverage at n). ``full_attention_state`` is what the same rule advises for a
  generic full-attention head on the same cuts (ESS = min(t, L - t): the q-quantile of that); the
  layer is a candidate for a recurrent replacement when even the upper end of its advised
  state's interval is at most CANDIDATE_AT (one half) of it: a fixed state that small covers what
  the growing cache holds on this data (a window of w needs at most w - 1).
- Intervals: percentile bootstrap over prompts (sweep/stats.py: resample_weights, the same
  resamples for every number, from ``seed``). Each number is recomputed on every resample.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd

from ..io import jsonable
from ..options import VARIANTS
from ..result import ESSResult
from .advice_result import Advice, Distribution, Estimate, LayerAdvice
from .stats import RUN, as_table, resample_weights

__all__ = [
    "DEFAULT_QUANTILE",
    "ATTENTION_FAMILIES",
    "ADVICE_VARIANTS",
    "CANDIDATE_AT",
    "Estimate",
    "Distribution",
    "LayerAdvice",
    "Advice",
    "advise",
    "coverage_sizes",
]

DEFAULT_QUANTILE = 0.99
# Families whose state grows with t (a KV cache); every other family has a fixed state per unit.
ATTENTION_FAMILIES = ("softmax_attention", "chunked_attention")
ADVICE_VARIANTS = VARIANTS  # every ESS variant can be advised on
# An attention layer is a candidate for a recurrent replacement when its advised state is at most this fraction of
# the state full attention would be advised on the same prompts.
CANDIDATE_AT = 0.5
_SUMMARY_LEVELS = (0.5, 0.9)  # reported besides the chosen quantile


def coverage_sizes(peak: float) -> tuple[int, ...]:
    """The state sizes n at which coverage is reported: powers of two up to the peak state."""
    top = max(1, int(math.ceil(peak)))
    sizes = [2**k for k in range(0, int(math.log2(top)) + 1)]
    return tuple(sizes if sizes[-1] == top else [*sizes, top])


# ---------------------------------------------------------------------------------- inputs


def _from_results(results) -> tuple[pd.DataFrame, list[dict]]:
    """A sweep table of ESSResults (prompt_id = index in the list) and their metadata."""
    from .table import COLUMNS, result_table

    results = list(results)
    if not results:
        raise ValueError("advise needs at least one ESSResult")
    frames, metas = [], []
    for index, result in enumerate(results):
        if not isinstance(result, ESSResult):
            raise ValueError(f"item {index} is a {type(result).__name__}, not an ESSResult")
        frame = result_table(result, prompt_id=index, checkpoint_step=None).to_pandas()
        frames.append(frame.assign(model=str(result.meta.get("model_id", "model"))))
        metas.append({"prompt_ids": [index], "n_tokens": [result.length], "analysis": dict(result.meta)})
    table = pd.concat(frames, ignore_index=True)
    return table[[c for c in COLUMNS if c in table.columns]], metas


def _inputs(source) -> tuple[pd.DataFrame, list[dict]]:
    """(table, shard metadata) of a sweep folder, SweepResult, DataFrame or ESSResults."""
    if isinstance(source, ESSResult):
        return _from_results([source])
    if isinstance(source, (list, tuple)) and source and all(isinstance(r, ESSResult) for r in source):
        return _from_results(source)
    if isinstance(source, (str, Path)):
        from .table import read_metadata

        return as_table(source), read_metadata(source)
    if hasattr(source, "metadata") and callable(source.metadata) and hasattr(source, "table"):
        return source.table(), source.metadata()
    return as_table(source), []


def _check_table(table: pd.DataFrame) -> pd.DataFrame:
    need = ["model", "checkpoint_step", "prompt_id", "layer", "unit", "multiplicity", "t", "family"]
    need += ["tolerance_ess", "entropy_ess", "tss"]
    missing = [c for c in need if c not in table.columns]
    if missing:
        raise ValueError(f"a sweep table needs the columns {missing}; read one with ess_explorer.sweep.read_table")
    if table.empty:
        raise ValueError("the sweep table is empty: nothing to advise on")
    return table


def _lengths(meta: list[dict]) -> dict[tuple[str, int], int]:
    """(model, prompt_id) -> prompt length from the shards' metadata."""
    out = {}
    for record in meta:
        model = str((record.get("run") or {}).get("model", (record.get("analysis") or {}).get("model_id", "")))
        for prompt_id, length in zip(record.get("prompt_ids") or [], record.get("n_tokens") or []):
            out[(model, int(prompt_id))] = int(length)
    return out


def _provenance(table: pd.DataFrame, meta: list[dict], *, n_boot: int, seed: int) -> dict:
    analyses = [record.get("analysis") or {} for record in meta]

    def seen(key):
        values = sorted({json.dumps(jsonable(a.get(key)), sort_keys=True) for a in analyses if key in a})
        values = [json.loads(v) for v in values]
        return None if not values else values[0] if len(values) == 1 else values

    prompts = table.groupby(RUN, dropna=False)["prompt_id"].nunique()
    return {
        "models": sorted(table["model"].astype(str).unique()),
        "model_ids": seen("model_id"),
        "revision": seen("revision"),
        "n_prompts": int(prompts.max()),
        "tol": seen("tol"),
        "relative": seen("relative"),
        "scope": seen("scope"),
        "gates": seen("gates"),
        "precision": seen("precision"),
        "dtype": seen("dtype"),
        "stride": seen("stride"),
        "package_version": seen("package_version"),
        "bootstrap": {"n_boot": n_boot, "seed": seed, "over": "prompts"},
        "cuts": "1 <= t <= L - 1 of every prompt and unit",
    }


# ---------------------------------------------------------------------------------- numbers


class _Resampled:
    """Per-prompt histograms of a value on its support and every resample's view of them."""

    def __init__(self, prompt_index: np.ndarray, values: np.ndarray, weights: np.ndarray):
        finite = np.isfinite(values)
        self.prompt, self.values = prompt_index[finite], values[finite]
        self.n_prompts = weights.shape[1]
        self.weights = np.vstack([np.ones(self.n_prompts), weights])  # row 0: the sample itself
        self.size = int(self.values.size)

    def _histogram(self, keys: np.ndarray):
        support, inverse = np.unique(keys, return_inverse=True)
        counts = np.zeros((self.n_prompts, support.size))
        np.add.at(counts, (self.prompt, inverse), 1.0)
        return support, self.weights @ counts  # (1 + B, V)

    def covering(self, levels) -> np.ndarray:
        """(len(levels), 1 + B): the smallest integer n with P(value <= n) >= q."""
        support, counts = self._histogram(np.ceil(self.values - 1e-9))
        cdf = np.cumsum(counts, axis=1) / counts.sum(1, keepdims=True)
        out = np.empty((len(levels), cdf.shape[0]))
        for row, q in enumerate(levels):
            index = (cdf < q - 1e-12).sum(1)  # the first support point whose CDF reaches q
            out[row] = support[np.minimum(index, support.size - 1)]
        return out

    def at_most(self, sizes) -> np.ndarray:
        """(len(sizes), 1 + B): the fraction of values <= n (n an integer)."""
        support, counts = self._histogram(np.ceil(self.values - 1e-9))
        total = counts.sum(1)
        return np.stack([counts[:, support <= n].sum(1) / total for n in sizes])

    def mean(self) -> np.ndarray:
        sums = np.bincount(self.prompt, weights=self.values, minlength=self.n_prompts)
        counts = np.bincount(self.prompt, minlength=self.n_prompts).astype(np.float64)
        return (self.weights @ sums) / (self.weights @ counts)


def _estimate(draws: np.ndarray, confidence: float) -> Estimate:
    """Row 0 is the sample's value, the rest the bootstrap's."""
    alpha = (1 - confidence) / 2
    boot = draws[1:][np.isfinite(draws[1:])]
    low, high = np.quantile(boot, [alpha, 1 - alpha]) if boot.size else (np.nan, np.nan)
    return Estimate(float(draws[0]), float(low), float(high))


def _kv_heads_of_config(model: str) -> int | None:
    """num_key_value_heads from a local model folder's config.json (zoo:NAME or a folder);
    None for a hub id or when the config does not say."""
    from ..bounded import read_json
    from ..sources import model_dir, parse_source

    try:
        kind, value = parse_source(model)
        folder = model_dir(value) if kind == "zoo" else Path(value).expanduser() if kind == "folder" else None
        if folder is None or not (folder / "config.json").is_file():
            return None
        config = read_json(folder / "config.json", str(folder / "config.json"))
    except (ValueError, OSError):
        return None
    for node in (config, config.get("text_config") or {}):
        if isinstance(node, dict) and isinstance(node.get("num_key_value_heads"), int):
            return int(node["num_key_value_heads"])
    return None


def _kv_heads(kv_heads, model: str, layer: int, query_heads: int) -> tuple[int, str]:
    """(KV heads, where the number comes from)."""
    if isinstance(kv_heads, dict):
        kv_heads = kv_heads.get(layer, kv_heads.get(str(layer)))
    if kv_heads is None:
        found = _kv_heads_of_config(model)
        if found is not None:
            return found, "the model's config"
        return query_heads, "assumed one per query head (no GQA): pass kv_heads= for a GQA model"
    if not isinstance(kv_heads, (int, np.integer)) or kv_heads < 1 or query_heads % int(kv_heads):
        raise ValueError(
            f"kv_heads must be a positive integer dividing the {query_heads} query heads, got {kv_heads!r}"
        )
    return int(kv_heads), "given"


def _layer_advice(
    frame: pd.DataFrame,
    key: tuple,
    lengths: np.ndarray,
    weights: np.ndarray,
    *,
    quantile: float,
    variant: str,
    confidence: float,
    kv_heads,
    sizes,
) -> tuple[LayerAdvice, dict]:
    model, step, layer = key
    family = str(frame["family"].iloc[0])
    attention = family in ATTENTION_FAMILIES
    units = frame.drop_duplicates("unit").sort_values("unit")
    multiplicity = units["multiplicity"].to_numpy(dtype=np.int64)
    channels = int(multiplicity.sum())
    cuts = frame[frame["t"].to_numpy() >= 1]
    if cuts.empty:
        raise ValueError(f"layer {layer} of {model}: no cut with t >= 1 (prompts of one token?)")
    prompt = cuts["_prompt"].to_numpy()
    t = cuts["t"].to_numpy(dtype=np.float64)
    mult = cuts["multiplicity"].to_numpy(dtype=np.float64)
    tss = cuts["tss"].to_numpy(dtype=np.float64)
    length = int(lengths.max())
    levels = tuple(sorted({*_SUMMARY_LEVELS, quantile}))
    # One row per (prompt, t) for the layer totals in scalars.
    groups = cuts.groupby(["_prompt", "t"], sort=True)
    total_prompt = groups["_prompt"].first().to_numpy()

    distributions, chosen = [], {}
    for name in ADVICE_VARIANTS:
        column = f"{name}_ess"
        if column not in cuts.columns:
            continue
        values = cuts[column].to_numpy(dtype=np.float64)
        if not np.isfinite(values).any():
            continue
        per_unit = _Resampled(prompt, values, weights)
        scalars = cuts.assign(_v=values * mult).groupby(["_prompt", "t"], sort=True)["_v"].sum(min_count=1)
        scalar = _Resampled(total_prompt, scalars.to_numpy(dtype=np.float64), weights)
        unit_q, scalar_q = per_unit.covering(levels), scalar.covering(levels)
        distributions.append(
            Distribution(
                variant=name,
                levels=levels,
                per_unit=tuple(_estimate(row, confidence) for row in unit_q),
                scalars=tuple(_estimate(row, confidence) for row in scalar_q),
                mean_per_unit=_estimate(per_unit.mean(), confidence),
                mean_scalars=_estimate(scalar.mean(), confidence),
                n_cuts=per_unit.size,
            )
        )
        if name == variant:
            chosen = {"per_unit": per_unit, "draws": unit_q[levels.index(quantile)], "values": values}
    if not chosen:
        raise ValueError(f"layer {layer} of {model}: the table has no finite {variant}-ESS to advise from")

    draws = chosen["draws"]
    advised = _estimate(draws, confidence)
    if attention:
        state_per_unit = float(tss.max())  # KV tokens at the longest cut (min(t, w - 1) with a window)
        kv, kv_source = _kv_heads(kv_heads, model, int(layer), len(units))
        head_dim = int(round(channels / len(units)))
        state_scalars = 2.0 * kv * head_dim * state_per_unit
        ceiling_peak = int(min(state_per_unit, length // 2))
    else:
        state_per_unit = float(tss.max())
        unit_tss = frame.groupby("unit", sort=True)["tss"].max().to_numpy(dtype=np.float64)
        state_scalars = float((multiplicity * unit_tss).sum())
        kv = head_dim = ceiling_peak = None
        kv_source = None
    sizes = coverage_sizes(max(state_per_unit, 1.0)) if sizes is None else sizes
    coverage = chosen["per_unit"].at_most(sizes)
    active = (
        cuts.assign(_v=chosen["values"])
        .groupby("unit")["_v"]
        .quantile(quantile, interpolation="higher")
        .to_numpy(dtype=np.float64)
    )
    advice = dict(
        model=str(model),
        checkpoint_step=None if step == -1 else int(step),
        layer=int(layer),
        family=family,
        kind="attention" if attention else "recurrent",
        units=len(units),
        channels=channels,
        length=length,
        state_per_unit=state_per_unit,
        state_scalars=state_scalars,
        advised_per_unit=advised,
        advised_scalars=_estimate(draws * channels, confidence),
        ratio=_estimate(draws / state_per_unit if state_per_unit > 0 else draws * np.nan, confidence),
        units_active=int((np.ceil(active - 1e-9) >= 1).sum()),
        coverage=tuple((int(n), _estimate(row, confidence)) for n, row in zip(sizes, coverage)),
        distributions=tuple(distributions),
    )
    notes = {}
    if attention:
        ceiling = np.minimum(np.minimum(tss, t), lengths[prompt] - t) * mult
        used = cuts[f"{variant}_ess"].to_numpy(dtype=np.float64) * mult
        per_cut = pd.DataFrame({"p": prompt, "t": t, "used": used, "ceiling": ceiling}).groupby(["p", "t"]).sum()
        per_cut = per_cut[per_cut["ceiling"] > 0]
        ratio = (per_cut["used"] / per_cut["ceiling"]).to_numpy()
        use = _Resampled(per_cut.index.get_level_values("p").to_numpy(), ratio, weights).mean()
        generic = np.minimum(t, lengths[prompt] - t)  # the ESS of a generic full-attention head at each cut
        full = float(_Resampled(prompt, generic, weights[:0]).covering([quantile])[0, 0])
        advice.update(
            ceiling_use=_estimate(use, confidence),
            ceiling_peak=ceiling_peak,
            full_attention_state=int(full),
            kv_heads=kv,
            head_dim=head_dim,
            candidate=bool(advised.high <= CANDIDATE_AT * full),
        )
        notes[f"kv_heads of {model} layer {layer}"] = kv_source
    return LayerAdvice(**advice), notes


def advise(
    source,
    *,
    quantile: float = DEFAULT_QUANTILE,
    variant: str = "tolerance",
    kv_heads=None,
    sizes=None,
    confidence: float = 0.95,
    n_boot: int = 1000,
    seed: int = 0,
) -> Advice:
    """The state each layer of a sweep uses, and the state a smaller or recurrent layer needs.

    source: a sweep table (DataFrame of ``read_table``), a sweep folder, a SweepResult, an
    ESSResult or a list of them (one prompt each). quantile: the fraction of cuts the advised
    state must cover (0 < q <= 1). variant: the ESS the advice follows ("tolerance",
    "entropy" or "causal"); the distributions of all three are reported. kv_heads: the KV
    heads of attention layers (an int, or {layer: int}); default the model's config.json
    where the model is a local folder or zoo:NAME, else one per query head (recorded in
    ``data["notes"]``). sizes: the state sizes n at which coverage is reported (default
    powers of two up to the state the layer has, and that state). Intervals: ``confidence`` percentile bootstrap over prompts, ``n_boot``
    resamples from ``seed``. Returns an Advice (``to_dict``, ``to_json``, ``to_frame``).
    """
    if not isinstance(quantile, (int, float)) or not 0 < quantile <= 1:
        raise ValueError(f"quantile must lie in (0, 1], got {quantile!r}")
    if variant not in ADVICE_VARIANTS:
        raise ValueError(f"variant must be one of {list(ADVICE_VARIANTS)}, got {variant!r}")
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must lie in (0, 1), got {confidence}")
    if sizes is not None:
        sizes = tuple(sorted({int(n) for n in sizes}))
        if not sizes or sizes[0] < 0:
            raise ValueError(f"sizes must be non-negative state sizes, got {sizes}")
    table, meta = _inputs(source)
    table = _check_table(table)
    table = table.assign(checkpoint_step=table["checkpoint_step"].astype("Int64").fillna(-1).astype(np.int64))
    known = _lengths(meta)
    data = _provenance(table, meta, n_boot=n_boot, seed=seed)
    notes: dict = {}
    advice, all_lengths = [], []
    for (model, step), run in table.groupby(RUN, sort=True):
        prompt_ids = np.sort(run["prompt_id"].unique())
        index = {int(p): i for i, p in enumerate(prompt_ids)}
        run = run.assign(_prompt=run["prompt_id"].map(index).to_numpy())
        # A prompt's length: the metadata's, else its last cut + 1 (exact without a stride).
        last = run.groupby("_prompt")["t"].max().to_numpy() + 1
        lengths = np.array([known.get((str(model), int(p)), last[i]) for i, p in enumerate(prompt_ids)])
        all_lengths.extend(lengths.tolist())
        weights = resample_weights(len(prompt_ids), n_boot=n_boot, seed=seed)
        for layer, frame in run.groupby("layer", sort=True):
            one, note = _layer_advice(
                frame,
                (model, step, layer),
                lengths,
                weights,
                quantile=quantile,
                variant=variant,
                confidence=confidence,
                kv_heads=kv_heads,
                sizes=sizes,
            )
            advice.append(one)
            notes.update(note)
    data["length"] = {"min": int(min(all_lengths)), "max": int(max(all_lengths))}
    if notes:
        data["notes"] = notes
    return Advice(quantile=float(quantile), variant=variant, confidence=confidence, layers=tuple(advice), data=data)
