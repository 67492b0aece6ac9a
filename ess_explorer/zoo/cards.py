"""Model cards of the zoo: training curve, held-out accuracy, state in scalars, the difficulty
sweep (trained and untrained), utilisation over prompts, and the drop at separators.

``write_card(name)`` measures a saved model (and its untrained copy, rebuilt from the zoo spec
with the same seed) and writes card.json and README.md; the conventions are
``ess_explorer.zoo.measure``'s, copied into every card.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from .claim_names import PRIMARY, comparison_name, test_name
from .failure_card import failure_lines
from .measure import ESS_SEED, memory_cut, prompt_utilisation, separator_drop, sweep
from .measure import __doc__ as _MEASURE_DOC
from .mqar import MQARTask, evaluate_model
from .resets import control_role

__all__ = [
    "CARD_VERSION",
    "TEST_SAMPLES",
    "SWEEP_SAMPLES",
    "sweep_pairs",
    "untrained_copy",
    "measure_ess",
    "write_card",
    "separator_records",
    "render_readme",
]

CARD_VERSION = 3  # 3: time-aggregated ESS (mean / max over t), graded modulation
TEST_SAMPLES = 1024
SWEEP_SAMPLES = 512
# how a stale query (a key of an earlier segment, absent from the current one) is answered, per MQARTask.stale_answer
STALE_ANSWER_WORDS = {"none": "answer `--`", "earlier": "answer: the key's latest earlier value"}


def sweep_pairs(task: MQARTask) -> tuple[int, ...]:
    """The K values of a task's difficulty sweep: 2, 4, 8, ... up to a quarter of a segment
    (2 to 32 at 128 tokens), filled up to four values when segments are short."""
    top = task.segment_length // 2 - 1  # with_pairs needs at least one query
    ks = [k for k in (2, 4, 8, 16, 32) if k <= task.segment_length // 4]
    extra = [k for k in (1, 3, 4, 6, 12, 24) if k <= top and k not in ks]
    while len(ks) < 4 and extra:
        ks.append(extra.pop(0))
    return tuple(sorted(ks))


def measure_ess(model, task: MQARTask, n_prompts: int | None = None, seed: int = ESS_SEED) -> dict:
    """The card's ``ess`` record: ``measure.memory_cut`` (totals in scalars) plus the state label."""
    from .measure import ESS_PROMPTS

    record = memory_cut(model, task, n_prompts=ESS_PROMPTS if n_prompts is None else n_prompts, seed=seed)
    return {**record, "state": _state(record["utilisation"])}


def untrained_copy(name: str):
    """The untrained copy of zoo model ``name``: its spec's architecture, freshly initialised with the
    spec's seed (None for a name without a spec)."""
    from .specs import ZOO, build_model

    if name not in ZOO:
        return None
    return build_model(ZOO[name]).eval()


def write_card(
    name: str, folder: Path | None = None, n_samples: int = TEST_SAMPLES, evidence: tuple[dict, dict] = ({}, {})
) -> dict:
    """Measure a saved zoo model (and its untrained copy) and write card.json and README.md;
    ``evidence``: (seed replicas, claim record) for the README's seeds and claim sections
    (`seeds.evidence_records`)."""
    from transformers import AutoModelForCausalLM

    from ..sources import model_dir
    from .specs import TEST_SEED, ZOO

    folder = Path(folder) if folder is not None else model_dir(name)
    record = json.loads((folder / "training.json").read_text())
    task = MQARTask.from_dict(record["task"])
    model = AutoModelForCausalLM.from_pretrained(folder, local_files_only=True, trust_remote_code=False).eval()
    untrained = untrained_copy(name)
    ks = sweep_pairs(task)
    torch.manual_seed(0)
    with torch.no_grad():
        ess = measure_ess(model, task)
        card = {
            "card_version": CARD_VERSION,
            "name": name,
            "family": record["family"],
            "model_type": model.config.model_type,
            "architecture": type(model).__name__,
            "description": ZOO[name].description if name in ZOO else record.get("description", ""),
            "parameters": int(sum(p.numel() for p in model.parameters())),
            "state_size": _state_size(model.config),
            "task": record["task"],
            "example_prompt": task.prompt(seed=ESS_SEED),
            "training": {k: v for k, v in record["training"].items() if k != "curve"},
            "training_curve": record["training"].get("curve", []),
            "heldout": evaluate_model(model, task, n_samples=n_samples, seed=TEST_SEED),
            "ess": ess,
            "sweep": {
                "pairs": list(ks),
                "n_samples": SWEEP_SAMPLES,
                "rows": sweep(model, task, ks, n_samples=SWEEP_SAMPLES),
            },
            "utilisation": prompt_utilisation(model, task),
            "conventions": _MEASURE_DOC.split("Conventions (written into every card):\n", 1)[1].strip(),
        }
        if untrained is not None:
            card["untrained"] = {
                "seed": ZOO[name].seed,
                "ess": memory_cut(untrained, task),
                "sweep": sweep(untrained, task, ks, n_samples=SWEEP_SAMPLES),
                "utilisation": prompt_utilisation(untrained, task),
            }
        card.update(separator_records(model, name, task))
        failure = _failure_field(name)
        if failure:
            card["failure_mode"] = failure
        if task.separator_positions() and untrained is not None:
            card["untrained"]["separator_drop"] = _strip(separator_drop(untrained, task))
    (folder / "card.json").write_text(json.dumps(card, indent=2))
    (folder / "README.md").write_text(render_readme(card, *evidence))
    return card


