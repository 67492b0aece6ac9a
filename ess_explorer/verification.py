"""verify: check a result's numbers against plain SVDs of its cuts, on a sample.

The engine's fast routes (Gram and Gramian eigenvalues, shared factors, compiled kernels)
each meet an accuracy contract (docs/spectra.md). `verify` lets a reader check that on their
own model and prompt, with the shortest reference there is: it runs the model again on the
result's token ids (one forward pass, the result's gates), materialises the dense T of a
sample of units (the layer's own operators, the same T the engine read), and takes
``torch.linalg.svdvals`` of each sampled cut H_t = T[t:, :t] in float64 (a cut whose sigma_1
lies below float64's normal range read as zero, as the engine reads it:
`precision.zero_subnormal_cuts`). Against those it checks, under the contract the result was
computed with (meta["precision"]):

- tolerance-ESS: equal, except where an SVD value lies within TAU_BAND (1e-6, relative) of tau;
- entropy-ESS: within ENTROPY_TOLERANCE (1e-5) of the SVD's, relative;
- the kept singular values that a view draws (above `Accuracy.drawn_floor`: round-off, and
  the contract's resolution under "ess"): within 1e-6 sigma_k + 1e-10 sigma_1 under "exact";
  within the resolution times sigma_1 plus 1e-6 sigma_k under "ess".

- causal ESS, where the family has a realisation (recurrences, short convolutions): equal to
  the count of sigma(R_t) from the exact sweep of the layer's own realisation (core/causal.py:
  a QR and an SVD per step, not the Gramians' eigenvalues), except where one lies within
  TAU_BAND of tau. Attention's causal ESS is its KV cache (t), by definition, and is not
  re-derived; under the scope "layer" with a relative tolerance causal ESS is not checked
  (its tau would need every unit's sweep).

Under the scopes "unit" and "layer", tau refers to the largest sigma_1 over the unit's or
layer's cuts; the unsampled cuts' sigma_1 come from the result (each sampled cut's own sigma_1
is among the values checked); for causal ESS under "unit", from the sweep, which gives every cut.

The check rests on the forward pass giving the T the analysis read. A model whose pass is not
bitwise reproducible (a BLAS that splits its sums by the threads it gets, a top-k selection on
near-tied scores) can give another T. Where the result kept a unit's T whole (its ``operators``,
float32), each checked unit's T of this pass is compared with it, and the report says where
they differ: a failure there may be the model's, not the engine's.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from .analysis import capture_layers
from .core.gates import DEFAULT_GATES
from .core.precision import EXACT, TAU_BAND, zero_subnormal_cuts
from .result import ESSResult

__all__ = ["verify", "Verification", "ENTROPY_TOLERANCE"]

ENTROPY_TOLERANCE = 1e-5  # both contracts' entropy-ESS, relative (docs/spectra.md)
EXACT_RELATIVE, EXACT_ABSOLUTE = 1e-6, 1e-10  # "exact": every value within 1e-6 sigma_k + 1e-10 sigma_1


@dataclass
class Verification:
    """What `verify` compared: one row per (layer, unit, cut) checked, and the contract.

    Each row: layer, unit (the result's row), t, tolerance_ess and tolerance_ess_svd,
    near_tau (an SVD value within TAU_BAND of tau: the counts may differ there),
    entropy_ess, entropy_ess_svd, entropy_error (relative), values_error (the worst kept
    value's distance from the SVD's, as a fraction of what the contract allows: at most 1
    passes), causal_ess, causal_ess_sweep and causal_near_tau (None where causal ESS is not
    checked), operator_change (the largest |T - T kept by the result| of the unit, float32;
    None where the result did not keep its T whole) and ok."""

    precision: str
    rows: list[dict] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return all(row["ok"] for row in self.rows)

    @property
    def failures(self) -> list[dict]:
        return [row for row in self.rows if not row["ok"]]

    def to_frame(self):
        """The rows as a pandas DataFrame."""
        import pandas as pd

        return pd.DataFrame(self.rows)

    def __str__(self) -> str:
        if not self.rows:
            return "verify: no cut checked (every cut of the sample is t = 0)"
        entropy = max(row["entropy_error"] for row in self.rows)
        values = max(row["values_error"] for row in self.rows)
        layers = len({row["layer"] for row in self.rows})
        head = (
            f"verify ({self.precision!r} contract): {len(self.rows)} cuts of {layers} layer(s) against "
            f"torch.linalg.svdvals: {'PASSED' if self.passed else f'FAILED at {len(self.failures)} cuts'}"
        )
        lines = [
            head,
            f"  tolerance-ESS: {sum(r['tolerance_ess'] == r['tolerance_ess_svd'] for r in self.rows)} equal, "
            f"{sum(r['near_tau'] for r in self.rows)} with a value within {TAU_BAND:g} of tau",
            f"  entropy-ESS: worst relative error {entropy:.1e} (allowed {ENTROPY_TOLERANCE:g})",
            f"  kept singular values: worst error {values:.2g} of what the contract allows",
        ]
        causal = [row for row in self.rows if row["causal_ess_sweep"] is not None]
        if causal:
            lines.append(
                f"  causal ESS: {sum(r['causal_ess'] == r['causal_ess_sweep'] for r in causal)} of {len(causal)} "
                f"equal to the exact sweep's, {sum(r['causal_near_tau'] for r in causal)} with a value within "
                f"{TAU_BAND:g} of tau"
            )
        changed = {(r["layer"], r["unit"]): r["operator_change"] for r in self.rows if r["operator_change"]}
        if changed:
            lines.append(
                f"  this forward pass gave another T than the analysed one at {len(changed)} unit(s) (largest "
                f"|change| {max(changed.values()):.2g}): the model's pass is not bitwise reproducible, and a "
                "failure at those units may be the model's, not the engine's"
            )
        for row in self.failures[:5]:
            lines.append(
                f"  failed: layer {row['layer']} unit {row['unit']} t = {row['t']}: tolerance-ESS "
                f"{row['tolerance_ess']} (SVD {row['tolerance_ess_svd']}), entropy-ESS error "
                f"{row['entropy_error']:.1e}, values {row['values_error']:.2g}, causal ESS "
                f"{row['causal_ess']} (sweep {row['causal_ess_sweep']})"
            )
        return "\n".join(lines)


def verify(
    result: ESSResult,
    model,
    *,
    layers=None,
    units: int = 4,
    cuts: int = 8,
    seed: int = 0,
) -> Verification:
    """Check ``result`` against plain SVDs of a sample of its cuts (module docstring).

    model: the model the result was computed from, loaded as it was then (the same weights
    and dtype); one forward pass on result.input_ids. layers: the result's layers to check
    (default all). units, cuts: how many units per layer and cuts per unit, spread over the
    result's rows and cuts (always the middle cut, the costliest; the rest drawn with
    ``seed``). Returns a `Verification`; ``str()`` of it is a short report."""
    chosen = _check(result, model, layers, units, cuts)
    meta = result.meta
    accuracy = result.accuracy()
    report = Verification(accuracy.precision)
    rng = np.random.default_rng(seed)
    meta_units = meta.get("units")

    captured = capture_layers(
        model, list(result.input_ids), layers=sorted(chosen), gates=meta.get("gates", DEFAULT_GATES)
    )
    for index in sorted(chosen):
        layer = captured.layers.pop(index)  # its operators are freed once checked
        stored = result.layers[index]
        rows = _spread(stored.tolerance_ess.shape[0], units)
        unit_ids = [int(meta_units[row]) if meta_units else row for row in rows]
        positions = [int(t) for t in stored.positions]
        candidates = [k for k, t in enumerate(positions) if t > 0]
        picked = _cut_sample(candidates, positions, result.length, cuts, rng)
        dense = layer.dense(unit_ids)  # (units, L, L) float64
        swept = _causal_sweep(layer, unit_ids, positions, stored.causal_ess[rows], accuracy)
        top_of_layer = float(np.max(stored.singular_values[..., 0], initial=0.0))
        for i, (row, operator) in enumerate(zip(rows, dense)):
            change = _operator_change(stored, row, operator)
            top_of_unit = float(np.max(stored.singular_values[row, :, 0], initial=0.0))
            for k in picked:
                t = positions[k]
                sigma = zero_subnormal_cuts(torch.linalg.svdvals(operator[t:, :t]))
                reference = {"cut": float(sigma[0]), "unit": top_of_unit, "layer": top_of_layer}[accuracy.scope]
                reference = max(reference, float(sigma[0]))  # this cut's own, by SVD, counts too
                entry = _compare(stored, row, k, t, sigma, reference, accuracy, index)
                causal, causal_ok = _compare_causal(
                    stored.causal_ess[row, k], None if swept is None else swept[i], k, accuracy
                )
                report.rows.append({**entry, **causal, "operator_change": change, "ok": entry["ok"] and causal_ok})
    return report


def _operator_change(stored, row: int, operator: torch.Tensor) -> float | None:
    """The largest |T - T kept| of unit ``row``, both in float32 (the result keeps T in
    float32), or None where the result did not keep its T whole (module docstring)."""
    kept = stored.operators.get(row)
    if kept is None or stored.operator_block != 1:
        return None
    return float(np.abs(operator.to(torch.float32).cpu().numpy() - kept).max(initial=0.0))


def _causal_sweep(layer, unit_ids, positions, stored_causal, accuracy):
    """sigma(R_t) of the sampled units at every cut of the result, (u, P, K), from the exact
    sweep of the layer's realisation; None where causal ESS is not checked (module docstring)."""
    if (accuracy.relative and accuracy.scope == "layer") or not np.isfinite(stored_causal).any():
        return None
    swept = layer.causal_spectra(unit_ids, torch.as_tensor(positions), accuracy=EXACT)
    return None if swept is None else swept.to(torch.float64).cpu()


