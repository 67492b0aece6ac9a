"""What the zoo measures on a model: state in scalars at the memory cut, the difficulty sweep,
the drop at separators (reset-aware tolerance) and the utilisation over a prompt.

Conventions (written into every card):
- ESS is ``ess_explorer.analyze``'s tolerance-ESS (relative tol 1e-3 of sigma_1 of each cut,
  the project default) and entropy-ESS, with gates *outside* T (T is the sequence mixing alone,
  so a Mamba2 or attention head keeps one T for all its channels), on ``n_prompts`` held-out
  prompts of the task (seeds 30000, 30001, ...), averaged over prompts.
- State is counted in scalars: a unit's T may be shared by several value channels (a Mamba2
  or attention head by its head_dim channels, a linear-attention head by its value_dim
  channels; a Mamba or short-conv channel by 1), its multiplicity m (LayerESS.multiplicity).
  Layer totals are sum over units of m x ESS (likewise TSS), so layers of different families
  compare.
- The memory cut is t* = 2K, right after the K key-value pairs of the first segment: H_t*
  maps the stored pairs to every later output, so its rank is the state the model carries
  from the pairs to the queries.
- Memory layers: every analysed layer except gated short convolutions (kernel - 1 = 2 past
  tokens per channel cannot carry pairs to the queries). Model ESS = the largest layer total
  over memory layers (one layer has to hold the pairs); model TSS = the largest layer TSS.
  ESS/kv, entropy-ESS/kv and TSS/kv divide them by K.
- Time-aggregated ESS (the paper's reading, what the claim uses): per memory layer the total ESS
  in scalars at every cut t = 1..L-1, then its mean and its max over t (``ess_mean``,
  ``ess_max``; likewise entropy-ESS and TSS, whose total for softmax attention grows with t);
  model values = the largest layer's, per K: ``ess_mean_per_kv`` and so on. The single cut t* =
  2K is kept as a labelled variant: there no unit can exceed rank 2K, so at small K many models
  sit at the rank cap (``rank_cap_allows``).
- Utilisation at t* = mean over units of ESS(t*) / TSS(t*) in the memory layer with the largest
  total ESS; saturated >= 0.9, collapsed <= 0.1. Utilisation over a prompt (the collapse record)
  is diagnostics' ratio of peaks, max_t ESS / max_t TSS per unit, next to the most the rank cap
  min(t, L - t) allows.
- Separator drop: the project's one modulation (core/diagnostics.py: layer total in scalars,
  1 - its lowest value at "|" or the token after over its mean over the 4 cuts before; 1 = the
  past emptied), per memory layer, mean over separators and prompts; the model's is its
  strongest layer's. Two readings: the count (tolerance-ESS at the reset-aware "unit" scope,
  tau = 1e-3 x the largest sigma_1 over the unit's cuts; it falls only where directions fall
  below tau) and the graded modulation (the nuclear norm of the cuts: a partial reset that
  scales the past by c reads as a drop of about 1 - c). Past scale: the median over units of
  sigma_1(H_sep) / sigma_1 before it (how far "|" scales the whole past down).
"""

from __future__ import annotations

import numpy as np
import torch

from ..core.diagnostics import (
    MODULATION_WINDOW,
    layer_modulation,
    modulation_values,
    strongest_layer,
    units_total,
)
from .mqar import MQARTask, evaluate_model

__all__ = [
    "ESS_SEED",
    "ESS_PROMPTS",
    "UNIT_SCOPE_TOL",
    "TIME_AGGREGATES",
    "memory_cut",
    "sweep",
    "separator_drop",
    "prompt_utilisation",
]

ESS_SEED = 30_000
ESS_PROMPTS = 4
UNIT_SCOPE_TOL = 1e-3
TIME_AGGREGATES = ("mean", "max")  # over the cuts t = 1..L-1 of the layer totals (the paper's)


def _over_time(total: np.ndarray) -> dict:
    """{"mean": ..., "max": ...} of a layer total (P,) over the cuts t >= 1 (H_0 is empty)."""
    return {"mean": float(total[1:].mean()), "max": float(total[1:].max())}


def _analyze(model, ids):
    from ..analysis import analyze

    return analyze(model, input_ids=ids, progress=False, keep_operators=None, gates="outside")


def _memory_layers(result) -> list[int]:
    return [i for i, lay in sorted(result.layers.items()) if lay.family != "short_conv"]


def _scalars(model, layer) -> np.ndarray:
    """(U, 1) multiplicity column of a LayerESS (analyze's: value channels sharing each unit's T)."""
    return np.asarray(layer.multiplicity, dtype=np.float64)[:, None]


