"""Mamba / S6 selective scan (Mamba, FalconMamba, and Jamba's mamba layers).

Math. Per channel c (d_inner of them) with N state modes, after the model's conv,
activation, x_proj (and FalconMamba / Jamba's norms on dt, B, C):

    dt_t   = softplus(dt_raw[c, t] + dt_bias[c])                    (scalar per channel, time)
    h_t    = exp(dt_t A[c]) * h_{t-1} + dt_t B_t u_t                 A[c] = -exp(A_log[c]) in R^N
    y_t    = C_t . h_t + D[c] u_t
    T_c[i, j] = C_i . (prod_{t=j+1..i} exp(dt_t A[c])) * dt_j B_j   (+ D[c] on the diagonal)

The scan output is then multiplied token-wise by silu(z) (the gate; outside T).

As a DiagonalSSM per channel: a = exp(dt A[c]) (L, N), b = dt B (L, N), c = C (L, N)
(shared by all channels), d = D[c] (L,). Unit = channel, U = d_inner. Never dense per
channel: a layer's channels go to the factored core path as one batched DiagonalSSM
((U, L, N) tensors, built in float64 from the captured float32 values), O(L N^3) per
channel; only a few kept channels are ever materialised (L x L each).
TSS per channel: N (d_state).

Zamba calls the scan once per "mamba head" (a slice of the channels, each with its own
B and C): every call of the layer is kept and the channels concatenated in call order.

Capture: the mixer calls the module-level ``mamba_selective_scan(u, dt, A, B, C, D, z,
delta_bias, delta_softplus, ...)`` of its own modeling module (transformers 5.24 and 5.25; in
5.25 the ``kernels`` package makes it an nn.Module, read by `scan_signature`; see
docs/families.md). For the one forward pass that function is wrapped in the mixer's module
(restored in a ``finally``); the wrapper records its arguments and output for the layer
whose mixer is running (forward pre/post hooks on the mixer). The wrapped call still runs
the original function, so the model's output is unchanged.
"""

from __future__ import annotations

import inspect

import torch
import torch.nn.functional as F

from ..core.operators import DiagonalSSM
from ..core.units import SSMCapture
from .base import CaptureSession, LayerSlot, transformers_outside_tested_range

__all__ = ["MambaAdapter", "ScanAdapter", "scan_signature", "wrap_scan"]


def scan_signature(function) -> inspect.Signature:
    """The parameters of a module-level scan function, by name.

    From transformers 5.25 with the ``kernels`` package installed, a function decorated with
    ``use_kernel_forward_from_hub`` is an ``nn.Module`` instance whose ``forward(*args,
    **kwargs)`` calls the decorated function it closes over (``func``); that function (or
    the one it wraps) has the real parameters. Without them the recorded arguments could not
    be read by name.
    """
    signature = inspect.signature(function)
    if all(p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) for p in signature.parameters.values()):
        forward = getattr(type(function), "forward", None)
        inner = inspect.getclosurevars(forward).nonlocals.get("func") if inspect.isfunction(forward) else None
        if callable(inner):
            return inspect.signature(inner)
        mismatch = transformers_outside_tested_range()
        raise RuntimeError(
            f"cannot read the parameters of {function!r}: it takes only *args, **kwargs and wraps no function "
            "this package knows how to find; "
            + (mismatch or "the installed transformers or kernels package wraps it in a way not seen before")
        )
    return signature


def wrap_scan(session: CaptureSession, original):
    """A wrapper of a module-level scan function that records bound arguments and output
    into ``session.raw[session.current]["scan"]`` (only while a tracked mixer runs)."""
    signature = scan_signature(original)

    def wrapper(*args, **kwargs):
        output = original(*args, **kwargs)
        if session.current is not None:
            bound = signature.bind(*args, **kwargs)
            bound.apply_defaults()
            arguments = {k: (v.detach() if isinstance(v, torch.Tensor) else v) for k, v in bound.arguments.items()}
            arguments.update(arguments.pop("kwargs", None) or {})
            result = output[0] if isinstance(output, tuple) else output
            store = session.store(session.current)
            store["scan"] = (arguments, result.detach())
            # Zamba calls the scan once per mamba head (a slice of the channels): keep all calls
            store.setdefault("calls", []).append(store["scan"])
        return output

    wrapper.__wrapped__ = original
    return wrapper


