"""The explorer's responsiveness: how soon the widget is on screen, how soon the first chart,
how long until every layer is exact; against one `analyze` call of the whole model.

    OMP_NUM_THREADS=2 HF_HUB_OFFLINE=1 python benchmarks/bench_explorer.py [--lengths 128 256] [--models gpt2 mamba]

Models with the real shapes and random weights (built from configs, nothing downloaded):
GPT-2-small (12 layers x 12 heads) and Mamba-130m (24 layers, 1,536 channels, N = 16), and
the zoo's default model on its example prompt. Prints seconds and ratios; asserts nothing.
"""

from __future__ import annotations

import argparse
import time

import torch


def random_model(kind: str):
    from transformers import AutoModelForCausalLM, GPT2Config, MambaConfig

    torch.manual_seed(0)
    if kind == "gpt2":
        config = GPT2Config(n_positions=1024)  # GPT-2 small
    elif kind == "mamba":
        config = MambaConfig(hidden_size=768, num_hidden_layers=24, state_size=16, expand=2, vocab_size=50280)
    else:
        raise ValueError(kind)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="eager").eval()
    model.config._name_or_path = f"random {kind}"
    return model


def measure(source: str, prompt: str, **options) -> dict:
    """Seconds to: explore() returning (the widget and its progress bar on screen), the
    first chart, every layer exact."""
    from ess_explorer import explore

    started = time.perf_counter()
    ex = explore(source, prompt, static=False, cache=False, **options)
    visible = time.perf_counter() - started
    while ex.chart is None and ex.busy:
        time.sleep(0.01)
    first = time.perf_counter() - started
    assert ex.wait() is True, ex.status_w.value
    return {
        "visible": visible,
        "first_chart": first,
        "all_exact": time.perf_counter() - started,
        "layers": len(ex.result.layers),
        "length": ex.result.length,
    }


def whole_model(model, ids) -> float:
    from ess_explorer import analyze

    started = time.perf_counter()
    analyze(model, ids, progress=False)
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[128, 256])
    parser.add_argument("--models", nargs="+", default=["gpt2", "mamba"])
    args = parser.parse_args()
    from ess_explorer import zoo
    from ess_explorer.analysis import capture_layers

    print(f"torch threads {torch.get_num_threads()}; times in s (a shared machine varies by ~2x)")
    default = f"zoo:{zoo.DEFAULT_MODEL}"
    row = measure(default, zoo.task_of(zoo.DEFAULT_MODEL).prompt(seed=0))
    print(
        f"{default:22s} L={row['length']:4d}  widget {row['visible']:.2f}  first chart {row['first_chart']:.2f}"
        f"  all exact {row['all_exact']:.2f}"
    )
    for kind in args.models:
        model = random_model(kind)
        vocab = model.get_input_embeddings().num_embeddings
        for length in args.lengths:
            ids = [(17 * i + 3) % vocab for i in range(length)]
            prompt = " ".join(str(i) for i in ids)

            def capture(model_, tokenizer, text, gates="inside", on_layer=None):
                return capture_layers(model_, [int(w) for w in text.split()], gates=gates, on_layer=on_layer)

            row = measure(f"random {kind}", prompt, load_fn=lambda source: (model, None), capture_fn=capture, layer=1)
            whole = whole_model(model, ids)
            print(
                f"{'random ' + kind:22s} L={length:4d}  widget {row['visible']:.2f}  first chart "
                f"{row['first_chart']:.2f}  all exact {row['all_exact']:.2f}  | analyze(whole model) {whole:.2f}"
                f"  first chart / whole = {row['first_chart'] / whole:.2f}"
            )


if __name__ == "__main__":
    main()
