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
- Utilisation at t* = mean over units of ESS(t*) / TSS(t*) in the memory layer with the largest
  total ESS; saturated >= 0.9, collapsed <= 0.1. Utilisation over a prompt (the collapse record)
  is diagnostics' ratio of peaks, max_t ESS / max_t TSS per unit, next to the most the rank cap
  min(t, L - t) allows.
- Separator drop: per memory layer, the total ESS (scalars) over time with a *unit-scope* relative
  tolerance, tau = 1e-3 x the largest sigma_1 over all cuts of the unit (a per-cut relative tolerance
  is blind to a uniform scaling of a cut, so it cannot see a reset at the separator itself);
  modulation = 1 - min(ESS(sep), ESS(sep + 1)) / mean ESS over the 4 cuts before the separator
  (diagnostics.modulation_at with lag 1; 1 = the state is emptied). Past scale: the median over
  units of sigma_1(H_sep) / sigma_1 before it (how far "|" scales the whole past down; a partial
  reset that keeps every singular value above the tolerance shows here, not in the count).
"""

from __future__ import annotations

import numpy as np
import torch

from .mqar import MQARTask, evaluate_model

__all__ = [
    "ESS_SEED",
    "ESS_PROMPTS",
    "UNIT_SCOPE_TOL",
    "unit_scope_ess",
    "memory_cut",
    "sweep",
    "separator_drop",
    "prompt_utilisation",
]

ESS_SEED = 30_000
ESS_PROMPTS = 4
UNIT_SCOPE_TOL = 1e-3
MODULATION_WINDOW = 4


def unit_scope_ess(layer, tol: float = UNIT_SCOPE_TOL) -> np.ndarray:
    """(U, P) tolerance-ESS with tau = tol x the largest sigma_1 over all cuts of each unit.

    Needs the full spectra (``layer.spectra_complete``); raises ValueError otherwise.
    """
    if not np.all(layer.spectra_complete):
        raise ValueError("unit-scope ESS needs every singular value: analyze without top_k and with a small prompt")
    sigma = layer.singular_values
    tau = tol * sigma[:, :, 0].max(axis=1)  # (U,)
    return (sigma > tau[:, None, None]).sum(-1)


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


def _total_over_time(model, result, index, tol) -> np.ndarray:
    lay = result.layer(index)
    return (_scalars(model, lay) * unit_scope_ess(lay, tol)).sum(0)


@torch.no_grad()
def separator_drop(
    model,
    task: MQARTask,
    n_prompts: int = ESS_PROMPTS,
    seed: int = ESS_SEED,
    tol: float = UNIT_SCOPE_TOL,
    window: int = MODULATION_WINDOW,
) -> dict:
    """Total ESS (scalars, unit-scope tolerance) around the separators, per memory layer.

    Per layer: past_scale (median over separators, prompts and units of sigma_1(H_sep) / mean
    sigma_1 before, see _sigma1_ratio) and the fraction of units scaled below 0.1;
    ess_before (mean over the ``window`` cuts before each "|"), ess_at (t = "|"),
    ess_after (t = "|" + 1), modulation = 1 - min(ess_at, ess_after) / ess_before (as
    diagnostics.modulation_at with lag = 1) and modulation_at_sep = 1 - ess_at / ess_before
    (means over separators and prompts), and the mean curve.
    """
    seps = task.separator_positions()
    if not seps:
        raise ValueError("separator_drop needs a task with separators (num_segments >= 2)")
    curves: dict[int, list[np.ndarray]] = {}
    ratios: dict[int, list[np.ndarray]] = {}
    families = {}
    for p in range(n_prompts):
        result = _analyze(model, task.sample(1, seed=seed + p).input_ids[0])
        for index in _memory_layers(result):
            curves.setdefault(index, []).append(_total_over_time(model, result, index, tol))
            ratios.setdefault(index, []).append(_sigma1_ratio(result.layer(index), seps, window))
            families[index] = result.layer(index).family
    out = {}
    for index, rows in curves.items():
        ratio = np.concatenate(ratios[index])  # (prompts x separators x units,)
        rows = np.stack(rows)  # (prompts, P); positions are 0..L-1
        before = np.stack([rows[:, s - window : s].mean(1) for s in seps], 1)  # (prompts, S)
        at = rows[:, seps]
        after = rows[:, [s + 1 for s in seps]]
        with np.errstate(all="ignore"):
            mod = np.where(before > 0, 1 - np.minimum(at, after) / before, np.nan)
            mod_sep = np.where(before > 0, 1 - at / before, np.nan)
        out[str(index)] = {
            "family": families[index],
            "ess_before": float(before.mean()),
            "ess_at": float(at.mean()),
            "ess_after": float(after.mean()),
            "modulation": float(np.nanmean(mod)),
            "modulation_at_sep": float(np.nanmean(mod_sep)),
            "past_scale": float(np.median(ratio)),
            "units_scaled_below_0.1": float(np.mean(ratio < 0.1)),
            "ess_over_time": [round(float(x), 2) for x in rows.mean(0)],
        }
    best = max(out, key=lambda i: out[i]["modulation"])
    return {
        "separators": seps,
        "window": window,
        "n_prompts": n_prompts,
        "tolerance": {"tol": tol, "scope": "unit"},
        "modulation": out[best]["modulation"],
        "layer": int(best),
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