class ScanAdapter:
    """A family whose mixer calls a module-level scan ``function``: wrap it for one pass."""

    family: str
    function: str

    def install(self, session: CaptureSession, slot: LayerSlot) -> None:
        session.track(slot.index, slot.module)
        session.patch_function(type(slot.module).__module__, self.function, lambda f: wrap_scan(session, f))

    def scan_call(self, slot: LayerSlot, raw: dict) -> tuple[dict, torch.Tensor]:
        """The recorded (arguments, output) of the layer's scan call."""
        if "scan" not in raw:
            raise RuntimeError(
                f"layer {slot.index}: {type(slot.module).__name__} did not call {self.function} during the forward "
                "pass (a fused kernel path?); run the model in eval mode on the pure-torch path"
            )
        return raw["scan"]


class MambaAdapter(ScanAdapter):
    family = "mamba"
    function = "mamba_selective_scan"

    def build(self, slot: LayerSlot, raw: dict) -> SSMCapture:
        self.scan_call(slot, raw)
        calls = raw.get("calls") or [raw["scan"]]
        parts = [_selective_scan_tensors(args, result) for args, result in calls]
        u, dt, A, D, y = (torch.cat([p[k] for p in parts]) for k in ("u", "dt", "A", "D", "y"))
        gates = [p["gate"] for p in parts]
        gate = None if any(g is None for g in gates) else torch.cat(gates)[..., None]
        B = torch.stack([p["B"] for p in parts])  # (G, L, N): one B, C per scan call
        C = torch.stack([p["C"] for p in parts])
        group = torch.cat([torch.full((p["u"].shape[0],), g, dtype=torch.long) for g, p in enumerate(parts)])
        channels, length = u.shape
        n = A.shape[-1]
        # Checked once here, on the small tensors the operators are made of, rather than on every
        # (units, L, N) realisation (as much time as the counting, per Mamba layer):
        # exp(dt A) with dt >= 0 and A <= 0 and the products of finite values stay finite.
        for name, value in (("dt", dt), ("A", A), ("B", B), ("C", C), ("D", D)):
            if not bool(torch.isfinite(value).all()):
                raise ValueError(f"layer {slot.index}: the model's {name} contains NaN or infinite values")

        def realize(index: torch.Tensor) -> DiagonalSSM:
            step = dt[index][..., None]  # (u, L, 1)
            return DiagonalSSM.derived(
                a=torch.exp(step * A[index][:, None, :]),
                b=step * B[group[index]],
                c=C[group[index]],
                d=D[index][:, None].expand(len(index), length),
            )

        info = {"d_inner": channels, "d_state": n}
        if len(parts) > 1:
            info["scan_calls"] = len(parts)
        return SSMCapture(
            layer=slot.index,
            family=self.family,
            inputs=u[..., None],
            outputs=y[..., None],
            out_gate=gate,
            state_size=n,
            multiplicity=1,  # one channel per unit
            info=info,
            realize=realize,
        )


def _selective_scan_tensors(args: dict, result: torch.Tensor) -> dict:
    """One recorded ``mamba_selective_scan`` call -> float64 u, dt (D, L), A (D, N), B, C
    (L, N), D (D,), gate silu(z) (D, L) or None, y (D, L)."""
    u = args["hidden_states"][0].to(torch.float64)  # (D, L)
    dt = args["dt"][0].to(torch.float64)  # (D, L)
    if args.get("delta_bias") is not None:
        dt = dt + args["delta_bias"].to(torch.float64)[:, None]
    if args.get("delta_softplus"):
        dt = F.softplus(dt)
    D = args.get("D")
    z = args.get("z")
    return {
        "u": u,
        "dt": dt,
        "A": args["A"].to(torch.float64),
        "B": args["B"][0].to(torch.float64).T,
        "C": args["C"][0].to(torch.float64).T,
        "D": torch.zeros(u.shape[0], dtype=torch.float64) if D is None else D.to(torch.float64),
        "gate": None if z is None else F.silu(z[0].to(torch.float64)),
        "y": result[0].to(torch.float64),
    }
