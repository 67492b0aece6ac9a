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

Saved as one ``.npz`` file (numpy arrays + a JSON header), loaded with
``allow_pickle=False``: no code is ever unpickled from a result file.
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
from .core.diagnostics import utilisation
from .core.ess import check_variant
from .core.layer import layer_arrays
from .core.operators import DiagonalSSM
from .core.units import CapturedLayer, DenseCapture, SSMCapture

FORMAT_VERSION = 1
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

    @property
    def n_units(self) -> int:
        return int(self.tolerance_ess.shape[0])

    @property
    def spectra_complete(self) -> np.ndarray:
        """(U, P) bool: True where the kept values are the whole spectrum of H_t."""
        return self.rank_bound <= self.singular_values.shape[-1]

    def tolerance_ess_at(self, tol: float, relative: bool = True) -> tuple[np.ndarray, np.ndarray]:
        """tolerance-ESS recomputed from the kept singular values (no model needed).

        Returns (ess, exact): ``exact`` is False where the count reached the number of kept
        values K and more values exist, so the true ESS may be larger (a lower bound).
        """
        if not np.isfinite(tol) or tol < 0:
            raise ValueError(f"tol must be a finite non-negative number, got {tol}")
        sigma = self.singular_values
        threshold = tol * sigma[..., :1] if relative else np.full_like(sigma[..., :1], tol)
        ess = (sigma > threshold).sum(-1)
        exact = self.spectra_complete | (ess < sigma.shape[-1])
        return ess, exact

    @classmethod
    def from_units(cls, units: CapturedLayer, positions=None, *, tol: float, relative: bool, **options) -> "LayerESS":
        """Spectra and both ESS of every unit of one layer's operators (core/layer.py:
        `layer_arrays` takes unit_ids, operator_rows, top_k, device)."""
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
    ) -> "LayerESS":
        """The LayerESS of a layer given directly by its operators, built like `analyze`'s.

        operator: a dense stack (U, L, L) or a DiagonalSSM with batch shape (U,). The
        capacity (TSS) follows ``family`` (core/diagnostics.py) with ``state_size`` (taken
        from a DiagonalSSM when not given), ``window`` or ``kernel_size``, unless ``tss``
        ((P,) or (U, P)) gives it. Units listed in ``keep_operators`` keep their dense T.
        """
        import torch

        if isinstance(operator, DiagonalSSM):
            units = SSMCapture(
                layer=layer,
                family=family,
                state_size=state_size or operator.state_size,
                realize=lambda index: operator[index],
                shape=(int(operator.batch_shape.numel()), operator.length),
            )
        else:
            stack = torch.as_tensor(operator)
            if stack.ndim != 3 or stack.shape[-1] != stack.shape[-2]:
                raise ValueError(f"operator must be a stack (U, L, L) or a DiagonalSSM, got shape {tuple(stack.shape)}")
            units = DenseCapture(layer=layer, family=family, operator=stack, state_size=state_size, window=window,
                                 kernel_size=kernel_size)
        return cls.from_units(units, positions, tol=tol, relative=relative, operator_rows=list(keep_operators),
                              top_k=top_k, device=device, tss=tss, operator_dtype=torch.float64)

    def ess(self, variant: str = "tolerance") -> np.ndarray:
        """(U, P) ESS of the named variant (core/ess.py: check_variant refuses unknown names)."""
        return {"tolerance": self.tolerance_ess, "entropy": self.entropy_ess}[check_variant(variant)]

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

    def layer(self, index: int) -> LayerESS:
        if index not in self.layers:
            raise KeyError(f"layer {index} was not analysed; analysed layers: {sorted(self.layers)}")
        return self.layers[index]

    def to_frame(self):
        """Tidy table: one row per (layer, unit, t) with the columns layer, unit, t, token,
        family, unit_kind, tolerance_ess, entropy_ess, tss, utilisation."""
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
                        "tolerance_ess": lay.tolerance_ess.reshape(-1),
                        "entropy_ess": lay.entropy_ess.reshape(-1),
                        "tss": lay.tss.reshape(-1),
                        "utilisation": lay.utilisation().reshape(-1),
                    }
                )
            )
        columns = ["layer", "unit", "t", "token", "family", "unit_kind", "tolerance_ess", "entropy_ess", "tss", "utilisation"]
        return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=columns)

    # ---- persistence: one .npz, JSON header, no pickle -------------------------------
    def save(self, path) -> Path:
        path = Path(path)
        if path.suffix != ".npz":
            path = path.with_suffix(path.suffix + ".npz") if path.suffix else path.with_suffix(".npz")
        header = {
            "format_version": FORMAT_VERSION,
            "tokens": list(self.tokens),
            "input_ids": [int(i) for i in self.input_ids],
            "meta": self.meta,
            "layers": {
                str(i): {"family": lay.family, "unit_kind": lay.unit_kind, "operators": sorted(lay.operators),
                         "path": lay.path}
                for i, lay in self.layers.items()
            },
        }
        arrays = {"__header__": np.frombuffer(json.dumps(header).encode("utf-8"), dtype=np.uint8)}
        for i, lay in self.layers.items():
            for name in ("positions", "tolerance_ess", "entropy_ess", "tss", "singular_values", "rank_bound"):
                arrays[f"L{i}/{name}"] = np.asarray(getattr(lay, name))
            for unit, op in lay.operators.items():
                arrays[f"L{i}/operator/{unit}"] = np.asarray(op)
        return atomic_write_with(path, lambda handle: np.savez_compressed(handle, **arrays))

    @classmethod
    def load(cls, path) -> "ESSResult":
        path = Path(path)
        if not path.exists():
            raise FileNotFoundError(f"no ESS result at {path}")
        try:
            with np.load(path, allow_pickle=False) as data:
                header = json.loads(bytes(data["__header__"]).decode("utf-8"))
                if header.get("format_version") != FORMAT_VERSION:
                    raise ValueError(f"unsupported result format {header.get('format_version')}")
                layers = {}
                for key, info in header["layers"].items():
                    i = int(key)
                    fields = {
                        name: data[f"L{i}/{name}"]
                        for name in ("positions", "tolerance_ess", "entropy_ess", "tss", "singular_values", "rank_bound")
                    }
                    operators = {int(u): data[f"L{i}/operator/{u}"] for u in info["operators"]}
                    path = info.get("path", {})
                    path = {str(k): str(v) for k, v in path.items()} if isinstance(path, dict) else {}
                    layers[i] = LayerESS(i, info["family"], info["unit_kind"], operators=operators, path=path,
                                         **fields)
        except (OSError, KeyError, ValueError, EOFError, zipfile.BadZipFile, zlib.error) as error:
            raise ValueError(f"{path} is not a readable ESS result ({error}); recompute it") from error
        return cls(header["tokens"], header["input_ids"], layers, header["meta"])
