"""Benchmark of the spectra engine's paths, for the device it runs on (prints; not a test).

    python benchmarks/bench_engine.py                      # short run (< 2 min on 2 CPU cores)
    python benchmarks/bench_engine.py --full               # the real-scale cases
    python benchmarks/bench_engine.py --models             # + whole random models through analyze
    python benchmarks/bench_engine.py --device cuda --full --models

Every case runs in a fresh subprocess, so that its peak memory is its own: peak RSS
(ru_maxrss, whole process: torch included) on CPU, torch.cuda.max_memory_allocated on a GPU.
Each time is printed as wall seconds and as the process's CPU seconds (all threads), which
is the steadier figure on a shared machine.
Cases (each timed under both accuracy contracts where they differ, core/precision.py:
"ess", the default, and "exact"):
1. factored: scan vs sweep on a batch of Mamba-shaped channels (N = 16), and the dense
   path on the materialised operator of one channel; max |dsigma| / sigma_1 against the sweep.
   1b. the same scan vs sweep on Gated DeltaNet heads (DPLR transitions, N = 128 with --full).
2. dense: the batched path (cuts grouped by size) vs the per-cut loop, GPT-2-shaped softmax
   heads (head_dim 64), float64: trained-like heads (half attention sinks, a quarter sharp, a
   quarter near-uniform: synthetic.trained_like_attention), then random-weight ones; the former's
   steep spectra defeat the exact contract's Gram guard. On a CPU also the eigenvalues of a
   batch of Grams on one thread, torch's eigvalsh against the dense path's compiled kernel.
3. a Mamba-130m-shaped layer: 1536 channels, N = 16, L = 1024 (--full; default 192
   channels, L = 512), all cuts, both ESS variants, method "auto"; on a CPU also the floor
   that its SVDs alone set (their per-call cost, measured in the run, spread over the threads)
   and each contract's time as a ratio of it.
4. (--models) whole models through ess_explorer.analyze (random weights, built from
   transformers configs in benchmarks/_models.py, nothing downloaded): GPT-2-small and
   Mamba-130m at L = 512 and 1024 (Mamba also 2048 on a GPU; and at L = 32, and at L = 512
   every 16th cut, on a CPU), Mamba2-130m (N = 128) at
   L = 256 with gates inside and outside, LFM2-350M at L = 512, each under "ess" and some
   under "exact" (MODEL_CASES); skipped when transformers is missing.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))


def delta_rule_like(units: int, length: int, state: int, seed: int = 0):
    """Gated DeltaNet heads: A_t = alpha_t (I - beta_t k_t k_t^T), ||k_t|| = 1, b = beta_t k_t,
    c = q_t / sqrt(N); alpha in (0.9, 1) as in a trained model, beta in (0, 1)."""
    from ess_explorer import DPLRSSM

    g = torch.Generator().manual_seed(seed)
    shape = (units, length, state)
    k = torch.nn.functional.normalize(torch.randn(shape, generator=g, dtype=torch.float64), dim=-1)
    alpha = 0.9 + 0.1 * torch.rand(units, length, 1, generator=g, dtype=torch.float64)
    beta = torch.rand(units, length, 1, generator=g, dtype=torch.float64)
    c = torch.randn(shape, generator=g, dtype=torch.float64) / state**0.5
    return DPLRSSM(alpha.expand(shape), (-alpha * beta * k)[..., None], k[..., None], beta * k, c)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def _peak_gb(device: torch.device) -> float:
    import resource

    if device.type == "cuda":
        return torch.cuda.max_memory_allocated() / 2**30
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB -> GiB


def _error(values: torch.Tensor, reference: torch.Tensor) -> float:
    width = min(values.shape[-1], reference.shape[-1])
    scale = reference[..., :1].clamp_min(1e-300)
    return ((values[..., :width].cpu() - reference[..., :width].cpu()).abs() / scale.cpu()).max().item()


# The compiled CPU kernels each case can reach (on a GPU none: each compile costs seconds of the
# GPU script's fixed time for nothing).
KERNELS_OF = {
    "dense_unit": ("dense",),
    "batched": ("dense",),
    "per_cut": ("dense",),
    "eig_call": ("dense",),
    "mamba_layer": ("gramian",),
    "model": ("dense", "gramian"),
}


def run_case(name: str, params: dict, device_name: str) -> dict:
    """One case, in this (fresh) process. Returns seconds, peak memory and accuracy figures."""
    from _models import mamba_like

    from ess_explorer import entropy_ess, hankel_singular_values, tolerance_ess
    from ess_explorer.core import dense_kernel, gramian

    device = torch.device(device_name)
    out: dict = {}
    # the CPU kernels a case uses, compiled (once per install) or loaded before any timing: a
    # small warm-up job would take torch's route (dense_jobs.takes, gramian.uses_kernel)
    if device.type == "cpu" and name in KERNELS_OF:
        for load in KERNELS_OF[name]:
            {"dense": dense_kernel.load, "gramian": gramian.load}[load]()
    if name in ("sweep", "scan", "dense_unit"):
        ssm = mamba_like(params["units"], params["L"], 16)
        if name == "dense_unit":
            op = ssm[:1].materialize()
            fn = lambda: hankel_singular_values(op, device=device)  # noqa: E731
        else:
            fn = lambda: hankel_singular_values(ssm, device=device, method=name)  # noqa: E731
        fn_ref = lambda: hankel_singular_values(ssm[:1], method="sweep")  # noqa: E731
    elif name in ("dplr_sweep", "dplr_scan"):
        ssm = delta_rule_like(params["units"], params["L"], params["N"])
        fn = lambda: hankel_singular_values(ssm, device=device, method=name[5:])  # noqa: E731
        fn_ref = lambda: hankel_singular_values(ssm[:1], method="sweep")  # noqa: E731
    elif name in ("batched", "per_cut"):
        from ess_explorer.synthetic import softmax_attention, trained_like_attention

        if params.get("heads") == "trained":
            op = trained_like_attention(params["L"], head_dim=64, units=params["units"], seed=1)
        else:
            op = softmax_attention(params["L"], head_dim=64, units=params["units"], seed=1)
        precision = params.get("precision", "exact")
        fn = lambda: hankel_singular_values(op, device=device, batched=name == "batched", precision=precision)  # noqa: E731
        fn_ref = None
    elif name == "mamba_layer":
        ssm = mamba_like(params["units"], params["L"], 16)

        def fn(op=ssm):
            sigma = hankel_singular_values(op, device=device, precision=params.get("precision", "exact"))
            return sigma, tolerance_ess(spectra=sigma), entropy_ess(spectra=sigma)

        # the same calls, short: anything else they need, untimed (on a GPU the kernels' compile,
        # and with a whole layer's channels the choice between them and torch: eigen.kernel_or_torch)
        fn(mamba_like(params["units"], 128, 16))
        fn_ref = None
    elif name == "model":
        return run_model(params, device)
    elif name == "svd_call":
        return svd_call_cost(params["N"])
    elif name == "eig_call":
        return eig_call_cost(params["n"])
    else:
        raise ValueError(f"unknown case {name}")
    _sync(device)
    start, cpu_start = time.perf_counter(), time.process_time()
    value = fn()
    _sync(device)
    out["seconds"] = time.perf_counter() - start
    out["cpu_seconds"] = time.process_time() - cpu_start  # all threads: the honest figure on a shared machine
    out["peak_gb"] = _peak_gb(device)
    if device.type == "cuda":
        out["routes"] = chosen_routes()
    if name == "mamba_layer":
        out["mean_tolerance_ess"] = value[1].double().mean().item()
        out["mean_entropy_ess"] = value[2].double().mean().item()
    elif fn_ref is not None:
        out["max_err_vs_sweep"] = _error(value[:1], fn_ref())
    elif name in ("batched", "per_cut"):  # against the exact per-cut loop on CPU, two heads
        ref = hankel_singular_values(op[:2], batched=False)
        out["max_err_vs_per_cut"] = _error(value[:2], ref)
        out["miscounts"] = int((tolerance_ess(spectra=value[:2].cpu()) != tolerance_ess(spectra=ref)).sum())
        entropy, reference = entropy_ess(spectra=value[:2].cpu()), entropy_ess(spectra=ref)
        out["entropy_err"] = float(((entropy - reference).abs() / reference.clamp_min(1e-300)).max())
    return out


def svd_call_cost(state: int, batch: int = 256, repeats: int = 40) -> dict:
    """Microseconds per matrix of the N x N svdvals a factored cut makes on a CPU: one thread,
    float64, in batches of about a chunk's size, warm in cache, the best of ``repeats``."""
    torch.set_num_threads(1)
    square = torch.randn(batch, state, state, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        torch.linalg.svdvals(square)
        best = min(best, time.perf_counter() - start)
    return {"svd_us": best / batch * 1e6}


def eig_call_cost(n: int, batch: int = 64, repeats: int = 3) -> dict:
    """Milliseconds per matrix for the eigenvalues of a batch of float64 n x n Grams on one
    thread: torch's `eigvalsh` (LAPACK) and the dense path's compiled kernel
    (core/dense_kernel.py, compiled or loaded by `run_case`), each the best of ``repeats``."""
    from ess_explorer.core import dense_kernel

    torch.set_num_threads(1)
    factor = torch.randn(batch, n + 8, n, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    grams = factor.mT @ factor
    out = {}
    for label, solve in (("torch_ms", torch.linalg.eigvalsh), ("kernel_ms", dense_kernel.symmetric_eigenvalues)):
        best = float("inf")
        for _ in range(repeats):
            start = time.perf_counter()
            solve(grams)
            best = min(best, time.perf_counter() - start)
        out[label] = best / batch * 1e3
    return out


def run_model(params: dict, device: torch.device) -> dict:
    from _models import random_model, token_ids

    from ess_explorer import analyze, verify

    model = random_model(params["kind"]).to(device)
    ids = token_ids(model, params["L"])
    # the same calls on a short prompt, untimed (`run_case` has compiled or loaded the kernels)
    analyze(model, ids[:128], progress=False, device=device, layers=range(1), gates=params.get("gates", "inside"))
    _sync(device)
    start, cpu_start = time.perf_counter(), time.process_time()
    layers = range(params["layers"]) if "layers" in params else None  # the first n layers, else all
    result = analyze(
        model,
        ids,
        progress=False,
        device=device,
        gates=params.get("gates", "inside"),
        layers=layers,
        causal=params.get("causal", True),
        precision=params.get("precision", "ess"),
        stride=params.get("stride"),
    )
    _sync(device)
    seconds, cpu_seconds, peak_gb = time.perf_counter() - start, time.process_time() - cpu_start, _peak_gb(device)
    lay = result.layers[min(result.layers)]
    out = {
        "seconds": seconds,
        "cpu_seconds": cpu_seconds,
        "peak_gb": peak_gb,
        "verified": "not finished",
        "layers": len(result.layers),
        "model_layers": model.config.num_hidden_layers,
        "path": lay.path,
        "mean_tolerance_ess_layer0": float(lay.tolerance_ess.mean()),
        **({"routes": chosen_routes()} if device.type == "cuda" else {}),
    }
    print(json.dumps(out), flush=True)  # the timing stands if the check below runs out of time (`child`)
    # untimed: the numbers against plain SVDs of 32 cuts a layer; on a GPU of the first and last
    # layers only (the check's SVDs and exact sweeps are the slow reference, not the engine)
    checked = None if device.type == "cpu" else sorted({min(result.layers), max(result.layers)})
    check = verify(result, model, layers=checked, units=4, cuts=8)
    out["verified"] = f"{len(check.rows)} cuts" + (f" of layers {checked}" if checked else "") + ", "
    out["verified"] += "all within the contract" if check.passed else f"{len(check.failures)} FAILED"
    if params.get("floor") and device.type == "cpu":  # the same layers' arithmetic floor, in this run
        from mamba2_floor import floor_seconds

        out["floor_s"] = sum(floor_seconds(model, ids, result.layers)[0].values())
    return out


CASE_TIMEOUT: float | None = None  # seconds a case may run (--case-timeout), None: no limit


def child(name: str, params: dict, device: str) -> dict:
    """Run one case in a fresh process; its result is the last JSON line it printed. A case that
    outlives CASE_TIMEOUT is stopped and reported, keeping what it printed by then (a model
    case prints its timing before its check), so that one slow case does not end the run."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [os.path.dirname(HERE), env.get("PYTHONPATH")]))
    command = [sys.executable, __file__, "--device", device, "--case", name, json.dumps(params)]
    try:
        run = subprocess.run(command, capture_output=True, text=True, env=env, timeout=CASE_TIMEOUT)
    except subprocess.TimeoutExpired as stopped:
        printed = _json_lines(stopped.stdout)
        return printed[-1] if printed else {"error": f"stopped at the case time limit ({CASE_TIMEOUT:g} s)"}
    if run.returncode != 0:  # the error's last line, and where it was raised
        lines = run.stderr.strip().splitlines() or [f"exit {run.returncode}"]
        frames = [line.strip() for line in lines if line.lstrip().startswith("File ")]
        ours = [frame for frame in frames if "/ess_explorer/" in frame or "/benchmarks/" in frame]
        return {"error": lines[-1], "where": list(dict.fromkeys(ours[-3:] + frames[-1:]))}
    return _json_lines(run.stdout)[-1]


def _json_lines(stdout) -> list[dict]:
    """The JSON lines a case printed, whole ones only (a stopped case may have cut its last)."""
    text = stdout.decode() if isinstance(stdout, bytes) else stdout or ""
    lines = []
    for line in filter(lambda line: line.startswith("{"), text.splitlines()):
        try:
            lines.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return lines


def _get(case: dict, key: str) -> float:
    return case.get(key, float("nan"))


def chosen_routes() -> str:
    """Which route each size class of small eigenproblems took on this GPU, kernel or torch,
    with their timings on the batch that decided (core/eigen.py `kernel_or_torch`)."""
    from ess_explorer.core import eigen

    chosen = [
        f"{route} n <= {2**size}: {choice}" + (f" ({kernel:.4f} s vs {torch_s:.4f} s)" if kernel is not None else "")
        for (route, size), (choice, kernel, torch_s) in sorted(eigen.route_choices().items())
    ]
    return "; ".join(chosen) or "none timed"


def show(label: str, case: dict, extra: str = "") -> None:
    if "error" in case:
        print(f"  {label:<52} failed: {case['error']}", flush=True)
        for line in case.get("where", []):
            print(f"    {line}", flush=True)
        return
    print(
        f"  {label:<52} {case['seconds']:8.2f} s wall {case['cpu_seconds']:8.2f} s CPU   "
        f"peak {case['peak_gb']:6.2f} GB  {extra}",
        flush=True,
    )
    if "routes" in case:
        print(f"    routes: {case['routes']}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--full", action="store_true", help="the real-scale cases")
    parser.add_argument("--models", action="store_true", help="whole random GPT-2-small / Mamba-130m models")
    parser.add_argument("--models-only", action="store_true", help="only the whole-model cases")
    parser.add_argument("--only", choices=["factored", "dense", "layer"], help="one engine section alone")
    parser.add_argument("--case-timeout", type=float, help="stop a case after this many seconds and go on")
    parser.add_argument("--case", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    global CASE_TIMEOUT
    CASE_TIMEOUT = args.case_timeout
    if args.case:
        print(json.dumps(run_case(args.case[0], json.loads(args.case[1]), args.device)))
        return
    dev = args.device
    memory = "torch.cuda.max_memory_allocated" if dev.startswith("cuda") else "ru_maxrss (whole process)"
    print(f"device {dev}, torch {torch.__version__}, {torch.get_num_threads()} threads; peak memory = {memory}")
    if not args.models_only:
        sections = [args.only] if args.only else ["factored", "dense", "layer"]
        if "factored" in sections:
            factored_cases(args, dev)
        if "dense" in sections:
            dense_cases(args, dev)
        if "layer" in sections:
            layer_case(args, dev)
    if args.models or args.models_only:
        model_cases(dev)


def factored_cases(args, dev: str) -> None:
    length = 1024 if args.full else 256
    units = 256 if args.full else 32
    print(f"\n1. factored, Mamba-shaped channels (N = 16), L = {length}, all cuts")
    times = {}
    for method in ("sweep", "scan"):
        case = child(method, {"units": units, "L": length}, dev)
        times[method] = case.get("seconds")
        error = _get(case, "max_err_vs_sweep")
        show(f"{method:<5} {units} channels", case, f"max err/sigma_1 vs CPU sweep {error:.1e}")
    if times["sweep"] and times["scan"]:
        print(f"  scan / sweep time: {times['scan'] / times['sweep']:.2f}")
    case = child("dense_unit", {"units": 1, "L": length}, dev)
    show("dense, 1 channel materialised", case, f"max err/sigma_1 vs CPU sweep {_get(case, 'max_err_vs_sweep'):.1e}")
    if "error" not in case and times["sweep"]:
        print(f"  dense per channel / sweep per channel: {case['seconds'] / (times['sweep'] / units):.0f}x")
    heads, n = (16, 128) if args.full else (4, 32)
    print(f"\n1b. factored, Gated DeltaNet heads (DPLR, rank 1, N = {n}), L = {length}, all cuts")
    for method in ("sweep", "scan"):
        case = child(f"dplr_{method}", {"units": heads, "L": length, "N": n}, dev)
        times[method] = case.get("seconds")
        show(f"{method:<5} {heads} heads", case, f"max err/sigma_1 vs CPU sweep {_get(case, 'max_err_vs_sweep'):.1e}")
    if times["sweep"] and times["scan"]:
        print(f"  scan / sweep time: {times['scan'] / times['sweep']:.2f}")


def dense_cases(args, dev: str) -> None:
    length, heads = (1024, 12) if args.full else (256, 2)
    print(f"\n2. dense, softmax heads (head_dim 64), L = {length}, {heads} heads, all cuts, float64")
    # the GPU's path is the batched one, the CPU's the per-cut loop (hankel_singular_values)
    path = "per_cut" if dev == "cpu" else "batched"
    # The default contract first, trained-like heads first within it: on a GPU the exact
    # contract on sink heads can outlast the step's time limit, which has in the past run out
    # before the trained-like heads were reached.
    kinds, times = ("trained", "random"), {}
    for precision in ("ess", "exact"):
        for kind in kinds:
            case = child(path, {"units": heads, "L": length, "heads": kind, "precision": precision}, dev)
            times[kind, precision] = case.get("seconds")
            accuracy = (
                f"vs exact per-cut: max err/sigma_1 {_get(case, 'max_err_vs_per_cut'):.1e}, "
                f"{case.get('miscounts', '?')} miscounts, entropy {_get(case, 'entropy_err'):.1e}"
            )
            show(f"{kind} heads, {path}, precision {precision}", case, accuracy)
    for kind in kinds:
        if times[kind, "exact"] and times[kind, "ess"]:
            print(f"  {kind} heads: exact / ess time {times[kind, 'exact'] / times[kind, 'ess']:.2f}")
    if dev != "cpu":
        loop = child("per_cut", {"units": heads, "L": length, "precision": "ess"}, dev)
        show("random heads, per-cut loop, precision ess", loop)
        return
    for n in (64, 128, 256):  # what the per-cut loop spends its time on, one solver against the other
        call = child("eig_call", {"n": n}, "cpu")
        if "error" in call:
            print(f"  eigenvalues of {n} x {n} Grams: failed: {call['error']}")
            continue
        print(
            f"  eigenvalues of 64 Grams {n} x {n}, one thread: torch eigvalsh {call['torch_ms']:.3f} ms, "
            f"compiled kernel {call['kernel_ms']:.3f} ms per matrix: {call['torch_ms'] / call['kernel_ms']:.2f}x"
        )


def layer_case(args, dev: str) -> None:
    channels, length = (1536, 1024) if args.full else (192, 512)
    print(f"\n3. Mamba-130m-shaped layer: {channels} channels, N = 16, L = {length}, all cuts, both variants")
    cases = {}
    for precision in ("ess", "exact"):
        cases[precision] = child("mamba_layer", {"units": channels, "L": length, "precision": precision}, dev)
        show(
            f"precision {precision}",
            cases[precision],
            f"mean tol-ESS {cases[precision].get('mean_tolerance_ess', float('nan')):.4f}, "
            f"mean entropy-ESS {cases[precision].get('mean_entropy_ess', float('nan')):.6f}",
        )
    if "seconds" in cases["ess"] and "seconds" in cases["exact"]:
        print(f"  exact / ess time: {cases['exact']['seconds'] / cases['ess']['seconds']:.2f}")
    if dev == "cpu":
        floor = svd_floor(cases, channels, length)
        if args.full and floor and "seconds" in cases["ess"]:
            seconds = cases["ess"]["seconds"]
            verdict = "met" if seconds <= 5 and seconds <= 0.7 * floor else "missed"
            print(f"  target (ess) <= 5 s and <= 0.7x the SVD floor: {verdict}")
    elif args.full and "seconds" in cases["ess"]:
        print(f"  target (ess) <= 0.3 s: {'met' if cases['ess']['seconds'] <= 0.3 else 'missed'}")


def svd_floor(cases: dict, channels: int, length: int) -> float | None:
    """What the SVDs alone cost at this machine's per-call speed, spread over every thread
    with nothing else to do: one N x N SVD per (channel, cut), one more for causal ESS.
    torch.linalg has no cheaper route to these spectra at N = 16 (docs/spectra.md), so a
    time below this line is out of reach for a CPU engine built on it. Returns the layer's
    floor in seconds (None where the SVD call failed)."""
    call = child("svd_call", {"N": 16}, "cpu")
    if "error" in call:
        print(f"  SVD floor: failed: {call['error']}")
        return None
    threads, svd = torch.get_num_threads(), call["svd_us"] * 1e-6
    floor = channels * (length - 1) * svd / threads
    ratio = "; ".join(f"{p} {c['seconds'] / floor:.2f}x it" for p, c in cases.items() if "seconds" in c)
    print(
        f"  SVD floor on {threads} threads ({svd * 1e6:.1f} us per 16 x 16 svdvals): this layer {floor:.1f} s; {ratio}"
    )
    whole = 24 * 1536 * 511 * 2 * svd / threads
    print(f"  SVD floor of a whole Mamba-130m at L = 512 with causal ESS: {whole:.0f} s ({whole / 2:.0f} s without)")
    return floor


def _model(kind: str, length: int, target: float | None = None, **options) -> dict:
    """One model case: every layer, gates inside, causal ESS, precision "ess" unless said.
    ``target``: the engine's goal for the whole model in seconds (docs/benchmarks.md), which
    `model_cases` prints as met or missed (for a case timed on its first layers only, against
    their time scaled to every layer of the model). ``floor=True``: the verdict also gives the
    case's time as a multiple of its layers' arithmetic floor (benchmarks/mamba2_floor.py,
    Mamba2 only), measured in the same run."""
    return {"kind": kind, "L": length, "gates": "inside", **options, **({"target_s": target} if target else {})}


def target_verdict(case: dict, params: dict) -> str:
    """'target <= X s: met' (or 'missed'), for a case with a target that ran; else ''."""
    if "target_s" not in params or "seconds" not in case:
        return ""
    seconds, note, model_layers = case["seconds"], "", case["model_layers"]
    if case["layers"] < model_layers:  # timed on its first layers: scale to the model
        seconds *= model_layers / case["layers"]
        note = f" ({model_layers} layers at this rate: {seconds:.0f} s)"
    verdict = "met" if seconds <= params["target_s"] else "missed"
    if "floor_s" in case:  # benchmarks/mamba2_floor.py: the formulation's arithmetic, no overhead
        verdict += (
            f" ({case['seconds'] / case['floor_s']:.1f}x the arithmetic floor of these layers, {case['floor_s']:.2f} s)"
        )
    return f"; target <= {params['target_s']:g} s for the model{note}: {verdict}"


# Mamba2 with gates inside makes each of a head's 64 value channels a unit with the head's
# N = 128 state (64x the units of gates outside): one layer of it is timed on a CPU. The
# "exact" cases show what the default contract saves; the targets are the "ess" ones.
MODEL_CASES = {
    "cpu": [
        _model("gpt2", 512, target=15),
        _model("gpt2", 512, precision="exact"),
        _model("mamba", 512, target=60),
        _model("mamba", 512, precision="exact", layers=4),
        _model("mamba", 512, causal=False),
        _model("mamba", 1024),
        _model("mamba", 32),  # a short prompt and a strided preview: the kernels' jobs are layers
        _model("mamba", 512, stride=16),
        # gates inside: seconds per layer, so one layer (x 24), with its floor (mamba2_floor.py)
        _model("mamba2", 256, target=30, layers=1, floor=True),
        _model("mamba2", 256, gates="outside"),
        _model("lfm2", 512),
        _model("gpt2", 1024),
    ],
    "gpu": [  # the targets first: gpu_check.sh gives this step a fixed time
        _model("mamba", 2048, target=20),
        _model("gpt2", 1024),
        _model("gpt2", 2048, target=60),
        _model("mamba", 512),
        _model("gpt2", 512),
        _model("mamba2", 256),
        _model("mamba", 512, precision="exact", layers=4),
    ],
}


def model_cases(dev: str) -> None:
    try:
        import transformers  # noqa: F401
    except ImportError:
        print("\n4. whole models: skipped (transformers is not installed)")
        return
    from _models import KINDS

    print("\n4. models through analyze (random weights, built from configs), every layer unless said, all cuts")
    for params in MODEL_CASES["cpu" if dev == "cpu" else "gpu"]:
        case = child("model", params, dev)
        label = f"{KINDS[params['kind']].split(' (')[0]}, L = {params['L']}, gates {params['gates']}"
        label += f", {params['layers']} layer(s)" if "layers" in params else ""
        label += f", every {params['stride']}th cut" if "stride" in params else ""
        label += ", no causal ESS" if params.get("causal") is False else ""
        label += f", {params.get('precision', 'ess')}"
        verdict = target_verdict(case, params)
        show(
            label,
            case,
            f"{case.get('layers', '?')} layers, layer-0 path {case.get('path', {}).get('method')}, "
            f"verify(): {case.get('verified')}{verdict}",
        )


if __name__ == "__main__":
    main()
