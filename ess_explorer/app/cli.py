"""The ``ess-explorer`` command line: analyze a prompt, draw a figure, write a report.

    ess-explorer analyze [--model M] --prompt P [--layers 0,2-4] --out result-dir
    ess-explorer analyze --prompt-file long.txt --out result-dir     (or pipe the prompt on stdin)
    ess-explorer figure result-dir --kind overview --out fig.pdf
    ess-explorer figure a-dir b-dir --kind compare --width double --out cmp.pdf
    ess-explorer report [--model M] --prompt P --out report.html     (or --result result-dir)
    ess-explorer models                                              (the built-in zoo)
    ess-explorer models --families                  (every supported model type and its families)
    ess-explorer sweep --models zoo:la_k16,zoo:lfm2 --prompts prompts.txt --out sweep-dir [--backend ray]

With no --model, the built-in default model (zoo.DEFAULT_MODEL) is used: offline; with no
prompt either (none given, nothing piped), a zoo model's example prompt (one sequence of the
MQAR task it was trained on), so `ess-explorer report --out r.html` alone works.
Results are cached on disk (runs.py, io.ResultCache; $ESS_EXPLORER_CACHE or ~/.cache/ess-explorer);
--no-cache computes afresh and leaves the cache alone.

Exit status: 0 success, 1 a failure (unknown model, unreadable file, bad data), 2 a bad
command line. Every error is one line on stderr: ``ess-explorer: error: ...``
(ESS_EXPLORER_DEBUG=1 re-raises every error with its traceback). A cache that cannot be written
only warns: the result is still printed and written to --out.
"""

from __future__ import annotations

import argparse
import inspect
import sys
import time
from pathlib import Path

from .._version import __version__
from ..options import FIGURE_KINDS, VARIANTS, environment_switch
from .arguments import (  # noqa: F401  (parse_layers and MAX_LAYER_INDEX are part of the CLI module's API)
    MAX_LAYER_INDEX,
    UsageError,
    _height,
    _positive_int,
    _ppi,
    _width,
    add_advice_options,
    add_analysis_options,
    add_settings_arguments,
    figure_options,
    merge_model_argument,
    parse_layers,
    settings_options,
)
from .terminal import format_advice, format_summary, read_chat, read_prompt, say

__all__ = ["main", "build_parser", "parse_layers"]

PROG = "ess-explorer"


class _Parser(argparse.ArgumentParser):
    # argparse prints the usage block and exits; we want one line and a return code.
    def error(self, message):
        raise UsageError(f"{message} (see `{self.prog} --help`)")


# ---- seams: the model-dependent steps, replaceable in tests ------------------------------
def _default_source() -> str:
    from .. import zoo

    return f"zoo:{zoo.DEFAULT_MODEL}"


def _resolve_source(model: str | None) -> str:
    """--model as load_model understands it: the default zoo model when absent, and a bare
    zoo name ("mamba2_n16") as "zoo:mamba2_n16" when no folder of that name exists."""
    if model is None:
        return _default_source()
    if not model.startswith("zoo:") and not Path(model).expanduser().exists():
        try:
            from .. import zoo

            if model in zoo.list_models():
                return f"zoo:{model}"
        except ImportError:
            pass
    return model


def _example_prompt(source: str) -> str | None:
    """A zoo model's example prompt (one held-out sequence of its own MQAR task, seed 0),
    used when no prompt is given; None for any other model."""
    if not source.startswith("zoo:"):
        return None
    try:
        from .. import zoo

        return zoo.task_of(source[4:]).prompt(seed=0)
    except Exception:  # noqa: BLE001 (no task file: then the user must give a prompt)
        return None


def _load_model(source: str, revision: str | None):
    from ..sources import load_model

    return load_model(source, revision=revision)


def _analyze(model, input_ids, tokenizer, **options):
    """`analysis.analyze` (imported late: `--help` needs no torch); tests replace it."""
    from ..analysis import analyze

    return analyze(model, input_ids, tokenizer=tokenizer, **options)


def _identity_without_weights(source: str, revision):
    from ..sources import identity_without_weights

    return identity_without_weights(source, revision)


def _identity(source: str, model, revision):
    from ..sources import model_identity

    return model_identity(source, model, revision=revision)


# ---- commands ----------------------------------------------------------------------------
def _nothing_to_store() -> None:
    return None


