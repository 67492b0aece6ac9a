"""Model cards of the zoo: held-out accuracy, TSS, measured ESS, ESS/kv, utilisation.

Conventions (also written into every card):
- ESS is measured by ``ess_explorer.analyze`` (tolerance-ESS, relative tol 1e-3, the
  project default; entropy-ESS alongside) on 4 held-out prompts of the model's task
  (seeds 30000..30003), and averaged.
- The *memory cut* is t* = 2K, right after the K key-value pairs of the first segment:
  H_{t*} maps the stored pairs to every later output, so its rank is the state the model
  actually carries from the pairs to the queries.
- Memory layers: every analysed layer except gated short convolutions (their state,
  kernel - 1 = 2 past tokens per channel, cannot carry pairs to the queries).
- Layer total ESS = sum over its units (heads or channels) of ESS(t*); likewise TSS.
  Model ESS = the largest layer total over memory layers (one layer has to hold the
  pairs); model TSS = the largest layer TSS. ESS/kv and TSS/kv divide by K.
- Utilisation of a layer = mean over units of ESS(t*) / TSS(t*); the model's is that of
  its memory layer with the largest total ESS. Saturated >= 0.9, collapsed <= 0.1
  (diagnostics.SATURATED_AT / COLLAPSED_AT). The cards also keep diagnostics'
  layer_diagnostics (peak over time) per layer.
- Separator drop (segmented tasks): per memory layer, the total ESS over time, averaged
  over prompts; diagnostics.modulation_at(window=4) at each "|" (1 = the state is emptied).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch

from ..core.diagnostics import COLLAPSED_AT, SATURATED_AT, classify_utilisation, layer_diagnostics, modulation_at
from .mqar import MQARTask, evaluate_model

__all__ = ["ESS_SEED", "ESS_PROMPTS", "measure_ess", "separator_drop", "write_card", "render_readme"]

ESS_SEED = 30_000
ESS_PROMPTS = 4
TEST_SAMPLES = 1024
CARD_VERSION = 1


def _analyze(model, ids: torch.Tensor):
    from ..analysis import analyze

    return analyze(model, input_ids=ids, progress=False, keep_operators=None)


def _memory_layers(result) -> list[int]:
    return [i for i, lay in sorted(result.layers.items()) if lay.family != "short_conv"]


def measure_ess(model, task: MQARTask, n_prompts: int = ESS_PROMPTS, seed: int = ESS_SEED) -> dict:
    """ESS at the memory cut t* = task.context_end(0), per layer and for the model (see module doc)."""
    t_star = task.context_end(0)
    per_layer: dict[int, dict] = {}
    for p in range(n_prompts):
        ids = task.sample(1, seed=seed + p).input_ids[0]
        result = _analyze(model, ids)
        column = int(np.searchsorted(result.layer(next(iter(result.layers))).positions, t_star))
        for index, lay in result.layers.items():
            ess_t = lay.tolerance_ess[:, column].astype(np.float64)
            ent_t = lay.entropy_ess[:, column]
            tss_t = lay.tss[:, column]
            diag = layer_diagnostics(lay)
            rec = per_layer.setdefault(index, {"family": lay.family, "unit_kind": lay.unit_kind, "n_units": lay.n_units, "rows": []})
            rec["rows"].append(
                {
                    "total_ess": float(ess_t.sum()),
                    "total_entropy_ess": float(ent_t.sum()),
                    "mean_ess": float(ess_t.mean()),
                    "total_tss": float(tss_t.sum()),
                    "utilisation": float(np.mean(np.divide(ess_t, tss_t, out=np.zeros_like(ess_t), where=tss_t > 0))),
                    "peak_utilisation": float(diag["utilisation"]),
                    "n_saturated_units": diag["n_saturated"],
                    "n_collapsed_units": diag["n_collapsed"],
                }
            )
    layers = {}
    for index, rec in per_layer.items():
        rows = rec.pop("rows")
        mean = {k: float(np.mean([r[k] for r in rows])) for k in rows[0]}
        mean["state"] = str(classify_utilisation(mean["utilisation"]))
        mean["peak_state"] = str(classify_utilisation(mean["peak_utilisation"]))
        layers[index] = {**rec, **mean}
    memory = [i for i in sorted(layers) if layers[i]["family"] != "short_conv"]
    if not memory:
        raise ValueError("the model has no memory layer (only short convolutions)")
    main = max(memory, key=lambda i: layers[i]["total_ess"])
    k = task.num_pairs
    ess, tss = layers[main]["total_ess"], max(layers[i]["total_tss"] for i in memory)
    return {
        "cut": t_star,
        "n_prompts": n_prompts,
        "seed": seed,
        "memory_layer": main,
        "ess": ess,
        "entropy_ess": layers[main]["total_entropy_ess"],
        "tss": tss,
        "ess_per_kv": ess / k,
        "entropy_ess_per_kv": layers[main]["total_entropy_ess"] / k,
        "tss_per_kv": tss / k,
        "utilisation": layers[main]["utilisation"],
        "state": layers[main]["state"],
        "layers": {str(i): layers[i] for i in sorted(layers)},
    }


def separator_drop(model, task: MQARTask, n_prompts: int = ESS_PROMPTS, seed: int = ESS_SEED, window: int = 4) -> dict:
    """ESS over time around the separators of a segmented task, per memory layer.

    Returns {"separators": [...], "layers": {i: {"ess_before", "ess_at", "ess_after",
    "modulation", "modulation_after"}}} where ess_before is the mean total ESS over the
    ``window`` cuts before each separator, ess_at the total ESS at the cut t = separator and
    ess_after at t = separator + 1 (all averaged over separators and prompts);
    modulation(_after) = diagnostics.modulation_at at those cuts (mean over separators, prompts).

    Why both cuts: every path from the past into H_sep passes the state update at the
    separator, so a reset there (decay -> 0) scales H_sep as a whole (exactly so for a
    scalar decay per unit) and a *relative* tolerance does not see it; at t = sep + 1 the
    separator's own input is undecayed while everything older is scaled down, so a reset
    shows as a drop there.
    """
    seps = task.separator_positions()
    if not seps:
        raise ValueError("separator_drop needs a segmented task (num_segments >= 2)")
    curves: dict[int, list[np.ndarray]] = {}
    families: dict[int, str] = {}
    positions = None
    for p in range(n_prompts):
        ids = task.sample(1, seed=seed + p).input_ids[0]
        result = _analyze(model, ids)
        for index in _memory_layers(result):
            lay = result.layer(index)
            positions = lay.positions
            curves.setdefault(index, []).append(lay.tolerance_ess.sum(0).astype(np.float64))
            families[index] = lay.family
    out = {}
    for index, rows in curves.items():
        mean_curve = np.mean(rows, axis=0)
        mods = np.stack([modulation_at(r, positions, seps, window=window) for r in rows])
        after = [s + 1 for s in seps]
        mods_after = np.stack([modulation_at(r, positions, after, window=window) for r in rows])
        col = {int(t): c for c, t in enumerate(positions)}
        before = [mean_curve[[col[t] for t in range(s - window, s)]].mean() for s in seps]
        out[str(index)] = {
            "family": families[index],
            "ess_before": float(np.mean(before)),
            "ess_at": float(np.mean([mean_curve[col[s]] for s in seps])),
            "ess_after": float(np.mean([mean_curve[col[s]] for s in after])),
            "modulation": float(np.nanmean(mods)),
            "modulation_after": float(np.nanmean(mods_after)),
            "ess_over_time": [round(float(x), 3) for x in mean_curve],
        }
    return {"separators": seps, "window": window, "n_prompts": n_prompts, "layers": out}


def write_card(name: str, folder: Path | None = None, n_samples: int = TEST_SAMPLES) -> dict:
    """Measure a saved zoo model and write card.json and README.md into its folder."""
    from transformers import AutoModelForCausalLM

    from . import model_dir
    from .train import TEST_SEED, ZOO

    folder = Path(folder) if folder is not None else model_dir(name)
    record = json.loads((folder / "training.json").read_text())
    task = MQARTask.from_dict(record["task"])
    model = AutoModelForCausalLM.from_pretrained(folder, local_files_only=True).eval()
    torch.manual_seed(0)
    with torch.no_grad():
        heldout = evaluate_model(model, task, n_samples=n_samples, seed=TEST_SEED)
        ess = measure_ess(model, task)
        card = {
            "card_version": CARD_VERSION,
            "name": name,
            "family": record["family"],
            "model_type": model.config.model_type,
            "architecture": type(model).__name__,
            "description": record.get("description", ""),
            "parameters": int(sum(p.numel() for p in model.parameters())),
            "state_size": _state_size(model.config),
            "task": record["task"],
            "example_prompt": task.prompt(seed=ESS_SEED),
            "training": {k: v for k, v in record["training"].items() if k != "curve"},
            "training_curve": record["training"].get("curve", []),
            "heldout": heldout,
            "ess": ess,
            "thresholds": {"saturated": SATURATED_AT, "collapsed": COLLAPSED_AT},
            "conventions": __doc__.split("Conventions (also written into every card):\n", 1)[1].strip(),
        }
        if task.num_segments > 1:
            card["separator_drop"] = separator_drop(model, task)
        else:  # control: the same measurement on segmented prompts this model was never trained on
            from .train import SEGMENTED_TASK

            card["separator_control"] = {**separator_drop(model, SEGMENTED_TASK), "task": SEGMENTED_TASK.to_dict()}
    if name in ZOO and ZOO[name].description:
        card["description"] = ZOO[name].description
    (folder / "card.json").write_text(json.dumps(card, indent=2))
    (folder / "README.md").write_text(render_readme(card))
    return card


def _state_size(config) -> dict:
    """The architecture's state sizes, as named in its config."""
    keys = ("state_size", "head_dim", "num_heads", "num_attention_heads", "conv_L_cache", "layer_types", "gated", "expand", "hidden_size")
    return {k: getattr(config, k) for k in keys if getattr(config, k, None) is not None}