@torch.no_grad()
def memory_cut(model, task: MQARTask, n_prompts: int = ESS_PROMPTS, seed: int = ESS_SEED) -> dict:
    """ESS, entropy-ESS and TSS in scalars at t* = task.context_end(0), per layer and for the model."""
    t_star = task.context_end(0)
    per_layer: dict[int, dict] = {}
    for p in range(n_prompts):
        result = _analyze(model, task.sample(1, seed=seed + p).input_ids[0])
        for index in _memory_layers(result):
            lay = result.layer(index)
            col = int(np.flatnonzero(lay.positions == t_star)[0])
            m = _scalars(model, lay)[:, 0]
            over_time = {
                f"{name}_{how}": value
                for name, total in (
                    ("ess", lay.total("tolerance")),
                    ("entropy_ess", lay.total("entropy")),
                    ("tss", lay.total_tss()),
                )
                for how, value in _over_time(total).items()
            }
            ess, ent, tss = lay.tolerance_ess[:, col].astype(np.float64), lay.entropy_ess[:, col], lay.tss[:, col]
            rec = per_layer.setdefault(
                index,
                {
                    "family": lay.family,
                    "unit_kind": lay.unit_kind,
                    "n_units": lay.n_units,
                    "multiplicity": int(m[0]),
                    "rows": [],
                },
            )
            rec["rows"].append(
                {
                    **over_time,
                    "ess": float((m * ess).sum()),
                    "entropy_ess": float((m * ent).sum()),
                    "tss": float((m * tss).sum()),
                    "utilisation": float(np.mean(np.divide(ess, tss, out=np.zeros_like(ess), where=tss > 0))),
                    "rank_cap_allows": float(
                        np.mean(
                            np.divide(
                                np.minimum(lay.rank_bound[:, col], tss), tss, out=np.zeros_like(tss), where=tss > 0
                            )
                        )
                    ),
                }
            )
    layers = {}
    for index, rec in per_layer.items():
        rows = rec.pop("rows")
        layers[index] = {**rec, **{k: float(np.mean([r[k] for r in rows])) for k in rows[0]}}
    if not layers:
        raise ValueError("the model has no memory layer (only short convolutions)")
    main = max(layers, key=lambda i: layers[i]["ess"])
    k = task.num_pairs
    ess, ent = layers[main]["ess"], layers[main]["entropy_ess"]
    tss = max(lay["tss"] for lay in layers.values())
    aggregated = {}
    for how in TIME_AGGREGATES:
        for name in ("ess", "entropy_ess", "tss"):
            value = max(lay[f"{name}_{how}"] for lay in layers.values())
            aggregated[f"{name}_{how}"] = value
            aggregated[f"{name}_{how}_per_kv"] = value / k
    return {
        "pairs": k,
        "cut": t_star,
        "length": task.length,
        "n_prompts": n_prompts,
        "seed": seed,
        "memory_layer": main,
        "ess": ess,
        "entropy_ess": ent,
        "tss": tss,
        "ess_per_kv": ess / k,
        "entropy_ess_per_kv": ent / k,
        "tss_per_kv": tss / k,
        "utilisation": layers[main]["utilisation"],
        "rank_cap_allows": layers[main]["rank_cap_allows"],
        **aggregated,
        "layers": {str(i): layers[i] for i in sorted(layers)},
    }


def sweep(
    model, task: MQARTask, ks, n_samples: int = 512, n_prompts: int = ESS_PROMPTS, test_seed: int = 10_000
) -> list[dict]:
    """Accuracy and ESS/kv at each number of pairs K in ``ks`` (``task.with_pairs(k)``: same length).

    One row per K: pairs, accuracy (``n_samples`` held-out sequences from ``test_seed``),
    stale_accuracy where the task has "--" answers, and ``memory_cut``'s numbers.
    """
    rows = []
    for k in ks:
        variant = task.with_pairs(int(k))
        acc = evaluate_model(model, variant, n_samples=n_samples, seed=test_seed)
        cut = memory_cut(model, variant, n_prompts=n_prompts)
        cut.pop("layers")
        rows.append({"accuracy": acc["accuracy"], "n_samples": n_samples, **cut})
    return rows


def _sigma1_ratio(layer, seps, window: int) -> np.ndarray:
    """sigma_1(H_sep) / mean sigma_1 over the ``window`` cuts before, per separator and unit,
    flattened: how far the separator scales the whole past down (1 = not at all). A partial
    reset (every old contribution times 0.1, say) keeps every singular value above a 1e-3
    tolerance, so it shows here and not in a rank count."""
    top = layer.singular_values[:, :, 0]  # (U, P)
    out = []
    for s in seps:
        ref = top[:, s - window : s].mean(1)
        out.append(np.divide(top[:, s], ref, out=np.ones_like(ref), where=ref > 0))
    return np.concatenate(out)