def _steps(args):
    """The run's model steps (runs.RunSteps) through this module's seams, saying what they do."""
    import contextlib

    from ..runs import RunSteps, quiet_transformers

    def load(source, revision):
        say(args, f"loading {source} ...")
        with quiet_transformers() if args.quiet else contextlib.nullcontext():  # its own bar and notices
            return _load_model(source, revision)

    def analyze(model, input_ids, tokenizer, **options):
        count = len(input_ids)
        say(args, f"analysing {count} token{'s' if count != 1 else ''} ...")
        return _analyze(model, input_ids, tokenizer, **options)

    return RunSteps(
        load=load,
        identity=lambda *given: _identity(*given),
        identity_without_weights=lambda *given: _identity_without_weights(*given),
        analyze=analyze,
    )


def compute_result(args):
    """The result of the command line's run (runs.run_cached: through the cache unless
    --no-cache). Returns (result, cache_hit, store): ``store()`` writes a computed result to
    the cache, and is called after --out is written, so a cache that cannot be written never
    costs it."""
    from ..io import ResultCache
    from ..runs import RunRequest, RunSettings, run_cached

    layers = parse_layers(args.layers)  # usage errors first, before reading stdin or loading
    source = _resolve_source(args.model)
    chat = read_chat(args) if getattr(args, "chat", None) else None
    prompt = None if chat is not None else read_prompt(args, source, _example_prompt)
    if args.absolute and args.scope != "cut":
        raise ValueError("--scope chooses which sigma_1 a relative tolerance refers to; drop it with --absolute")
    settings = RunSettings(layers=layers, device=args.device, **settings_options(args))  # checked before loading
    return run_cached(
        RunRequest(source, prompt=prompt, chat=chat, settings=settings, revision=args.revision),
        cache=None if args.no_cache else ResultCache(args.cache_dir),
        steps=_steps(args),
        progress=not args.quiet,
        max_seconds=args.max_seconds or None,  # 0: no limit
    )


def cmd_analyze(args) -> int:
    from ..io import write_result_dir

    result, hit, store = compute_result(args)
    print(format_summary(result, cache_hit=None if args.no_cache else hit))
    if args.out:
        out = write_result_dir(result, args.out)
        print(f"wrote {out}/ (result.npz, table.csv, meta.json)")
    store()
    return _verify(args, result) if args.verify else 0


def _verify(args, result) -> int:
    """--verify: the result against plain SVDs of a sample of its cuts (verification.py), after
    it is written and cached; 1 where any cut breaks the contract."""
    from ..verification import verify

    say(args, "verifying against plain SVDs ...")
    model, _ = _load_model(_resolve_source(args.model), args.revision)  # a cache hit loaded no weights
    report = verify(result, model, cuts=args.verify)
    print(report)
    return 0 if report.passed else 1


def cmd_figure(args) -> int:
    if args.kind not in FIGURE_KINDS:
        raise UsageError(f"unknown --kind {args.kind!r}; kinds: {', '.join(FIGURE_KINDS)}")
    from ..io import read_result
    from ..views.figures import figure
    from ..views.render import save_figure

    if Path(args.out).suffix.lower() not in (".pdf", ".svg", ".png"):
        raise UsageError(f"--out must end in .pdf, .svg or .png, got {args.out!r}")
    results = [read_result(path) for path in args.result]
    if len(results) > 1:  # series named by model (the CLI's source, e.g. zoo:lfm2), told apart by folder
        from ..views.figures import _default_label

        data = {}
        for path, res in zip(args.result, results):
            label = _default_label(res)
            data[label if label not in data else f"{label} ({Path(path).name})"] = res
    else:
        data = results[0]
    options = figure_options(args)
    from ..views.figures import KIND_DOCS, KINDS

    taken = set(inspect.signature(KINDS[args.kind]).parameters)
    unknown = sorted(set(options) - taken)
    if unknown:  # e.g. --variant for the operator view: a command-line mistake
        flags = ", ".join("--" + {"layer": "layers", "check_prompt": "any-prompt"}.get(name, name) for name in unknown)
        raise UsageError(f"--kind {args.kind} takes no {flags}; it takes: {KIND_DOCS[args.kind]}")
    start = time.perf_counter()
    chart = figure(data, args.kind, width=args.width, height=args.height, font=args.font, **options)
    path = save_figure(chart, args.out, ppi=args.ppi)
    print(f"wrote {path} ({args.kind}, {time.perf_counter() - start:.2f} s)")
    return 0


def cmd_report(args) -> int:
    from ..io import read_result
    from .report import write_report

    if not args.out.lower().endswith((".html", ".htm")):
        raise UsageError(f"--out must end in .html, got {args.out!r}")
    if args.result is not None:
        if args.prompt is not None or args.prompt_file is not None or args.model is not None:
            raise UsageError("--result reports a saved result: give no --model / --prompt with it")
        result, hit, store = read_result(args.result), None, _nothing_to_store
    else:
        result, hit, store = compute_result(args)
        hit = None if args.no_cache else hit
    print(format_summary(result, cache_hit=hit))
    layer = parse_layers(args.layer) if args.layer is not None else None
    if layer is not None and len(layer) != 1:
        raise UsageError("--layer takes one layer index")
    path = write_report(result, args.out, layer=None if layer is None else layer[0])
    print(f"wrote {path} (self-contained, works offline)")
    store()
    return 0


