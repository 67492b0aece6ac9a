"""ESSResult: what one analysis of one prompt produced, in a form every view consumes.

Layout (all arrays numpy; U = units of the layer, P = positions computed, K = kept
singular values per cut):

    ESSResult
      tokens        list[str], length L (display strings of the prompt's tokens)
      input_ids     list[int], length L
      meta          dict: model_id, revision, dtype, device, tol, relative, convention,
                    package version, created, ... (JSON-serialisable)
      layers        dict[int, LayerESS], keyed by the 0-based layer index

    LayerESS
      layer, family ("softmax_attention", "mamba", "mamba2", "short_conv",
              "linear_attention", "gated_linear_attention", ...), unit_kind ("head" | "channel")
      positions        (P,)      int   the t of each column below (arange(L) unless a stride)
      tolerance_ess    (U, P)    int   at meta["tol"], meta["relative"], from the full spectrum
      entropy_ess      (U, P)    float from the full spectrum
      tss              (U, P)    float capacity (theoretical state size) per unit and t
      singular_values  (U, P, K) float top-K of sigma(H_t), descending, zero padded
      rank_bound       (U, P)    int   how many values the full spectrum has (min(t, L-t), or <= N)
      operators        dict[int, (L, L) float array]  T of the units kept for the operator view
      multiplicity     (U,)      int   scalar channels sharing each unit's T (1 in files
                                       written before it existed); layer totals in scalars
                                       of ESS are sum_u multiplicity[u] * ESS[u] (`total`)
      state_weight     (U,)      float scalars of state each unit stands for per unit of its TSS:
                                       the multiplicity, except softmax attention, whose state is
                                       the KV cache, 2 x KV heads x head_dim per token spread over
                                       the query heads; total TSS is sum_u state_weight[u] * TSS[u]
                                       (`total_tss`; files written before it load with the
                                       multiplicity)
      causal_ess       (U, P)    float tolerance-rank of the reachability factor R_t (core/causal.py)
                                       at the same tol / relative / scope; NaN where the unit has no
                                       known realisation (and in files written before it existed)

Saved as one ``.npz`` file (numpy arrays + a JSON header), loaded with
``allow_pickle=False``: no code is ever unpickled from a result file. A file holds what the
views draw, sized for real models (a 30-layer, 523-token attention result is about 25 MB, where
float64 spectra of every rank and every head's T would take 277 MB): the top SAVED_SPECTRUM_K
singular values per cut in float32 (the ESS values were counted from the float64 spectra and
are stored as computed; the counts at the analysis tolerance for every scope are stored too,
so a recount there stays exact), stored as byte planes (the exponent bytes of a descending
spectrum compress well once apart from the mantissas); operators longer than
SAVED_OPERATOR_SIDE as the largest |T| of b x b blocks (what the operator view draws;
``operator_block`` says b). The in-memory result of ``analyze`` keeps everything it computed.
"""

from __future__ import annotations

import json
import zipfile
import zlib
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ._version import __version__
from .atomic import atomic_write_with
from .bounded import open_npz, parse_json
from .core.diagnostics import utilisation
from .core.ess import DEFAULT_SCOPE, check_scope, check_variant, tolerance_reference
from .core.layer import layer_arrays
from .core.operators import DiagonalSSM
from .core.precision import DEFAULT_PRECISION, PRECISIONS, Accuracy
from .core.units import CapturedLayer, DenseCapture, SSMCapture
from .result_file import (  # noqa: F401  (SAVED_*: what the views draw, taken from here)
    BYTE_PLANES,
    SAVED_OPERATOR_SIDE,
    SAVED_SPECTRUM_K,
    block_max,
    byte_planes,
    file_stamp,
    from_byte_planes,
    held,
    loaded_counts,
    saved_block,
    saved_counts,
)

FORMAT_VERSION = 1
OPTIONAL_ARRAYS = ("multiplicity", "causal_ess", "state_weight")  # per-layer arrays a file may lack (older files)
CONVENTION = (
    "0-based t; H_t = T[t:, :t] (past inputs u_0..u_{t-1} -> outputs y_t..y_{L-1}, diagonal excluded); "
    "ESS(0) = 0; tolerance-ESS counts sigma_k > tol (absolute) or > tol * sigma_1 (relative); "
    "entropy-ESS = exp(H(p)), p = sigma / sum(sigma)"
)