@torch.no_grad()
def separator_drop(
    model,
    task: MQARTask,
    n_prompts: int = ESS_PROMPTS,
    seed: int = ESS_SEED,
    tol: float = UNIT_SCOPE_TOL,
) -> dict:
    """The modulation at the separators (core/diagnostics.py's one definition), per memory layer.

    Per layer: ``modulation`` (the count, tolerance ``tol`` at the reset-aware scope) and
    ``graded_modulation`` (nuclear norm), means over separators and prompts; past_scale (median
    over separators, prompts and units of sigma_1(H_sep) / mean sigma_1 before, see
    _sigma1_ratio) and the fraction of units scaled below 0.1; for display the count's layer
    total ess_before (mean over the cuts before each "|"), ess_at (t = "|"), ess_after (t = "|"
    + 1) and its mean curve. The model's ``modulation`` / ``graded_modulation`` are those of the
    strongest layer of each (``layer`` / ``graded_layer``).
    """
    seps = task.separator_positions()
    if not seps:
        raise ValueError("separator_drop needs a task with separators (num_segments >= 2)")
    window = MODULATION_WINDOW
    per_layer: dict[int, dict[str, list]] = {}
    families = {}
    for p in range(n_prompts):
        result = _analyze(model, task.sample(1, seed=seed + p).input_ids[0])
        for index in _memory_layers(result):
            lay = result.layer(index)
            rec = per_layer.setdefault(index, {"curve": [], "count": [], "graded": [], "ratio": []})
            rec["curve"].append(units_total(modulation_values(lay, tol=tol), lay.multiplicity))
            rec["count"].append(layer_modulation(lay, seps, tol=tol))
            rec["graded"].append(layer_modulation(lay, seps, measure="graded"))
            rec["ratio"].append(_sigma1_ratio(lay, seps, window))
            families[index] = lay.family
    out = {}
    for index, rec in per_layer.items():
        ratio = np.concatenate(rec["ratio"])  # (prompts x separators x units,)
        rows = np.stack(rec["curve"])  # (prompts, P); positions are 0..L-1
        out[str(index)] = {
            "family": families[index],
            "ess_before": float(np.mean([rows[:, s - window : s].mean(1) for s in seps])),
            "ess_at": float(rows[:, seps].mean()),
            "ess_after": float(rows[:, [s + 1 for s in seps]].mean()),
            "modulation": float(np.nanmean(np.concatenate(rec["count"]))),
            "graded_modulation": float(np.nanmean(np.concatenate(rec["graded"]))),
            "past_scale": float(np.median(ratio)),
            "units_scaled_below_0.1": float(np.mean(ratio < 0.1)),
            "ess_over_time": [round(float(x), 2) for x in rows.mean(0)],
        }
    best = strongest_layer({i: lay["modulation"] for i, lay in out.items()})
    graded = strongest_layer({i: lay["graded_modulation"] for i, lay in out.items()})
    return {
        "separators": seps,
        "window": window,
        "n_prompts": n_prompts,
        "tolerance": {"tol": tol, "scope": "unit"},
        "modulation": out[best]["modulation"],
        "layer": int(best),
        "graded_modulation": out[graded]["graded_modulation"],
        "graded_layer": int(graded),
        "layers": out,
    }


@torch.no_grad()
def prompt_utilisation(model, task: MQARTask, n_prompts: int = ESS_PROMPTS, seed: int = ESS_SEED) -> dict:
    """Utilisation over whole prompts (ratio of peaks, per unit, averaged) per memory layer,
    next to the most the rank cap allows: mean over units of min(max_t min(t, L - t), TSS) / TSS."""
    from ..core.diagnostics import layer_diagnostics

    per_layer: dict[int, list] = {}
    caps = {}
    for p in range(n_prompts):
        result = _analyze(model, task.sample(1, seed=seed + p).input_ids[0])
        for index in _memory_layers(result):
            lay = result.layer(index)
            per_layer.setdefault(index, []).append(layer_diagnostics(lay, against="tss")["utilisation"])
            tss_peak = lay.tss.max(1)
            cap = np.minimum(lay.rank_bound.max(1), tss_peak)
            caps[index] = float(np.mean(np.divide(cap, tss_peak, out=np.zeros_like(tss_peak), where=tss_peak > 0)))
    layers = {
        str(i): {"utilisation": float(np.mean(v)), "rank_cap_allows": caps[i]} for i, v in sorted(per_layer.items())
    }
    return {
        "length": task.length,
        "n_prompts": n_prompts,
        "seed": seed,
        "layers": layers,
        "utilisation": max(v["utilisation"] for v in layers.values()),
    }