def cmd_models(args) -> int:
    from .. import zoo

    if args.families:
        from ..capture import supported_families
        from ..capture.registry import REFUSED

        table = supported_families()
        width = max(map(len, [*table, *REFUSED]))
        for model_type, families in table.items():
            print(f"{model_type:<{width}}  {', '.join(families)}")
        print("\nnot supported, and why:")
        for model_type, reason in sorted(REFUSED.items()):
            print(f"{model_type:<{width}}  {reason}")
        return 0

    names = zoo.list_models()
    if not names:
        print(f"no zoo models found in {zoo.ZOO_DIR}")
        return 1
    for name in names:
        mark = " (default)" if name == zoo.DEFAULT_MODEL else ""
        print(f"zoo:{name}{mark}")
    return 0


def cmd_sweep(args) -> int:
    from ..sweep import run_sweep

    models = [_resolve_source(m.strip()) for m in args.models.split(",") if m.strip()]
    if not models:
        raise UsageError("--models takes a comma-separated list of sources, e.g. zoo:la_k16,zoo:lfm2")
    init = {"num_cpus": args.num_cpus} if args.num_cpus else None
    done = run_sweep(
        models,
        args.prompts,
        out=args.out,
        layers=parse_layers(args.layers),
        backend=args.backend,
        shard_size=args.shard_size,
        bucket_by_length=args.bucket,
        text_field=args.text_field,
        **settings_options(args),
        device=args.device,
        progress=not args.quiet,
        ray_address=args.ray_address,
        ray_init=init,
    )
    print(
        f"{len(done.runs)} run(s) x {done.computed + done.skipped} shard(s): computed {done.computed}, "
        f"{done.skipped} already there; table: {Path(args.out) / 'table'} (ess_explorer.sweep.read_table)"
    )
    return 0


def cmd_advise(args) -> int:
    from ..sweep.advice import advise

    if not Path(args.sweep_dir).is_dir():
        raise ValueError(f"{args.sweep_dir} is not a folder; pass the --out folder of `{PROG} sweep`")
    advice = advise(
        args.sweep_dir,
        quantile=args.quantile,
        variant=args.variant,
        kv_heads=args.kv_heads,
        n_boot=args.n_boot,
        seed=args.seed,
    )
    if args.out:
        advice.to_json(args.out)
    print(format_advice(advice.to_dict()))
    return 0