def separator_records(model, name: str, task: MQARTask) -> dict:
    """The separator measurements of zoo model ``name`` (or of a seed replica of it), as its card
    keeps them: ``separator_drop`` on its own task's prompts when they have separators, and, for
    the control of a model in RESET_CONTROLS, ``separator_control``: the same measurement on the
    prompts of the model it controls (its reset task), so both are read on the same inputs, with
    ``control_of`` and ``trained_on_separators`` (whether the control saw '|' in training)."""
    from .specs import RESET_CONTROLS, SEGMENTED_TASK, ZOO

    out = {}
    if task.separator_positions():
        out["separator_drop"] = separator_drop(model, task)
    controlled = [k for k, v in RESET_CONTROLS.items() if v == name]
    if controlled:
        twin = ZOO[controlled[0]].task if controlled[0] in ZOO else SEGMENTED_TASK
        out["separator_control"] = {
            **separator_drop(model, twin),
            "task": twin.to_dict(),
            "control_of": controlled,
            "trained_on_separators": bool(task.separator_positions()),
        }
    return out


def _failure_field(name: str) -> dict | None:
    """The card's ``failure_mode`` field: the zoo's failure-mode record (collapse.py) for a model of a
    failure-mode pair, so a rewritten card keeps it; None for any other model or without a record."""
    from ..sources import ZOO_DIR
    from .failure_card import FAILURE_RECORD, card_field

    path = ZOO_DIR / FAILURE_RECORD
    return card_field(json.loads(path.read_text()), name) if path.is_file() else None


def _strip(drop: dict) -> dict:
    """A separator_drop record without its curves (for the untrained copy)."""
    return {
        **drop,
        "layers": {i: {k: v for k, v in lay.items() if k != "ess_over_time"} for i, lay in drop["layers"].items()},
    }


def _state(utilisation: float) -> str:
    from ..core.diagnostics import classify_utilisation

    return str(classify_utilisation(utilisation))


def _state_size(config) -> dict:
    """The architecture's state sizes, as named in its config."""
    keys = (
        "state_size",
        "head_dim",
        "value_dim",
        "num_heads",
        "num_attention_heads",
        "conv_L_cache",
        "layer_types",
        "gated",
        "expand",
        "hidden_size",
    )
    return {k: getattr(config, k) for k in keys if getattr(config, k, None) is not None}


