"""The advice's data: frozen records of what ``advise`` (sweep/advice.py) computed, with
``to_dict`` / ``to_json`` / ``to_frame``. Conventions are in sweep/advice.py."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from ..atomic import atomic_write
from ..io import jsonable

__all__ = ["Estimate", "Distribution", "LayerAdvice", "Advice"]


@dataclass(frozen=True)
class Estimate:
    """A number with its bootstrap interval over prompts."""

    value: float
    low: float
    high: float

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class Distribution:
    """The ESS of one variant over a layer's cuts: per unit (pooled over units and cuts) and
    per (prompt, t) layer total in scalars. ``levels`` are the quantiles, ``per_unit`` and
    ``scalars`` the state covering each (same order), ``mean_*`` the means."""

    variant: str
    levels: tuple[float, ...]
    per_unit: tuple[Estimate, ...]
    scalars: tuple[Estimate, ...]
    mean_per_unit: Estimate
    mean_scalars: Estimate
    n_cuts: int

    def to_dict(self) -> dict:
        return {
            "variant": self.variant,
            "n_cuts": self.n_cuts,
            "mean_per_unit": self.mean_per_unit.to_dict(),
            "mean_scalars": self.mean_scalars.to_dict(),
            "quantiles": [
                {"q": q, "per_unit": u.to_dict(), "scalars": s.to_dict()}
                for q, u, s in zip(self.levels, self.per_unit, self.scalars)
            ],
        }


@dataclass(frozen=True)
class LayerAdvice:
    """The advice for one layer of one run (model, checkpoint_step). See the module docstring.

    kind: "recurrent" or "attention". units: units of the layer; channels: scalar channels
    (sum of multiplicities). state_per_unit / state_scalars: the state it has (attention: at
    its longest cut, the KV cache). advised_per_unit / advised_scalars: the state covering the
    quantile (of ``Advice.variant``). ratio: advised / state per unit. units_active: units whose
    own quantile is at least 1 (the others hold nothing at that level). coverage: (n, fraction
    of per-unit cuts with ESS <= n). ceiling_use, ceiling_peak, full_attention_state (the state
    the same rule advises for a generic full-attention head on these cuts), kv_heads, head_dim,
    candidate: attention only (None otherwise).
    """

    model: str
    checkpoint_step: int | None
    layer: int
    family: str
    kind: str
    units: int
    channels: int
    length: int
    state_per_unit: float
    state_scalars: float
    advised_per_unit: Estimate
    advised_scalars: Estimate
    ratio: Estimate
    units_active: int
    coverage: tuple[tuple[int, Estimate], ...]
    distributions: tuple[Distribution, ...]
    ceiling_use: Estimate | None = None
    ceiling_peak: int | None = None
    full_attention_state: int | None = None
    kv_heads: int | None = None
    head_dim: int | None = None
    candidate: bool | None = None

    def distribution(self, variant: str) -> Distribution | None:
        """The distribution of ``variant`` (None where the sweep has no finite value of it)."""
        for dist in self.distributions:
            if dist.variant == variant:
                return dist
        return None

    def to_dict(self) -> dict:
        out = {
            name: getattr(self, name)
            for name in (
                "model",
                "checkpoint_step",
                "layer",
                "family",
                "kind",
                "units",
                "channels",
                "length",
                "state_per_unit",
                "state_scalars",
                "units_active",
                "ceiling_peak",
                "full_attention_state",
                "kv_heads",
                "head_dim",
                "candidate",
            )
        }
        for name in ("advised_per_unit", "advised_scalars", "ratio", "ceiling_use"):
            value = getattr(self, name)
            out[name] = None if value is None else value.to_dict()
        out["coverage"] = [{"n": n, **estimate.to_dict()} for n, estimate in self.coverage]
        out["distributions"] = {d.variant: d.to_dict() for d in self.distributions}
        return jsonable(out)


@dataclass(frozen=True)
class Advice:
    """What ``advise`` returns: one LayerAdvice per (model, checkpoint_step, layer) and the
    data the numbers rest on (``data``: models, prompts, lengths, tolerance, scope, gates,
    precision, dtype, the bootstrap's settings)."""

    quantile: float
    variant: str
    confidence: float
    layers: tuple[LayerAdvice, ...]
    data: dict = field(default_factory=dict)

    def layer(self, index: int, model: str | None = None) -> LayerAdvice:
        """The advice of layer ``index`` (of ``model`` when the sweep has several)."""
        found = [a for a in self.layers if a.layer == index and (model is None or a.model == model)]
        if not found:
            raise KeyError(f"no advice for layer {index}" + (f" of {model!r}" if model else ""))
        if len(found) > 1:
            raise KeyError(f"layer {index} appears in several runs; pass model= (one of {[a.model for a in found]})")
        return found[0]

    def to_dict(self) -> dict:
        return jsonable(
            {
                "quantile": self.quantile,
                "variant": self.variant,
                "confidence": self.confidence,
                "data": self.data,
                "layers": [a.to_dict() for a in self.layers],
            }
        )

    def to_json(self, path=None, *, indent: int = 2) -> str:
        """The advice as JSON text; written atomically to ``path`` when given."""
        text = json.dumps(self.to_dict(), indent=indent)
        if path is not None:
            atomic_write(Path(path), text.encode("utf-8"))
        return text

    def to_frame(self) -> pd.DataFrame:
        """One row per layer: the advice's headline numbers with their intervals."""
        rows = []
        for a in self.layers:
            row = {
                "model": a.model,
                "checkpoint_step": a.checkpoint_step,
                "layer": a.layer,
                "family": a.family,
                "kind": a.kind,
                "state_per_unit": a.state_per_unit,
                "state_scalars": a.state_scalars,
            }
            for name in ("advised_per_unit", "advised_scalars", "ratio", "ceiling_use"):
                value = getattr(a, name)
                row[name] = np.nan if value is None else value.value
                row[f"{name}_low"] = np.nan if value is None else value.low
                row[f"{name}_high"] = np.nan if value is None else value.high
            row["candidate"] = a.candidate
            rows.append(row)
        return pd.DataFrame(rows)