@dataclass
class LayerESS:
    layer: int
    family: str
    unit_kind: str
    positions: np.ndarray
    tolerance_ess: np.ndarray
    entropy_ess: np.ndarray
    tss: np.ndarray
    singular_values: np.ndarray
    rank_bound: np.ndarray
    operators: dict[int, np.ndarray] = field(default_factory=dict)
    # how the spectra were computed: {"method": "dense" | "sweep" | "scan" | "short_conv", "reason": ...}
    path: dict = field(default_factory=dict)
    multiplicity: np.ndarray | None = None
    causal_ess: np.ndarray | None = None
    state_weight: np.ndarray | None = None
    # operators[u] holds the largest |T| of each block of this side (1: T itself)
    operator_block: int = 1
    # tolerance-ESS at one (tol, relative) per scope, counted from the spectra before a save
    # cut them: {"tol", "relative", scope: (ess, exact)}; None when the kept values are all
    counts: dict | None = field(default=None, repr=False)

    def __post_init__(self):
        units = int(np.shape(self.tolerance_ess)[0])
        if self.causal_ess is None:
            self.causal_ess = np.full(np.shape(self.tolerance_ess), np.nan)
        self.causal_ess = np.asarray(self.causal_ess, dtype=np.float64)
        if self.causal_ess.shape != np.shape(self.tolerance_ess):
            raise ValueError(
                f"causal_ess must have the shape of tolerance_ess {np.shape(self.tolerance_ess)}, "
                f"got {self.causal_ess.shape}"
            )
        if self.multiplicity is None:
            self.multiplicity = np.ones(units, dtype=np.int64)
        self.multiplicity = np.asarray(self.multiplicity, dtype=np.int64).reshape(-1)
        if self.multiplicity.shape != (units,) or (self.multiplicity < 1).any():
            raise ValueError(
                f"multiplicity must hold one positive channel count per unit ({units}), "
                f"got shape {self.multiplicity.shape}"
            )
        if self.state_weight is None:  # every family but attention: the channels sharing T
            self.state_weight = self.multiplicity.astype(np.float64)
        self.state_weight = np.asarray(self.state_weight, dtype=np.float64).reshape(-1)
        if self.state_weight.shape != (units,) or not (np.isfinite(self.state_weight).all()):
            raise ValueError(
                f"state_weight must hold one finite scalar count per unit ({units}), got shape {self.state_weight.shape}"
            )
        if (self.state_weight <= 0).any():
            raise ValueError("state_weight must be positive: every unit stands for some state")

    @property
    def n_units(self) -> int:
        return int(self.tolerance_ess.shape[0])

    def total(self, variant: str = "tolerance") -> np.ndarray:
        """(P,) layer total of an ESS variant in scalars: sum over units of multiplicity x ESS
        (docs/conventions.md): the rank each unit's value channels read through their cut. For
        softmax attention the query heads that share a KV head each count, so this total is not
        a part of `total_tss` (the KV cache) and may exceed it under GQA."""
        ess = np.asarray(self.ess(variant), dtype=np.float64)
        return (self.multiplicity[:, None] * ess).sum(0)

    def total_tss(self) -> np.ndarray:
        """(P,) layer capacity in scalars: sum over units of state_weight x TSS, the state the
        layer keeps (softmax attention: its KV cache, 2 x KV heads x head_dim x TSS)."""
        return (self.state_weight[:, None] * np.asarray(self.tss, dtype=np.float64)).sum(0)

    @property
    def spectra_complete(self) -> np.ndarray:
        """(U, P) bool: True where the kept values are the whole spectrum of H_t."""
        return self.rank_bound <= self.singular_values.shape[-1]

    def tolerance_ess_at(
        self, tol: float, relative: bool = True, scope: str = DEFAULT_SCOPE
    ) -> tuple[np.ndarray, np.ndarray]:
        """tolerance-ESS recomputed from the kept singular values (no model needed).

        scope (relative only): the sigma_1 the tolerance refers to: the cut's, the largest of
        the unit's computed cuts, or the largest in the layer (core/ess.py). sigma_1 is always
        kept, so the reference is exact for every scope.
        Returns (ess, exact): ``exact`` is False where the count reached the number of kept
        values K and more values exist, so the true ESS may be larger (a lower bound).
        """
        if not np.isfinite(tol) or tol < 0:
            raise ValueError(f"tol must be a finite non-negative number, got {tol}")
        check_scope(scope, relative)
        stored = self.counts or {}
        if stored.get("tol") == tol and stored.get("relative") == relative and scope in stored:
            return stored[scope]
        sigma = self.singular_values
        threshold = tol * tolerance_reference(sigma, scope) if relative else np.full_like(sigma[..., :1], tol)
        ess = (sigma > threshold).sum(-1)
        exact = self.spectra_complete | (ess < sigma.shape[-1])
        return ess, exact

    @classmethod
    def from_units(cls, units: CapturedLayer, positions=None, *, tol: float, relative: bool, **options) -> "LayerESS":
        """Spectra and both ESS of every unit of one layer's operators (core/layer.py:
        `layer_arrays` takes unit_ids, operator_rows, top_k, device, scope)."""
        positions = np.arange(units.length) if positions is None else np.asarray(positions)
        return cls(**layer_arrays(units, positions, tol=tol, relative=relative, **options))

    @classmethod
    def from_operator(
        cls,
        layer: int,
        family: str,
        operator,
        tss=None,
        *,
        tol: float,
        relative: bool,
        positions=None,
        top_k: int | None = None,
        keep_operators=(),
        device=None,
        state_size: int | None = None,
        window: int | None = None,
        kernel_size: int | None = None,
        multiplicity: int | None = None,
        scope: str = DEFAULT_SCOPE,
        precision: str = DEFAULT_PRECISION,
    ) -> "LayerESS":
        """The LayerESS of a layer given directly by its operators, built like `analyze`'s.

        operator: a dense stack (U, L, L) or a DiagonalSSM with batch shape (U,). The
        capacity (TSS) follows ``family`` (core/diagnostics.py) with ``state_size`` (taken
        from a DiagonalSSM when not given), ``window`` or ``kernel_size``, unless ``tss``
        ((P,) or (U, P)) gives it. Units listed in ``keep_operators`` keep their dense T.
        multiplicity: scalar channels sharing each unit's T (default 1). precision: the
        accuracy contract of the spectra (core/precision.py).
        """
        import torch

        if isinstance(operator, DiagonalSSM):
            units = SSMCapture(
                layer=layer,
                family=family,
                state_size=state_size or operator.state_size,
                multiplicity=multiplicity,
                realize=lambda index: operator[index],
                shape=(int(operator.batch_shape.numel()), operator.length),
            )
        else:
            stack = torch.as_tensor(operator)
            if stack.ndim != 3 or stack.shape[-1] != stack.shape[-2]:
                raise ValueError(f"operator must be a stack (U, L, L) or a DiagonalSSM, got shape {tuple(stack.shape)}")
            units = DenseCapture(
                layer=layer,
                family=family,
                operator=stack,
                state_size=state_size,
                window=window,
                kernel_size=kernel_size,
                multiplicity=multiplicity,
            )
        return cls.from_units(
            units,
            positions,
            tol=tol,
            relative=relative,
            operator_rows=list(keep_operators),
            top_k=top_k,
            device=device,
            tss=tss,
            operator_dtype=torch.float64,
            scope=scope,
            precision=precision,
        )

    def ess(self, variant: str = "tolerance") -> np.ndarray:
        """(U, P) ESS of the named variant: "tolerance", "entropy" or "causal" (NaN where a unit
        has no known realisation; core/ess.py: check_variant refuses unknown names)."""
        fields = {"tolerance": self.tolerance_ess, "entropy": self.entropy_ess, "causal": self.causal_ess}
        return fields[check_variant(variant)]

    def utilisation(self, variant: str = "tolerance") -> np.ndarray:
        """ESS / TSS per unit and position (0 where TSS is 0)."""
        return utilisation(self.ess(variant), self.tss)


