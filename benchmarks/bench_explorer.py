"""The explorer's responsiveness: how soon the widget is on screen, how soon the first chart,
how long until every layer is exact; against one `analyze` call of the whole model.

    HF_HUB_OFFLINE=1 python benchmarks/bench_explorer.py [--lengths 128 256] [--models gpt2 mamba lfm2]
        [--first-only]

Models with the real shapes and random weights (benchmarks/_models.py: built from configs,
nothing downloaded), and the zoo's default model on its example prompt. The selected layer is
--layer (1). Prints seconds and the process's peak memory; asserts nothing.
"""

from __future__ import annotations

import argparse
import time

import torch
from _models import KINDS, random_model, token_ids


def measure(source: str, prompt: str, first_only: bool = False, **options) -> dict:
    """Seconds to: explore() returning (the widget and its progress bar on screen), the
    first chart, every layer exact (NaN with ``first_only``: the run is cancelled after the
    first chart)."""
    from ess_explorer import explore

    started = time.perf_counter()
    ex = explore(source, prompt, static=False, cache=False, **options)
    visible = time.perf_counter() - started
    while ex.chart is None and ex.busy:
        time.sleep(0.01)
    first = time.perf_counter() - started
    first_stride = ex.result.layers[min(ex.result.layers)].positions if ex.result is not None else None
    strided = first_stride is not None and len(first_stride) < ex.result.length
    if first_only:
        ex.session.cancel()
        ex.wait()
        return {"visible": visible, "first_chart": first, "all_exact": float("nan"), "first_strided": strided}
    assert ex.wait() is True, ex.status_w.value
    return {
        "visible": visible,
        "first_chart": first,
        "all_exact": time.perf_counter() - started,
        "first_strided": strided,
    }


def whole_model(model, ids) -> float:
    from ess_explorer import analyze

    started = time.perf_counter()
    analyze(model, ids, progress=False)
    return time.perf_counter() - started


def _peak_gb() -> float:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB -> GiB (the whole process)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[128, 256])
    parser.add_argument("--models", nargs="+", default=["gpt2", "mamba"], choices=sorted(KINDS))
    parser.add_argument("--first-only", action="store_true", help="stop each run after its first chart")
    parser.add_argument("--layer", type=int, default=1, help="the selected layer")
    args = parser.parse_args()
    from ess_explorer import zoo
    from ess_explorer.analysis import capture_layers

    print(f"torch threads {torch.get_num_threads()}; times in s (a shared machine varies by ~2x)")
    default = f"zoo:{zoo.DEFAULT_MODEL}"
    row = measure(default, zoo.task_of(zoo.DEFAULT_MODEL).prompt(seed=0), first_only=args.first_only)
    print(
        f"{default:22s} widget {row['visible']:.2f}  first chart {row['first_chart']:.2f}  all exact {row['all_exact']:.2f}"
    )
    for kind in args.models:
        model = random_model(kind)
        for length in args.lengths:
            ids = token_ids(model, length)
            prompt = " ".join(str(i) for i in ids)

            def capture(model_, tokenizer, text, gates="inside", on_layer=None):
                return capture_layers(model_, [int(w) for w in text.split()], gates=gates, on_layer=on_layer)

            row = measure(
                f"random {kind}",
                prompt,
                first_only=args.first_only,
                load_fn=lambda source: (model, None),
                capture_fn=capture,
                layer=args.layer,
            )
            line = (
                f"{'random ' + kind:22s} L={length:4d}  widget {row['visible']:.2f}  first chart "
                f"{row['first_chart']:.2f} ({'strided' if row['first_strided'] else 'exact'})"
            )
            if not args.first_only:
                whole = whole_model(model, ids)
                line += f"  all exact {row['all_exact']:.2f}  | analyze(whole model) {whole:.2f}"
            print(f"{line}  | peak RSS so far {_peak_gb():.2f} GB", flush=True)


if __name__ == "__main__":
    main()
