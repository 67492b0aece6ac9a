"""The one builder of a layer's ESS arrays: unit operators (core/units.py) -> spectra -> ESS.

`layer_arrays` computes the full spectrum of every cut of every unit (in chunks, so a
Mamba layer never holds an L x L matrix per channel), both ESS variants from the full
spectra, the capacity (TSS) and the top singular values kept for the views. It is used by
`analyze`, by the synthetic reference results and by `LayerESS.from_operator`, so every
LayerESS is built the same way.

Memory budgets (per layer):
- SPECTRA_BUDGET = 8M values: the kept singular values (U, P, K) use
  K = min(structural rank bound, SPECTRA_BUDGET // (U * P)) (and ``top_k`` when given),
  at least 1. Both ESS variants always come from the *full* spectra; only the stored
  values are cut. E.g. Mamba-130m (1536 channels, N = 16) at L = 512 keeps K = 10.
- Spectra are computed in chunks of units (UNIT_CHUNK_VALUES full-spectrum values,
  DENSE_CHUNK_CELLS dense cells, FACTORED_CHUNK_BYTES of sweep buffer, or for the Gramian
  route of the "ess" contract GRAMIAN_CHUNK_VALUES values per output array, per chunk).
"""

from __future__ import annotations

from typing import Callable

import numpy as np
import torch

from . import dense_jobs
from .accelerator import accelerator_routes
from .ess import DEFAULT_SCOPE, check_scope, check_tolerance, count_above_tolerance, entropy_of, tolerance_reference
from .memory import reused_memory
from .precision import DEFAULT_PRECISION, Accuracy, zero_subnormal_cuts
from .spectra import DENSE_CHUNK_CELLS
from .units import CapturedLayer, DenseCapture, OwnerRows, SSMCapture

__all__ = ["layer_arrays", "SPECTRA_BUDGET"]

SPECTRA_BUDGET = 8_000_000
UNIT_CHUNK_VALUES = 64_000_000  # full-spectrum float64 values per chunk of units (~512 MB)
# Units per call of the factored core: its sweep buffer (units, P, N, N) float64 stays near
# this size (measured: chunks of 256 Mamba channels cost the same per channel as the whole
# layer in one call, and peak memory falls from 3.4 GB to ~1.4 GB at L = 512).
FACTORED_CHUNK_BYTES = 256 << 20
GRAMIAN_CHUNK_VALUES = 16_000_000  # (units, P, N) values per output array of the Gramian route
# On a GPU its outputs stay on the device until the layer's ESS are reduced there: a
# Mamba-130m layer at L = 2048 (1536 x 2047 x 16 values, 0.4 GB per array) is one chunk,
# so one round of copies to the host per layer.
GPU_GRAMIAN_CHUNK_VALUES = 64_000_000