# ---- parser ------------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog=PROG, description="Effective State-Size (ESS) of sequence-model layers.")
    parser.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    sub = parser.add_subparsers(dest="command", parser_class=_Parser, metavar="COMMAND")

    analyze = sub.add_parser("analyze", help="analyse one prompt; print ESS per layer; save a result directory")
    add_analysis_options(analyze)
    analyze.add_argument("--out", "-o", help="result directory to write (result.npz, table.csv, meta.json)")
    analyze.add_argument(
        "--verify",
        nargs="?",
        const=8,
        type=_positive_int,
        metavar="CUTS",
        help="then check the result against plain SVDs of CUTS cuts (default 8) of 4 units per layer, "
        "under its accuracy contract; exit 1 where it fails",
    )
    analyze.set_defaults(func=cmd_analyze)

    fig = sub.add_parser("figure", help="a publication figure (PDF, SVG or PNG) from saved results")
    fig.add_argument("result", nargs="+", help="result directory or .npz (several: overlay / compare)")
    fig.add_argument("--kind", "-k", required=True, help=f"one of: {', '.join(FIGURE_KINDS)}")
    fig.add_argument("--out", "-o", required=True, help="output file: .pdf, .svg or .png")
    fig.add_argument("--layers", "-l", help="layers to show (spectrum/operator: one layer)")
    fig.add_argument("--t", type=int, help="position t of the cut (spectrum, operator)")
    fig.add_argument("--positions", help="several positions for the spectrum, e.g. 8,16,32")
    fig.add_argument("--unit", type=int, help="unit (head or channel) for spectrum / operator")
    fig.add_argument("--variant", choices=VARIANTS, help="ESS variant (default tolerance)")
    fig.add_argument(
        "--against",
        choices=["ceiling", "tss"],
        help="utilisation: against the attainable ceiling min(TSS, t, L - t) (default) or TSS (the paper's)",
    )
    fig.add_argument("--any-prompt", action="store_true", help="compare: allow results of different prompts")
    fig.add_argument("--width", type=_width, default="single", help="single (3.33 in), double (7 in) or points")
    fig.add_argument("--height", type=_height, help="height in points (default: from the width)")
    fig.add_argument("--font", choices=["serif", "sans"], default="serif")
    fig.add_argument("--ppi", type=_ppi, default=300, help="PNG resolution (default 300)")
    fig.set_defaults(func=cmd_figure)

    report = sub.add_parser("report", help="one self-contained HTML report with the linked views")
    add_analysis_options(report)
    report.add_argument("--result", help="report a saved result directory instead of analysing")
    report.add_argument(
        "--layer", help="the layer the explorer opens on (default: the one closest to its attainable ceiling)"
    )
    report.add_argument("--out", "-o", required=True, help="output .html file")
    report.set_defaults(func=cmd_report)

    models = sub.add_parser("models", help="list the built-in zoo models (--families: every supported model type)")
    models.add_argument("--families", action="store_true", help="list every supported model type with its families")
    models.set_defaults(func=cmd_models)

    sw = sub.add_parser("sweep", help="ESS of many prompts x models into a Parquet table (resumable; local or Ray)")
    sw.add_argument(
        "--models", required=True, help="comma-separated sources: hub ids, folders, zoo:NAME, training runs"
    )
    sw.add_argument("--prompts", required=True, help="a text file (one prompt per line) or a .jsonl file")
    sw.add_argument("--out", "-o", required=True, help="sweep folder (a rerun resumes it)")
    sw.add_argument("--backend", choices=["local", "ray"], default="local")
    sw.add_argument("--layers", "-l", help="layers to analyse, e.g. 0,2,5-7 (default: all)")
    sw.add_argument("--shard-size", type=_positive_int, default=16, help="prompts per table file (default 16)")
    sw.add_argument("--bucket", action="store_true", help="group prompts of similar length into shards")
    sw.add_argument("--text-field", default="text", help="the prompt field of a .jsonl file (default text)")
    add_settings_arguments(sw)
    sw.set_defaults(scope=None)  # run_sweep's own default: the reset-aware scope (sweep.run.sweep_scope)
    sw.add_argument("--device", help="torch device, e.g. cuda (Ray: each task asks for one GPU)")
    sw.add_argument("--ray-address", help="join a running Ray cluster (e.g. auto); default: start a local one")
    sw.add_argument("--num-cpus", type=_positive_int, help="CPUs of the local Ray cluster (default: all)")
    sw.add_argument("--quiet", "-q", action="store_true", help="no progress bar")
    sw.set_defaults(func=cmd_sweep)

    adv = sub.add_parser("advise", help="the state each layer of a sweep needs, with bootstrap intervals")
    add_advice_options(adv)
    adv.set_defaults(func=cmd_advise)
    return parser


def _one_line_warning(message, category, filename, lineno, file=None, line=None):
    # A warning (e.g. a cache that cannot be written) is one line, like the errors.
    print(f"{PROG}: warning: {message}", file=sys.stderr if file is None else file)


def main(argv=None) -> int:
    """Entry point of ``ess-explorer``; returns the exit status (0, 1 failure, 2 usage)."""
    import warnings

    with warnings.catch_warnings():
        if not _debug():
            warnings.showwarning = _one_line_warning
        return _main(argv)


def _debug() -> bool:
    return environment_switch("ESS_EXPLORER_DEBUG", default=False)


def _main(argv=None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
        if args.command is None:
            parser.print_help()
            return 2
        merge_model_argument(args)
        if getattr(args, "tol", None) is None and hasattr(args, "tol"):
            from ..core.ess import DEFAULT_TOL

            args.tol = DEFAULT_TOL
        return int(args.func(args) or 0)
    except SystemExit as done:  # --help and --version exit through argparse
        return int(done.code or 0) if isinstance(done.code, (int, type(None))) else 2
    except UsageError as error:
        if _debug():
            raise
        print(f"{PROG}: error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr)
        return 130
    except (ValueError, FileNotFoundError, KeyError, OSError) as error:
        if _debug():
            raise
        message = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        if isinstance(error, KeyError):  # KeyError's str() is the quoted key
            message = message.strip("'\"")
        print(f"{PROG}: error: {message}", file=sys.stderr)
        return 1
    except BaseException as error:  # a bug (or a native panic), not a user error: one line, traceback on request
        if _debug():
            raise
        text = str(error).strip().splitlines()[0] if str(error).strip() else ""
        print(
            f"{PROG}: error: internal error ({type(error).__name__}: {text}); "
            "set ESS_EXPLORER_DEBUG=1 for the traceback",
            file=sys.stderr,
        )
        return 1


if __name__ == "__main__":  # python -m ess_explorer.app.cli
    sys.exit(main())