def _count_at_tau(sigma: torch.Tensor, reference: float, accuracy) -> tuple[int, bool]:
    """(the values of ``sigma`` above tau, whether one lies within TAU_BAND of tau), tau referring
    to ``reference`` (a sigma_1) under a relative tolerance."""
    tau = accuracy.tol * reference if accuracy.relative else accuracy.tol
    return int((sigma > tau).sum()), bool(((sigma - tau).abs() <= TAU_BAND * tau).any())


def _compare_causal(got: float, swept, k: int, accuracy) -> tuple[dict, bool]:
    """The causal part of a cut's row, and whether it passes: the result's causal ESS ``got``
    against the count of the unit's swept spectra ``swept`` (P, K) at cut k, tau referring to
    their sigma_1 at that cut or (scope "unit") at any cut."""
    if swept is None or not np.isfinite(got):
        return dict(causal_ess=None, causal_ess_sweep=None, causal_near_tau=None), True
    sigma = swept[k]
    reference = float(sigma[0]) if accuracy.scope == "cut" else float(swept[:, 0].max())
    count, near = _count_at_tau(sigma, reference, accuracy)
    return dict(causal_ess=int(got), causal_ess_sweep=count, causal_near_tau=near), int(got) == count or near


def _compare(stored, row: int, k: int, t: int, sigma: torch.Tensor, reference: float, accuracy, index) -> dict:
    """One cut's row of the report: the result's numbers at (row, k) against ``sigma``, the
    SVD of the cut, with tau referring to ``reference`` (a sigma_1)."""
    sigma = sigma.double().cpu()  # beside the stored numbers, which are on the host
    top = float(sigma[0]) if len(sigma) else 0.0
    count, near = _count_at_tau(sigma, reference, accuracy)
    total = float(sigma.sum())
    if total > 0:
        p = sigma / total
        entropy = float(torch.exp(-torch.special.xlogy(p, p).sum()))
    else:
        entropy = 0.0
    got_entropy = float(stored.entropy_ess[row, k])
    entropy_error = abs(got_entropy - entropy) / entropy if entropy > 0 else abs(got_entropy)
    kept = torch.as_tensor(stored.singular_values[row, k], dtype=torch.float64)
    width = min(len(kept), len(sigma))
    relative, absolute = accuracy.drawn_floor()
    floor = max(relative * top, absolute)
    drawn = (kept[:width] >= floor) | (sigma[:width] >= floor)  # drawn, or hidden but above the floor
    if accuracy.fast:
        allowed = (accuracy.resolution * (top if accuracy.relative else 1.0)) + EXACT_RELATIVE * sigma[:width]
    else:
        allowed = EXACT_RELATIVE * sigma[:width] + EXACT_ABSOLUTE * top
    error = (kept[:width] - sigma[:width]).abs()
    values_error = float((error[drawn] / allowed[drawn].clamp_min(1e-300)).max()) if bool(drawn.any()) else 0.0
    got_count = int(stored.tolerance_ess[row, k])
    ok = (got_count == count or near) and entropy_error <= ENTROPY_TOLERANCE and values_error <= 1.0
    return dict(
        layer=index,
        unit=row,
        t=t,
        tolerance_ess=got_count,
        tolerance_ess_svd=count,
        near_tau=near,
        entropy_ess=got_entropy,
        entropy_ess_svd=entropy,
        entropy_error=entropy_error,
        values_error=values_error,
        ok=ok,
    )