def _chunk_size(layer: CapturedLayer, n_pos: int, most: int, path: dict, accuracy: Accuracy, device) -> int:
    chunk = max(1, UNIT_CHUNK_VALUES // max(1, n_pos * most))
    if isinstance(layer, DenseCapture) or path.get("method") == "dense":
        # the dense stack of a chunk is materialised in float64 (also an SSM chosen dense);
        # row-scaled copies of a few owners (core/row_scaled.py) materialise only the owners
        # and bound their own copies, so such a chunk holds that many owners, not units
        # (Mamba2-130m at L = 256: one chunk instead of four of 7 heads, each with its own
        # calls per cut; four layers on 2 threads, alternated: 14.5-16.2 s -> 12.8-14.3 s)
        owners = max(1, DENSE_CHUNK_CELLS // max(1, layer.length**2))
        chunk = min(chunk, owners * layer.units_per_owner())
    elif isinstance(layer, SSMCapture) and layer.gramian_route(range(layer.n_units), path, accuracy):
        # the Gramian route (core/gramian.py) keeps no sweep buffer, only its outputs: about
        # four (units, P, N) arrays; a Mamba-130m layer at L = 512 is one chunk
        values = GPU_GRAMIAN_CHUNK_VALUES if accelerator_routes(device) else GRAMIAN_CHUNK_VALUES
        chunk = min(chunk, max(1, values // max(1, n_pos * layer.state_size)))
    elif isinstance(layer, SSMCapture):  # the core's sweep buffer is (units, P, N, N) float64
        chunk = min(chunk, max(1, FACTORED_CHUNK_BYTES // max(1, 8 * n_pos * layer.state_size**2)))
    return chunk


def _unit_chunks(layer: CapturedLayer, unit_ids: list[int], chunk: int) -> list[slice]:
    """Slices of at most ``chunk`` units (rows of ``unit_ids``). Where units share owners (a
    head's row-scaled channels, core/units.py), a chunk ends where an owner's units end
    whenever one does within it: a head split between two chunks would have its cuts factored
    and its reachability computed twice (3 of Mamba2-130m's 24 heads, chunks of 488 channels)."""
    owners = None if layer.owner is None else layer.owner[torch.as_tensor(unit_ids, dtype=torch.long)].tolist()
    chunks, start = [], 0
    while start < len(unit_ids):
        stop = min(len(unit_ids), start + chunk)
        if owners is not None and stop < len(unit_ids):  # the last owner's end in the chunk, if any
            stop = next((row for row in range(stop, start, -1) if owners[row] != owners[row - 1]), stop)
        chunks.append(slice(start, stop))
        start = stop
    return chunks


@reused_memory()  # its arrays are freed and made again chunk after chunk (core/memory.py)
def layer_arrays(
    layer: CapturedLayer,
    positions: np.ndarray,
    *,
    tol: float,
    relative: bool,
    unit_ids: list[int] | None = None,
    operator_rows=(),
    top_k: int | None = None,
    device=None,
    tss=None,
    operator_dtype=torch.float32,
    scope: str = DEFAULT_SCOPE,
    on_chunk: Callable[[int, int], None] | None = None,
    causal: bool = True,
    precision: str = DEFAULT_PRECISION,
) -> dict:
    """The fields of a LayerESS for the units ``unit_ids`` (default all) of ``layer``.

    positions (P,): the cuts t to compute. operator_rows: rows (into unit_ids) whose dense T
    is kept, in ``operator_dtype`` (float32 by default: the operator view needs no more). tss: (P,) or (U, P) capacity overriding the
    family's (`CapturedLayer.tss`). scope: the relative tolerance's reference (core/ess.py);
    with "layer" it is the largest sigma_1 over every unit in ``unit_ids``, so a layer
    computed in more than one chunk is swept twice (the counts need the maximum first).
    Causal ESS (core/causal.py) follows the same tol / relative / scope; NaN for units with
    no known realisation, and for every unit with ``causal=False``, which skips its spectra
    (for a recurrence one more N x N SVD per cut: a third of a Mamba layer).
    precision: the accuracy contract of the spectra (core/precision.py): "ess" (default: every
    ESS as exact spectra give it, by guarded Gram / Gramian eigenvalues) or "exact".
    on_chunk(units done, units in all) is called after each chunk of units: a progress
    report, and the place a caller may stop a long layer by raising.
    """
    unit_ids = list(range(layer.n_units)) if unit_ids is None else list(unit_ids)
    positions = np.asarray(positions, dtype=np.int64)
    n_units, n_pos = len(unit_ids), len(positions)
    rank_bound = layer.rank_bound(positions)  # (P,)
    most = max(int(rank_bound.max()) if n_pos else 0, 1)
    keep = max(1, min(most, SPECTRA_BUDGET // max(1, n_units * n_pos)))
    keep = keep if top_k is None else min(keep, top_k)

    check_tolerance(tol, relative)
    check_scope(scope, relative)
    accuracy = Accuracy(precision, tol, relative, scope)
    path = layer.spectra_path(positions, device, accuracy)
    chunks = _unit_chunks(layer, unit_ids, _chunk_size(layer, n_pos, most, path, accuracy, device))
    tol_ess = np.zeros((n_units, n_pos), dtype=np.int64)
    ent_ess = np.zeros((n_units, n_pos), dtype=np.float64)
    causal_ess = np.full((n_units, n_pos), np.nan)
    kept = np.zeros((n_units, n_pos, keep), dtype=np.float64)
    structural = layer.causal_count(positions) if causal else None
    # scope "layer" over several chunks: the counts wait for the layer's largest sigma_1.
    deferred = scope == "layer" and len(chunks) > 1
    top = {"hankel": 0.0, "causal": 0.0}

    # The spectra come from the engine (finite, descending): counted without tolerance_ess's
    # checks of a user's spectra, which cost as much as the counting on a Mamba layer.
    def count(rows, sigma, csig, inverse, references):
        tol_ess[rows] = count_above_tolerance(sigma, tol, relative, scope, references.get("hankel")).cpu().numpy()
        if csig is not None:
            counts = count_above_tolerance(csig, tol, relative, scope, references.get("causal"))
            causal_ess[rows] = (counts if inverse is None else counts[inverse]).cpu().numpy()

    def chunk_spectra(rows):
        """(spectra, causal spectra or None, None or each unit's row in the causal spectra):
        the units of one owner share its causal spectra (`OwnerRows`), counted once. The
        kernels' rules read the layer's work, not the chunk's (`dense_jobs.chunk_of_layer`).
        Whatever the route, a cut below float64's normal range reads as zero
        (`zero_subnormal_cuts`)."""
        with dense_jobs.chunk_of_layer(len(range(n_units)[rows]) / max(1, n_units)):
            sigma, *causal = _chunk_spectra(rows)
        return (zero_subnormal_cuts(sigma), *causal)

    def _chunk_spectra(rows):
        if not causal:
            return (
                layer.spectra(unit_ids[rows], positions, device=device, dtype=torch.float64, accuracy=accuracy),
                None,
                None,
            )
        sigma, csig = layer.spectra_and_causal(
            unit_ids[rows], positions, device=device, dtype=torch.float64, accuracy=accuracy
        )
        return (sigma, *csig) if isinstance(csig, OwnerRows) else (sigma, csig, None)

    for rows in chunks:
        sigma, csig, inverse = chunk_spectra(rows)
        ent_ess[rows] = entropy_of(sigma).cpu().numpy()
        width = min(keep, sigma.shape[-1])
        kept[rows, :, :width] = sigma[..., :width].cpu().numpy()
        if structural is not None:
            causal_ess[rows] = structural
        if deferred:
            top["hankel"] = max(top["hankel"], float(tolerance_reference(sigma, "layer")))
            if csig is not None:
                top["causal"] = max(top["causal"], float(tolerance_reference(csig, "layer")))
        else:
            count(rows, sigma, csig, inverse, {})
        if on_chunk is not None:
            on_chunk(rows.stop, n_units)
    for rows in chunks if deferred else ():
        count(rows, *chunk_spectra(rows), top)
        if on_chunk is not None:
            on_chunk(n_units, n_units)

    operators = _kept_operators(layer, unit_ids, [int(row) for row in operator_rows], operator_dtype)
    return dict(
        layer=layer.layer,
        family=layer.family,
        unit_kind=layer.unit_kind,
        positions=positions.copy(),
        tolerance_ess=tol_ess,
        entropy_ess=ent_ess,
        tss=np.broadcast_to(
            layer.tss(positions) if tss is None else np.asarray(tss, dtype=np.float64), (n_units, n_pos)
        ).astype(np.float64),
        singular_values=kept,
        rank_bound=np.broadcast_to(rank_bound, (n_units, n_pos)).astype(np.int64),
        operators=operators,
        path=path,
        multiplicity=np.full(n_units, layer.unit_multiplicity(), dtype=np.int64),
        state_weight=np.full(n_units, layer.unit_state_weight(), dtype=np.float64),
        causal_ess=causal_ess,
    )


def _kept_operators(layer: CapturedLayer, unit_ids: list[int], rows: list[int], dtype: torch.dtype) -> dict:
    """{row: the dense T of unit ``unit_ids[row]``} in ``dtype``: materialised a few units per
    call (a recurrence materialises by L steps of a scan, whose cost per step barely grows
    with the units), within DENSE_CHUNK_CELLS float64 cells."""
    per_call = max(1, DENSE_CHUNK_CELLS // max(1, layer.length**2))
    operators = {}
    for start in range(0, len(rows), per_call):
        group = rows[start : start + per_call]
        dense = layer.dense([unit_ids[row] for row in group]).to(dtype).cpu().numpy()
        operators.update(zip(group, dense))
    return operators