@dataclass
class ESSResult:
    tokens: list[str]
    input_ids: list[int]
    layers: dict[int, LayerESS]
    meta: dict = field(default_factory=dict)

    def __post_init__(self):
        self.meta.setdefault("package_version", __version__)
        self.meta.setdefault("convention", CONVENTION)

    @property
    def length(self) -> int:
        return len(self.input_ids)

    def accuracy(self) -> Accuracy:
        """The accuracy contract the spectra meet, with the tolerance that counted them (meta);
        a result from before the contracts existed was computed exactly."""
        precision = self.meta.get("precision")
        return Accuracy(
            precision if precision in PRECISIONS else "exact",
            float(self.meta.get("tol", 1e-3)),
            bool(self.meta.get("relative", True)),
            self.meta.get("scope", DEFAULT_SCOPE),
        )

    def layer(self, index: int) -> LayerESS:
        if index not in self.layers:
            raise KeyError(f"layer {index} was not analysed; analysed layers: {sorted(self.layers)}")
        return self.layers[index]

    def to_frame(self):
        """Tidy table: one row per (layer, unit, t) with the columns layer, unit, t, token,
        family, unit_kind, multiplicity (scalar channels sharing the unit's T), tolerance_ess,
        entropy_ess, tss, causal_ess (NaN where unknown), utilisation. Per-unit values; a layer total in scalars weights each
        row by its multiplicity."""
        import pandas as pd

        frames = []
        for index, lay in sorted(self.layers.items()):
            units, n_pos = lay.tolerance_ess.shape
            t = np.tile(lay.positions, units)
            frames.append(
                pd.DataFrame(
                    {
                        "layer": index,
                        "unit": np.repeat(np.arange(units), n_pos),
                        "t": t,
                        "token": np.asarray(self.tokens, dtype=object)[t] if self.tokens else "",
                        "family": lay.family,
                        "unit_kind": lay.unit_kind,
                        "multiplicity": np.repeat(lay.multiplicity, n_pos),
                        "tolerance_ess": lay.tolerance_ess.reshape(-1),
                        "entropy_ess": lay.entropy_ess.reshape(-1),
                        "tss": lay.tss.reshape(-1),
                        "causal_ess": lay.causal_ess.reshape(-1),
                        "utilisation": lay.utilisation().reshape(-1),
                    }
                )
            )
        columns = [
            "layer",
            "unit",
            "t",
            "token",
            "family",
            "unit_kind",
            "multiplicity",
            "tolerance_ess",
            "entropy_ess",
            "tss",
            "causal_ess",
            "utilisation",
        ]
        return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=columns)

    # ---- persistence: one .npz, JSON header, no pickle -------------------------------
    def save(self, path) -> Path:
        """Write the result to ``path`` atomically (atomic.py) and return the path written.

        A path ending in ".npz" is used as given; any other name gains ".npz" (as
        numpy.savez does: "run" -> "run.npz"), and the returned path says so. A path that
        exists and is not a regular file (a folder, a device such as /dev/full) is refused.
        """
        path = Path(path)
        if path.exists() and not path.is_file():
            raise ValueError(f"{path} exists and is not a regular file; give a file name ending in .npz")
        if path.suffix != ".npz":
            path = path.with_name(path.name + ".npz")
            if path.exists() and not path.is_file():
                raise ValueError(f"{path} exists and is not a regular file; give a file name ending in .npz")
        header = {
            "format_version": FORMAT_VERSION,
            "tokens": list(self.tokens),
            "input_ids": [int(i) for i in self.input_ids],
            "meta": self.meta,
            "layers": {
                str(i): {
                    "family": lay.family,
                    "unit_kind": lay.unit_kind,
                    "operators": sorted(lay.operators),
                    "path": lay.path,
                }
                for i, lay in self.layers.items()
            },
            "spectra": BYTE_PLANES,
        }
        arrays = {}
        for i, lay in self.layers.items():
            for name in ("positions", "tolerance_ess", "entropy_ess", "tss", "rank_bound", *OPTIONAL_ARRAYS):
                arrays[f"L{i}/{name}"] = np.asarray(getattr(lay, name))
            arrays[f"L{i}/singular_values"] = byte_planes(lay.singular_values[..., :SAVED_SPECTRUM_K])
            counts = saved_counts(lay, self.meta)
            if counts is not None:
                header["layers"][str(i)]["counts"] = {k: counts[k] for k in ("tol", "relative")}
                header["layers"][str(i)]["count_scopes"] = counts["scopes"]
                arrays[f"L{i}/counts"] = counts["ess"]
                arrays[f"L{i}/counts_exact"] = counts["exact"]
            block = saved_block(lay, len(self.input_ids))
            header["layers"][str(i)]["operator_block"] = block
            for unit, op in lay.operators.items():
                arrays[f"L{i}/operator/{unit}"] = block_max(np.asarray(op), block // lay.operator_block)
        arrays["__header__"] = np.frombuffer(json.dumps(header).encode("utf-8"), dtype=np.uint8)
        written = atomic_write_with(path, lambda handle: np.savez_compressed(handle, **arrays))
        self._file = file_stamp(written, self)
        return written

    @classmethod
    def load(cls, path) -> "ESSResult":
        path = Path(path)
        if not path.exists():
            raise FileNotFoundError(f"no ESS result at {path}")
        try:
            with open_npz(path) as data:  # sizes and depth bounded; never unpickled (bounded.py)
                if not hasattr(data, "files") or "__header__" not in data.files:
                    raise ValueError("it has no __header__ (not an ESS result)")
                header = parse_json(bytes(data["__header__"]), "the header")
                _check_header(header)
                layers = {}
                for key, info in header["layers"].items():
                    i = int(key)
                    fields = {}
                    for name in _ARRAY_FIELDS:
                        if f"L{i}/{name}" not in data.files:
                            raise ValueError(f"field L{i}/{name} is missing")
                        fields[name] = data[f"L{i}/{name}"]
                    if header.get("spectra") == BYTE_PLANES:
                        fields["singular_values"] = from_byte_planes(fields["singular_values"], i)
                    block = info.get("operator_block", 1)
                    if not isinstance(block, int) or isinstance(block, bool) or block < 1:
                        raise ValueError(f"field layers.{key}.operator_block must be a positive integer")
                    operators = {}
                    for u in info["operators"]:
                        if f"L{i}/operator/{u}" not in data.files:
                            raise ValueError(f"field L{i}/operator/{u} is missing")
                        operators[int(u)] = data[f"L{i}/operator/{u}"]
                    _check_layer_arrays(i, fields, operators, len(header["input_ids"]), block)
                    # Optional arrays: files written before they existed load with the defaults
                    # (multiplicity 1 per unit, causal ESS NaN); LayerESS checks their shapes.
                    for name in OPTIONAL_ARRAYS:
                        if f"L{i}/{name}" in data.files:
                            fields[name] = data[f"L{i}/{name}"]
                    route = info.get("path", {})  # not `path`: the error below names the file
                    route = {str(k): str(v) for k, v in route.items()} if isinstance(route, dict) else {}
                    layers[i] = LayerESS(
                        i,
                        info["family"],
                        info["unit_kind"],
                        operators=operators,
                        path=route,
                        operator_block=block,
                        counts=loaded_counts(data, i, info, fields["tolerance_ess"].shape),
                        **fields,
                    )
        except (
            OSError,
            KeyError,
            ValueError,
            TypeError,
            AttributeError,
            EOFError,
            zipfile.BadZipFile,
            zlib.error,
        ) as error:
            raise ValueError(f"{path} is not a readable ESS result ({error}); recompute it") from error
        result = cls(header["tokens"], header["input_ids"], layers, header["meta"])
        result._file = file_stamp(path, result)
        return result

    # The file this result was loaded from or saved to, as (path, size, mtime, what it holds
    # besides arrays): io's write_result_dir links that file instead of writing the same bytes
    # again. Not a field, so a changed copy (dataclasses.replace, a subset) never claims it.
    _file = None

    def saved_file(self) -> Path | None:
        """The file this result was loaded from or last saved to, if neither has changed since
        (the file's size and time, the result's tokens, metadata and layers)."""
        if self._file is None:
            return None
        path, size, mtime, stamp = self._file
        try:
            stat = path.stat()
        except OSError:
            return None
        return path if (stat.st_size, stat.st_mtime_ns, held(self)) == (size, mtime, stamp) else None


_ARRAY_FIELDS = ("positions", "tolerance_ess", "entropy_ess", "tss", "singular_values", "rank_bound")


def _check_header(header) -> None:
    """ValueError naming the first header field of the wrong type or shape."""
    if not isinstance(header, dict):
        raise ValueError(f"the header is a {type(header).__name__}, not a JSON object")
    if header.get("format_version") != FORMAT_VERSION:
        raise ValueError(
            f"unsupported result format {header.get('format_version')!r} (this version reads {FORMAT_VERSION})"
        )
    tokens, ids = header.get("tokens"), header.get("input_ids")
    if not isinstance(tokens, list) or not all(isinstance(t, str) for t in tokens):
        raise ValueError("field tokens must be a list of strings")
    if not isinstance(ids, list) or not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in ids):
        raise ValueError("field input_ids must be a list of non-negative integers")
    if tokens and len(tokens) != len(ids):
        raise ValueError(f"field tokens has {len(tokens)} entries but input_ids has {len(ids)}")
    if not isinstance(header.get("meta"), dict):
        raise ValueError("field meta must be a JSON object")
    layers = header.get("layers")
    if not isinstance(layers, dict):
        raise ValueError("field layers must be a JSON object")
    for key, info in layers.items():
        if not key.isdigit():
            raise ValueError(f"field layers has a key {key!r} that is not a layer index")
        if (
            not isinstance(info, dict)
            or not isinstance(info.get("family"), str)
            or not isinstance(info.get("unit_kind"), str)
        ):
            raise ValueError(f"field layers.{key} must hold the strings family and unit_kind")
        ops = info.get("operators")
        if not isinstance(ops, list) or not all(isinstance(u, int) and not isinstance(u, bool) and u >= 0 for u in ops):
            raise ValueError(f"field layers.{key}.operators must be a list of unit rows")