def _curve_lines(card: dict) -> list[str]:
    curve = card["training_curve"]
    plateau = card["training"].get("plateau") or {}
    lines = ["| step | loss | validation accuracy |", "|---|---|---|"]
    step = max(1, len(curve) // 10)  # about ten rows, always the last
    for point in curve[::step] + ([curve[-1]] if curve and (len(curve) - 1) % step else []):
        lines.append(f"| {point['step']} | {point['loss']:.3f} | {point['val_accuracy']:.3f} |")
    target = card["training"].get("target_accuracy", 0.99)
    if curve:
        tr = card["training"]
        ended_by = tr.get("ended_by") or ("target" if curve[-1]["val_accuracy"] >= target else "budget")
        ended = {
            "target": f"its target validation accuracy ({100 * target:.0f}%) at step {curve[-1]['step']}",
            "plateau": f"a plateau at the full learning rate (step {tr.get('anneal_from')}), then an anneal to step "
            f"{curve[-1]['step']}",
            "budget": f"the step budget ({tr['steps_planned']} steps), at validation accuracy "
            f"{curve[-1]['val_accuracy']:.3f}",
        }[ended_by]
        lines += ["", f"Training ended at {ended}."]
    if plateau.get("change") is not None:
        if plateau["plateau"]:
            verdict = "**plateau** (< 1 point)."
        elif curve[-1]["val_accuracy"] >= target:
            verdict = f"still moving, but stopped at its target validation accuracy ({100 * target:.0f}%): converged."
        else:
            verdict = "**still moving** (>= 1 point): trained to its stated budget, not to a plateau."
        lines += [
            "",
            f"Plateau check: validation accuracy changed by {100 * plateau['change']:+.1f} points from step "
            f"{plateau['from_step']} to {plateau['to_step']} (the last 20% of training): " + verdict,
        ]
    return lines


def _sweep_lines(card: dict) -> list[str]:
    rows = card["sweep"]["rows"]
    base = {r["pairs"]: r for r in card.get("untrained", {}).get("sweep", [])}
    lines = [
        "| K | accuracy | ESS/kv mean over t | ESS/kv max over t | entropy-ESS/kv mean | TSS/kv mean | "
        "ESS/kv at t* (cut) | TSS/kv at t* | utilisation(t*) | untrained ESS/kv mean |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        u = base.get(r["pairs"])
        lines.append(
            f"| {r['pairs']} | {r['accuracy']:.3f} | {_num(r, 'ess_mean_per_kv')} | {_num(r, 'ess_max_per_kv')} | "
            f"{_num(r, 'entropy_ess_mean_per_kv')} | {_num(r, 'tss_mean_per_kv')} | {r['ess_per_kv']:.1f} | "
            f"{r['tss_per_kv']:.1f} | {r['utilisation']:.3f} | " + (f"{_num(u, 'ess_mean_per_kv')} |" if u else "- |")
        )
    return lines


def _num(record: dict, key: str) -> str:
    """One decimal, or "-" where a card written before the field existed lacks it."""
    return f"{record[key]:.1f}" if record.get(key) is not None else "-"


def _drop_lines(drop: dict) -> list[str]:
    return [
        f"- layer {i} ({lay['family']}): total ESS {lay['ess_before']:.0f} over the {drop['window']} cuts before `|`, "
        f"{lay['ess_at']:.0f} at it, {lay['ess_after']:.0f} one step after: modulation (count) **{lay['modulation']:.2f}**, "
        f"graded (nuclear norm) **{lay.get('graded_modulation', float('nan')):.2f}**; "
        f"`|` scales the past by {lay.get('past_scale', float('nan')):.2f} "
        f"(median over units; {100 * lay.get('units_scaled_below_0.1', float('nan')):.0f}% of units below 0.1)"
        for i, lay in drop["layers"].items()
    ]


def _seed_lines(card: dict, replicas: dict) -> list[str]:
    """This model beside its seed replicas (seeds.json), at the card's K: the independent runs the claim resamples."""
    k = card["task"]["num_pairs"]
    runs = [(card["training"]["seed"], card["heldout"]["accuracy"], card["sweep"]["rows"])]
    runs += [
        (r["training"]["seed"], r["heldout"]["accuracy"], r["sweep"]["rows"])
        for r in replicas.values()
        if r["replica_of"] == card["name"]
    ]
    if len(runs) < 2:
        return []
    lines = [
        "",
        "### Over training seeds",
        "",
        f"The same spec trained with other seeds (initialisation and data stream; `seeds.json`, measured as this card). "
        f"Held-out accuracy on the same test sequences, and the sweep's row at K = {k}:",
        "",
        "| seed | held-out accuracy | ESS/kv mean over t | entropy-ESS/kv mean | TSS/kv mean |",
        "|---|---|---|---|---|",
    ]
    for seed, accuracy, rows in sorted(runs):
        row = next((r for r in rows if r["pairs"] == k), {})
        lines.append(
            f"| {seed} | {accuracy:.3f} | {_num(row, 'ess_mean_per_kv')} | {_num(row, 'entropy_ess_mean_per_kv')} | "
            f"{_num(row, 'tss_mean_per_kv')} |"
        )
    return lines


def _claim_lines(card: dict, record: dict) -> list[str]:
    """The zoo claim's corrected tests that concern this model (claim.json): the main-task test it enters,
    and the same test without its family."""
    if card["name"] not in record.get("models", []) or not card["training"].get("train_pairs"):
        return []
    tests = record["tests"]["tests"]
    primary = comparison_name(PRIMARY)
    wanted = {
        "all main-task architectures": test_name("main_task", primary),
        f"without the {card['family']} family": test_name("main_task", primary, card["family"]),
    }
    lines = [
        "",
        "### In the zoo's claim",
        "",
        f"Spearman(ESS/kv, accuracy) - Spearman(TSS/kv, accuracy), ESS aggregated as the mean over t, over every "
        f"(model, K, seed) point; each test corrected for all {record['tests']['m']} the claim runs (zoo README):",
        "",
    ]
    for label, name in wanted.items():
        if name in tests:
            t = tests[name]
            lines.append(
                f"- {label}: {t['difference']:+.2f}, Bonferroni interval [{t['bonferroni_interval'][0]:+.2f}, "
                f"{t['bonferroni_interval'][1]:+.2f}], Holm p {t['p_holm']:.3f}: "
                + ("holds." if t["holds"] else "does not hold after correction.")
            )
    return lines


def render_readme(card: dict, replicas: dict | None = None, claim_record: dict | None = None) -> str:
    """The human-readable model card (Markdown) for a card dict; ``replicas`` (seeds.json) and
    ``claim_record`` (claim.json) add the model's seeds and the claim's tests that concern it."""
    ess, task, tr, held = card["ess"], card["task"], card["training"], card["heldout"]
    name = card["name"]
    seg = task["num_segments"]
    sep_text = (
        " separated by `|`"
        if seg > 1 and task.get("separators", True)
        else " back to back (no separator)"
        if seg > 1
        else ""
    )
    stale = task.get("stale_queries", 0)
    lines = [
        f"# {name}",
        "",
        card["description"],
        "",
        f"A tiny `{card['architecture']}` (model_type `{card['model_type']}`, {card['parameters']:,} parameters, float32) "
        "trained from scratch on multi-query associative recall (MQAR) for the ess-explorer zoo. Load it offline with "
        f'`ess_explorer.zoo.load("{name}")` or `load_model("zoo:{name}")`.',
        "",
        "## Task",
        "",
        f"- {task['num_pairs']} key-value pairs then {task['num_queries']} queries per segment, {seg} segment(s){sep_text}; "
        f"sequence length {task['length']}; {task['num_keys']} keys (syllables), {task['num_values']} values (two-digit strings).",
    ]
    if stale:
        lines.append(
            f"- In every segment after the first, {stale} of the queries ask a key of an earlier segment that is absent "
            "from the current one; the right answer is `--` (not in this segment), so old bindings must be dropped at `|`."
        )
    if tr.get("train_pairs"):
        lines.append(
            f"- Training draws K from {tr['train_pairs']} (one K per batch, in turn) at the same length; the card's K is "
            f"{task['num_pairs']}."
        )
    lines += [
        f"- Example: `{' '.join(card['example_prompt'].split()[:16])} ...`",
        "",
        "## Training",
        "",
        f"- {tr['steps_run']} of {tr['steps_planned']} planned steps (stops early at {100 * tr.get('target_accuracy', 0.99):.0f}% "
        f"validation accuracy), batch {tr['batch_size']}, peak lr {tr['lr']}, {tr['optimizer']}, weight decay "
        f"{tr['weight_decay']}, seed {tr['seed']}; {tr['wall_seconds']} s on {tr['threads']} CPU thread(s) of a shared machine.",
        f"- Reproduce: `python -m ess_explorer.zoo.train --only {name}` (CPU, one thread, fixed seeds).",
        "",
    ]
    lines += _curve_lines(card)
    held_text = (
        f"- Held-out exact-match accuracy: **{held['accuracy']:.4f}** per query ({held['n_queries']} queries, "
        f"{held['n_samples']} sequences, seed {held['seed']}); whole-sequence exact match {held['sequence_accuracy']:.4f}."
    )
    if "stale_accuracy" in held:
        held_text += (
            f" Stale queries ({STALE_ANSWER_WORDS[card['task'].get('stale_answer', 'none')]}): "
            f"{held['stale_accuracy']:.4f}; the others: {held['recall_accuracy']:.4f}."
        )
    lines += [
        "",
        "## Results",
        "",
        held_text,
        f"- Over time (the paper's reading; largest layer total in scalars, cuts t = 1..L-1): ESS mean "
        f"{ess.get('ess_mean', float('nan')):.0f}, max {ess.get('ess_max', float('nan')):.0f}; entropy-ESS mean "
        f"{ess.get('entropy_ess_mean', float('nan')):.0f}; TSS mean {ess.get('tss_mean', float('nan')):.0f}, max "
        f"{ess.get('tss_max', float('nan')):.0f} scalars.",
        f"- Single-cut variant, t* = {ess['cut']} (after the pairs of the first segment; no unit can exceed rank "
        f"{ess['cut']} there); memory layer {ess['memory_layer']}: "
        f"ESS = {ess['ess']:.0f}, TSS = {ess['tss']:.0f} scalars; ESS/kv = {ess['ess_per_kv']:.1f}, TSS/kv = "
        f"{ess['tss_per_kv']:.1f}; utilisation at t* {ess['utilisation']:.3f} (**{ess['state']}**; the rank cap "
        f"min(t*, L - t*) allows at most {ess.get('rank_cap_allows', float('nan')):.3f} at this cut).",
    ]
    if "untrained" in card:
        u = card["untrained"]["ess"]
        lines.append(
            f"- Untrained copy (same architecture and seed): ESS = {u['ess']:.0f} scalars (ESS/kv {u['ess_per_kv']:.1f}), "
            f"utilisation at t* {u['utilisation']:.3f}. "
            + (
                "Training *lowered* ESS: at this size the untrained architecture already fills most of what the prompt "
                "allows, and training prunes it."
                if u["ess"] > ess["ess"]
                else "Training raised ESS."
            )
        )
    util = card["utilisation"]
    lines += [
        "",
        "### Utilisation over whole prompts",
        "",
        "| layer | utilisation (ratio of peaks) | the rank cap allows | untrained copy |",
        "|---|---|---|---|",
    ]
    base = card.get("untrained", {}).get("utilisation", {}).get("layers", {})
    for i, lay in util["layers"].items():
        b = base.get(i)
        lines.append(
            f"| {i} | {lay['utilisation']:.3f} | {lay['rank_cap_allows']:.3f} | "
            + (f"{b['utilisation']:.3f} |" if b else "- |")
        )
    lines += [
        "",
        "### Difficulty sweep (held-out, not retrained)",
        "",
        f"Accuracy and state at the memory cut as the number of pairs K grows at a fixed length "
        f'({card["sweep"]["n_samples"]} sequences per K). Redraw: `zoo.sweep_difficulty("{name}")`.',
        "",
    ]
    lines += _sweep_lines(card)
    lines += _seed_lines(card, replicas or {})
    lines += _claim_lines(card, claim_record or {})
    lines += failure_lines(card)
    if "separator_drop" in card:
        drop = card["separator_drop"]
        lines += [
            "",
            "### Drop at the separators",
            "",
            f"The project's one modulation (layer totals in scalars; count: tolerance 1e-3 x the unit's largest "
            f"sigma_1; graded: nuclear norm of the cuts), mean over {drop['n_prompts']} prompts, separators at "
            f"{drop['separators']}; the model's count modulation {drop['modulation']:.2f} (layer {drop['layer']}), "
            f"graded {drop.get('graded_modulation', float('nan')):.2f} (layer {drop.get('graded_layer', '-')}):",
            "",
        ]
        lines += _drop_lines(drop)
        if "untrained" in card and "separator_drop" in card["untrained"]:
            lines += ["", "Untrained copy:", ""] + _drop_lines(card["untrained"]["separator_drop"])
    if "separator_control" in card:
        drop = card["separator_control"]
        lines += [
            "",
            f"### {control_role(drop)} (for {', '.join(drop['control_of'])}, on its prompts)",
            "",
            f"Its prompts ({drop['task']['num_segments']} segments of {drop['task']['num_pairs']} pairs, "
            f"separators at {drop['separators']}), same measurement:",
            "",
        ]
        lines += _drop_lines(drop)
    lines += ["", "## Conventions", "", card["conventions"], ""]
    return "\n".join(lines)
