"""`verify` on random analyses for a while (prints; not a test): every run's sampled cuts
against plain float64 SVDs under the contract it was computed with, and their causal ESS against
the exact sweep where the family has a realisation (ess_explorer/verification.py).

    python benchmarks/verify_sweep.py                      # real shapes, one random layer a run
    python benchmarks/verify_sweep.py --tiny --minutes 30  # every tiny config of the tests
    python benchmarks/verify_sweep.py --zoo --minutes 10   # the zoo's trained models, every layer
    python benchmarks/verify_sweep.py --tiny --extreme     # ... with weights scaled to extremes

Each run draws a model, a prompt length, a layer and the options a user can vary: precision,
gates, scope, and with --tiny also a stride and an absolute tolerance. Real shapes are the
random models of benchmarks/_models.py, a Qwen3-Next-shaped delta-rule layer among them (Mamba2
under "ess" only: "exact" takes 13 s a layer);
--tiny takes the configs of tests/test_adapters.py and tests/test_families.py (every model
type the package registers) with seeded weights; --zoo the trained models the package ships
(docs/zoo.md), whose operators random weights do not resemble (heads that forget within a few
tokens, or keep nearly every state direction), on prompts of random tokens. A refusal
(ValueError: a combination the API rejects with a message, such as a stride longer than the
prompt) is counted, not failed; any other error or a failed `verify` is printed in full. Exit
status 1 if anything failed.

--extreme scales a third of each drawn model's weight tensors by 10^u, u uniform in [-2, 2]
(on a copy): sharp or flat attention, decays near 0 or 1, gates saturated or shut, the operators
trained weights make and random ones do not; a model whose forward pass then overflows must be
refused with a message, not fail.
"""

from __future__ import annotations

import argparse
import copy
import functools
import os
import random
import sys
import time
import traceback
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch
from _models import random_model, token_ids

from ess_explorer import analyze, verify, zoo
from ess_explorer.options import GATES, PRECISIONS, SCOPES  # every choice a user has, in the package's order


def real_shapes(rng: random.Random, models: dict):
    """(name, model, ids, analyze options) of one run on a random model in a real shape."""
    kind = rng.choice(sorted(models))
    model = models[kind]
    per_channel = kind in ("mamba2", "qwen3_next")  # gates inside: a unit per channel, the costliest
    length = rng.randrange(100, 300 if per_channel else 420)
    options = dict(
        layers=[rng.randrange(model.config.num_hidden_layers)],
        precision="ess" if kind == "mamba2" else rng.choice(["ess", "ess", "exact"]),
        gates=rng.choice(GATES),
        scope=rng.choice(SCOPES),
    )
    return kind, model, token_ids(model, length), options


def tiny_configs(rng: random.Random, builders: list):
    """The same for a tiny config of the tests, seeded, with strides and absolute tolerances too."""
    name, module = rng.choice(builders)
    seed = rng.randrange(1000)
    model, _ = module.build(name, seed)
    length = rng.choice([2, 3, 5, 16, 33, 64, 97, 128, 200])
    ids = torch.randint(1, module.VOCAB, (1, length), generator=torch.Generator().manual_seed(seed))
    options = dict(
        precision=rng.choice(PRECISIONS),
        gates=rng.choice(GATES),
        stride=rng.choice([None, None, 3]),
    )
    if rng.random() < 1 / 3:
        options["relative"], options["tol"] = False, 1e-4  # absolute: no scope to choose
    else:
        options["scope"] = rng.choice(SCOPES)
    return name, model, ids, {k: v for k, v in options.items() if v is not None}


def zoo_models(rng: random.Random, models: dict):
    """The same for a model of the zoo (trained weights), every layer, with the options of `real_shapes`."""
    name = rng.choice(sorted(models))
    model = models[name]
    length = rng.choice([16, 64, 128, 200, 256])
    ids = torch.randint(
        1, model.config.vocab_size, (1, length), generator=torch.Generator().manual_seed(rng.randrange(1000))
    )
    options = dict(
        precision=rng.choice(PRECISIONS),
        gates=rng.choice(GATES),
        scope=rng.choice(SCOPES),
    )
    return name, model, ids, options


def extreme(rng: random.Random, draw):
    """``draw`` with a third of the model's weight tensors scaled by 10^u, u in [-2, 2], on a copy."""

    def scaled():
        name, model, ids, options = draw()
        model = copy.deepcopy(model)
        with torch.no_grad():
            for parameter in model.parameters():
                if rng.random() < 1 / 3:
                    parameter.mul_(10 ** rng.uniform(-2, 2))
        return f"{name} (extreme weights)", model, ids, options

    return scaled


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--tiny", action="store_true", help="the tests' tiny configs instead of real shapes")
    which.add_argument("--zoo", action="store_true", help="the zoo's trained models instead of real shapes")
    parser.add_argument("--extreme", action="store_true", help="scale a third of each model's weights to extremes")
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    if args.tiny:
        sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
        import test_adapters
        import test_families

        builders = [(n, m) for m in (test_adapters, test_families) for n in sorted(m.CONFIGS)]
        draw = functools.partial(tiny_configs, rng, builders)
    elif args.zoo:
        models = {name: zoo.load(name)[0] for name in zoo.list_models()}
        draw = functools.partial(zoo_models, rng, models)
    else:
        models = {kind: random_model(kind) for kind in ("gpt2", "mamba", "mamba2", "lfm2", "qwen3_next")}
        draw = functools.partial(real_shapes, rng, models)
    if args.extreme:
        draw = extreme(rng, draw)
    runs = refused = failed = causal = 0
    deadline = time.perf_counter() + 60 * args.minutes
    while time.perf_counter() < deadline:
        name, model, ids, options = draw()
        try:
            try:
                result = analyze(model, ids, progress=False, **options)
            except ValueError as error:  # the API refusing these options; verify refusing its result fails below
                refused += 1
                if not (args.tiny or args.zoo):
                    print(f"refused: {name} {options}: {error}", flush=True)
                continue
            report = verify(result, model, units=8, cuts=8, seed=runs)
        except Exception:
            failed += 1
            print(f"ERROR {name} L = {len(torch.as_tensor(ids).flatten())} {options}", flush=True)
            traceback.print_exc()
            continue
        runs += 1
        causal += sum(row["causal_ess_sweep"] is not None for row in report.rows)
        if not report.passed:
            failed += 1
            print(f"FAILED {name} L = {len(result.input_ids)} {options}\n{report}", flush=True)
    print(f"{runs} runs verified ({causal} cuts' causal ESS among them), {refused} refused by the API, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