def _check_layer_arrays(i: int, fields: dict, operators: dict, length: int, block: int = 1) -> None:
    """ValueError naming the first array of layer ``i`` whose dtype or shape is inconsistent."""
    for name, array in fields.items():
        if not (np.issubdtype(array.dtype, np.number) or array.dtype == np.bool_) or np.iscomplexobj(array):
            raise ValueError(f"field L{i}/{name} has dtype {array.dtype}, not a real number type")
    pos = fields["positions"]
    if (
        pos.ndim != 1
        or not np.issubdtype(pos.dtype, np.integer)
        or (pos.size and (pos.min() < 0 or pos.max() >= length))
    ):
        raise ValueError(f"field L{i}/positions must be integers in [0, {length - 1}], shape (P,)")
    units_positions = (fields["tolerance_ess"].shape[0] if fields["tolerance_ess"].ndim == 2 else -1, pos.size)
    for name in ("tolerance_ess", "entropy_ess", "tss", "rank_bound"):
        if fields[name].shape != units_positions:
            raise ValueError(f"field L{i}/{name} has shape {fields[name].shape}, expected (U, P) = {units_positions}")
    sigma = fields["singular_values"]
    if sigma.ndim != 3 or sigma.shape[:2] != units_positions:
        raise ValueError(
            f"field L{i}/singular_values has shape {sigma.shape}, expected (U, P, K) with (U, P) = {units_positions}"
        )
    side = -(-length // block)  # an operator stored as blocks of `block` positions
    for unit, op in operators.items():
        if op.shape != (side, side) or not unit < units_positions[0]:
            raise ValueError(
                f"field L{i}/operator/{unit} has shape {op.shape} for unit {unit}, "
                f"expected ({side}, {side}) for a unit below {units_positions[0]}"
            )