def render_readme(card: dict) -> str:
    """The human-readable model card (Markdown) for a card dict."""
    ess, task, tr, held = card["ess"], card["task"], card["training"], card["heldout"]
    lines = [
        f"# {card['name']}",
        "",
        card["description"],
        "",
        f"A tiny `{card['architecture']}` (model_type `{card['model_type']}`, {card['parameters']:,} parameters, float32) "
        f"trained from scratch on multi-query associative recall (MQAR) for the ess-explorer zoo. "
        "Load it offline with `AutoModelForCausalLM.from_pretrained(this_folder)` after `import ess_explorer.zoo` "
        "(which registers the project's own linear-attention family), or `ess_explorer.zoo.load(name)`.",
        "",
        "## Task",
        "",
        f"- {task['num_pairs']} key-value pairs then {task['num_queries']} queries per segment, {task['num_segments']} segment(s)"
        + (" separated by `|` (keys reset after it)" if task["num_segments"] > 1 else "")
        + f"; sequence length {task['length']}; {task['num_keys']} keys (syllables), {task['num_values']} values (two-digit strings).",
        f"- Example: `{' '.join(card['example_prompt'].split()[:12])} ...`; the model answers each queried key with its value.",
        "",
        "## Training",
        "",
        f"- {tr['steps_run']} of {tr['steps_planned']} planned steps (stops early at {100 * tr.get('target_accuracy', 0.99):.0f}% "
        f"validation accuracy), batch {tr['batch_size']}, "
        f"peak lr {tr['lr']}, {tr['optimizer']}, weight decay {tr['weight_decay']}, seed {tr['seed']}.",
        f"- {tr['wall_seconds']} s with {tr['threads']} torch thread(s) on a shared 2-core CPU. Reproduce: "
        f"`python -m ess_explorer.zoo.train --only {card['name']}`.",
        "",
        "## Results",
        "",
        f"- Held-out exact-match accuracy: **{held['accuracy']:.4f}** per query ({held['n_queries']} queries, "
        f"{held['n_samples']} sequences, seed {held['seed']}); whole-sequence exact match {held['sequence_accuracy']:.4f}.",
        f"- Memory cut t* = {ess['cut']} (after the pairs); memory layer {ess['memory_layer']}: "
        f"ESS = {ess['ess']:.1f}, TSS = {ess['tss']:.0f}, ESS/kv = {ess['ess_per_kv']:.2f}, TSS/kv = {ess['tss_per_kv']:.2f}, "
        f"utilisation ESS/TSS = {ess['utilisation']:.3f} (**{ess['state']}**).",
        "",
        "| layer | family | units | total ESS(t*) | total TSS(t*) | utilisation(t*) | state | peak utilisation (diagnostics) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for index, lay in ess["layers"].items():
        lines.append(
            f"| {index} | {lay['family']} | {lay['n_units']} {lay['unit_kind']}s | {lay['total_ess']:.1f} | {lay['total_tss']:.0f} | "
            f"{lay['utilisation']:.3f} | {lay['state']} | {lay['peak_utilisation']:.3f} |"
        )
    if "separator_drop" in card:
        drop = card["separator_drop"]
        lines += ["", f"Separator drop (total ESS, mean over {drop['n_prompts']} prompts, separators at {drop['separators']}):", ""]
        lines += _drop_lines(drop)
    if "separator_control" in card:
        drop = card["separator_control"]
        lines += ["", f"Control: on segmented prompts it was not trained on ({drop['task']['num_segments']} segments of "
                  f"{drop['task']['num_pairs']} pairs, separators at {drop['separators']}):", ""]
        lines += _drop_lines(drop)
    lines += ["", "## Conventions", "", card["conventions"], ""]
    return "\n".join(lines)


def _drop_lines(drop: dict) -> list[str]:
    """One line per layer of a separator_drop record (trained-on or control prompts)."""
    return [
        f"- layer {index}: ESS {lay['ess_before']:.1f} in the {drop['window']} cuts before `|`, {lay['ess_at']:.1f} at it, "
        f"{lay['ess_after']:.1f} one step after (modulation {lay['modulation']:.2f} at `|`, {lay['modulation_after']:.2f} after)"
        for index, lay in drop["layers"].items()
    ]
