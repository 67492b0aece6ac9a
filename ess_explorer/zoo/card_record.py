"""A zoo model card read into a typed record: `read_card(name)` -> `ModelCard`.

card.json (written by cards.write_card) is a nested dict whose keys are the writer's; a
notebook or the explorer that guesses them (``card.get("difficulty") or card.get("sweep")``)
breaks silently when the writer changes. `read_card` is the one reader: it names every field
a caller may rely on, checks that the card has them, and keeps the whole dict in ``raw`` for
anything else. Numbers mean what the card's ``conventions`` text says (zoo/measure.py): state
counted in scalars, ESS at the memory cut t* = 2K, averaged over the card's prompts.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..sources import card as _card_dict
from ..sources import list_models

__all__ = ["CardLayer", "ModelCard", "read_card"]


@dataclass(frozen=True)
class CardLayer:
    """One memory layer at the memory cut t*: totals in scalars (sum over units of
    multiplicity x ESS), ``utilisation`` = mean over units of ESS(t*) / TSS(t*)."""

    index: int
    family: str
    unit_kind: str
    n_units: int
    multiplicity: int
    ess: float
    entropy_ess: float
    tss: float
    utilisation: float


@dataclass(frozen=True)
class ModelCard:
    """The fields of a zoo model card that callers read.

    ``main_task``: trained on the main task (K drawn from a range: the models of zoo.claim's
    "main task" group). ``accuracy``: held-out exact-match recall over ``n_queries`` queries. ``memory_layer``: the
    memory layer with the largest total ESS at t* (the one the explorer opens on). ``ess``,
    ``entropy_ess``, ``tss``: that layer's totals at t*, ``*_per_kv`` the same divided by K
    (``pairs``). ``state``: saturated / normal / collapsed by the utilisation at t*.
    ``sweep``: the difficulty sweep, one dict per number of pairs (keys ``pairs``,
    ``accuracy``, ``ess_per_kv``, ``entropy_ess_per_kv``, ``tss_per_kv``, ...).
    ``prompt_utilisation``: per memory layer, the ratio of peaks over the card's prompts
    (diagnostics against TSS), ``prompt_rank_cap`` the most that ratio can be on those prompts
    (the rank cap min(t, L - t) over TSS). ``separator_drop`` / ``separator_control``: the records of
    models measured at separators (None when the card has none). ``failure_mode``: for the two
    models of a collapse failure-mode pair (zoo/collapse.py), the pair's reading over seeds and
    fresh prompts and its verdict (None for every other model). ``raw``: the whole card."""

    name: str
    family: str
    model_type: str
    description: str
    parameters: int
    task: dict
    segments: int
    main_task: bool
    pairs: int
    length: int
    example_prompt: str
    accuracy: float
    n_queries: int
    cut: int
    memory_layer: int
    ess: float
    entropy_ess: float
    tss: float
    ess_per_kv: float
    entropy_ess_per_kv: float
    tss_per_kv: float
    utilisation: float
    state: str
    layers: dict[int, CardLayer]
    sweep: tuple[dict, ...]
    prompt_utilisation: dict[int, float]
    prompt_rank_cap: dict[int, float]
    separator_drop: dict | None = None
    separator_control: dict | None = None
    failure_mode: dict | None = None
    raw: dict = field(default_factory=dict, repr=False)


def read_card(name: str) -> ModelCard:
    """The card of zoo model ``name`` as a `ModelCard`.

    Raises ValueError naming the zoo's models for an unknown name, and naming the missing
    field for a card that lacks one (rewrite it with ``zoo.cards.write_card(name)``)."""
    if name not in list_models():
        raise ValueError(f"no zoo model {name!r}; the zoo has {', '.join(list_models())}")
    raw = _card_dict(name)
    try:
        ess, task, heldout = raw["ess"], raw["task"], raw["heldout"]
        layers = {
            int(i): CardLayer(
                index=int(i),
                family=str(d["family"]),
                unit_kind=str(d["unit_kind"]),
                n_units=int(d["n_units"]),
                multiplicity=int(d.get("multiplicity", 1)),
                ess=float(d["ess"]),
                entropy_ess=float(d["entropy_ess"]),
                tss=float(d["tss"]),
                utilisation=float(d["utilisation"]),
            )
            for i, d in ess["layers"].items()
        }
        record = ModelCard(
            name=name,
            family=str(raw["family"]),
            model_type=str(raw["model_type"]),
            description=str(raw["description"]),
            parameters=int(raw["parameters"]),
            task=dict(task),
            segments=int(task.get("num_segments", 1)),
            main_task=bool(raw["training"].get("train_pairs")),
            pairs=int(task["num_pairs"]),
            length=int(task["length"]),
            example_prompt=str(raw["example_prompt"]),
            accuracy=float(heldout["accuracy"]),
            n_queries=int(heldout["n_queries"]),
            cut=int(ess["cut"]),
            memory_layer=int(ess["memory_layer"]),
            ess=float(ess["ess"]),
            entropy_ess=float(ess["entropy_ess"]),
            tss=float(ess["tss"]),
            ess_per_kv=float(ess["ess_per_kv"]),
            entropy_ess_per_kv=float(ess["entropy_ess_per_kv"]),
            tss_per_kv=float(ess["tss_per_kv"]),
            utilisation=float(ess["utilisation"]),
            state=str(ess["state"]),
            layers=layers,
            sweep=tuple(dict(row) for row in raw["sweep"]["rows"]),
            prompt_utilisation={
                int(i): float(d["utilisation"]) for i, d in raw["utilisation"].get("layers", {}).items()
            },
            prompt_rank_cap={
                int(i): float(d["rank_cap_allows"]) for i, d in raw["utilisation"].get("layers", {}).items()
            },
            separator_drop=raw.get("separator_drop"),
            separator_control=raw.get("separator_control"),
            failure_mode=raw.get("failure_mode"),
            raw=raw,
        )
    except KeyError as missing:
        raise ValueError(
            f"the card of {name!r} has no field {missing}; rewrite it with zoo.cards.write_card({name!r})"
        ) from None
    return record