def _spread(count: int, wanted: int) -> list[int]:
    """``wanted`` of range(count), spread evenly, the first and last included."""
    return sorted({int(round(x)) for x in np.linspace(0, count - 1, min(count, wanted))})


def _cut_sample(candidates: list[int], positions: list[int], length: int, wanted: int, rng) -> list[int]:
    """Indices of the cuts to check: the one nearest the middle of the prompt (the widest
    cut), then others drawn at random."""
    if not candidates:
        return []
    middle = min(candidates, key=lambda k: abs(positions[k] - length // 2))
    rest = [k for k in candidates if k != middle]
    drawn = rng.choice(len(rest), size=min(len(rest), max(0, wanted - 1)), replace=False) if rest else []
    return sorted({middle, *(rest[int(i)] for i in drawn)})


def _check(result, model, layers, units, cuts) -> set[int]:
    """Validate everything before the forward pass; the layers to check."""
    if not isinstance(result, ESSResult):
        raise TypeError(f"verify takes an ESSResult (analyze, read_result), got {type(result).__name__}")
    for name, value in (("units", units), ("cuts", cuts)):
        if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{name} must be a positive int, got {value!r}")
    chosen = set(result.layers) if layers is None else {layers} if isinstance(layers, int) else set(layers)
    missing = sorted(chosen - set(result.layers))
    if missing:
        raise ValueError(f"layers {missing} are not in the result; it has {sorted(result.layers)}")
    config = getattr(model, "config", None)
    model_type = result.meta.get("model_type")
    if config is not None and model_type and getattr(config, "model_type", None) != model_type:
        raise ValueError(
            f"the result was computed from a {model_type!r} model, this one is {config.model_type!r}: "
            "pass the model the result came from"
        )
    dtype = result.meta.get("dtype")
    have = str(next(model.parameters()).dtype).replace("torch.", "")
    if dtype and have != dtype:
        raise ValueError(
            f"the result was computed with the model in {dtype}, this one is in {have}: load it in "
            f"{dtype} (other weights give other operators)"
        )
    return chosen
