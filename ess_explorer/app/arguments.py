"""Types of the command line's arguments: each parses one value or raises a one-line error.

A bad value is a `UsageError` (exit status 2) or an argparse type error, whose message
says what was wrong and what is allowed; nothing here touches a model or a file.
"""

from __future__ import annotations

import argparse

from ..options import DEFAULT_GATES, DEFAULT_PRECISION, DEFAULT_SCOPE, GATES, PRECISIONS, SCOPES, VARIANTS

__all__ = [
    "UsageError",
    "MAX_LAYER_INDEX",
    "MAX_SECONDS",
    "parse_layers",
    "parse_tolerance",
    "add_settings_arguments",
    "settings_options",
    "add_analysis_options",
    "merge_model_argument",
    "add_precision_argument",
    "figure_options",
    "add_advice_options",
]


class UsageError(Exception):
    """A bad command line (exit status 2)."""


MAX_LAYER_INDEX = 100_000
# An analysis estimated to take longer than this is refused before its spectra
# (analysis.estimate_seconds); --max-seconds raises it, 0 lifts it.
MAX_SECONDS = 60.0


def parse_layers(text: str | None) -> list[int] | None:
    """ "0,2,5-7" -> [0, 2, 5, 6, 7]; None or "all" -> None (every layer)."""
    if text is None or text.strip().lower() == "all":
        return None
    layers = []
    for part in text.split(","):
        part = part.strip()
        try:
            if "-" in part[1:]:
                low, high = part.split("-", 1)
                low, high = int(low), int(high)
                if high < low:
                    raise ValueError
                if high > MAX_LAYER_INDEX:
                    raise UsageError(
                        f"--layers {text!r} reaches layer {high}; no model has that many layers "
                        "(give indices below the model's layer count, or leave --layers out for all)"
                    )
                layers.extend(range(low, high + 1))
            else:
                layers.append(int(part))
        except ValueError:
            raise UsageError(f"--layers takes indices and ranges like 0,2,5-7; got {text!r}") from None
    if any(i > MAX_LAYER_INDEX for i in layers):
        raise UsageError(
            f"--layers {text!r} names a layer beyond any model; give indices below the model's layer count"
        )
    if any(i < 0 for i in layers):
        raise UsageError(f"--layers takes non-negative indices; got {text!r}")
    return sorted(set(layers))


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def _finite_non_negative(text: str, example: str, what: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number such as {example}, got {text!r}") from None
    if not value >= 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"{what} must be a finite number >= 0, got {text!r}")
    return value


def parse_tolerance(text: str) -> float:
    """A tolerance as typed (the CLI's --tol, the magic's --tol): a finite number >= 0. Whether
    it must be below 1 depends on --absolute, and is checked with it (core.ess.check_tolerance)."""
    return _finite_non_negative(text, "1e-3", "the tolerance")


def _seconds(text: str) -> float:
    return _finite_non_negative(text, "600 (seconds; 0: no limit)", "--max-seconds")


def _points(text: str, what: str) -> float:
    from ..views.render import MAX_POINTS  # no Altair import: render imports only numpy here

    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{what} is a number of points, got {text!r}") from None
    if not 1 <= value <= MAX_POINTS:  # also refuses nan and inf
        raise argparse.ArgumentTypeError(f"{what} must be between 1 and {MAX_POINTS} points, got {text!r}")
    return value


def _width(text: str):
    if text in ("single", "double"):
        return text
    try:
        float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--width is single, double or a number of points, got {text!r}") from None
    return _points(text, "--width")


def _height(text: str) -> float:
    return _points(text, "--height")


def _ppi(text: str) -> float:
    from ..views.render import MAX_PPI, MIN_PPI

    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--ppi is a number such as 300, got {text!r}") from None
    if not MIN_PPI <= value <= MAX_PPI:
        raise argparse.ArgumentTypeError(
            f"--ppi must be in [{MIN_PPI}, {MAX_PPI}] (300 is print resolution), got {text!r}"
        )
    return value


def add_analysis_options(parser) -> None:
    """The options of `analyze` and `report`: the model, the prompt and the analysis."""
    parser.add_argument("--model", "-m", help="hub id, local folder, or zoo:NAME (default: the built-in default model)")
    # `ess-explorer analyze gpt2` as well as `--model gpt2`: the first thing a user types
    parser.add_argument("model_arg", nargs="?", metavar="MODEL", help="the model, as --model")
    parser.add_argument("--revision", help="hub revision (branch, tag or commit)")
    parser.add_argument("--prompt", "-p", help="the prompt text ('-' reads stdin)")
    parser.add_argument("--prompt-file", "-f", help="read the prompt from this file ('-' for stdin)")
    parser.add_argument(
        "--chat",
        help='a conversation as JSON ([{"role": ..., "content": ...}, ...]) formatted by the chat template; '
        "its turn ends are the separators",
    )
    parser.add_argument("--layers", "-l", help="layers to analyse, e.g. 0,2,5-7 (default: all)")
    add_settings_arguments(parser)
    parser.add_argument("--device", help="torch device for the spectra (default: the model's)")
    parser.add_argument("--max-seconds", type=_seconds, default=MAX_SECONDS, help="refuse a longer run (0: no limit)")
    parser.add_argument("--no-cache", action="store_true", help="compute afresh; neither read nor write the cache")
    parser.add_argument("--cache-dir", help="cache folder (default: $ESS_EXPLORER_CACHE or ~/.cache/ess-explorer)")
    parser.add_argument("--quiet", "-q", action="store_true", help="no progress output on stderr")


def merge_model_argument(args) -> None:
    """The model given without --model (`analyze MODEL`) as ``args.model``; both at once must agree."""
    given = getattr(args, "model_arg", None)
    if given is None:
        return
    if args.model is not None and args.model != given:
        raise UsageError(f"two models: {given!r} and --model {args.model!r}; give one")
    args.model = given


def add_settings_arguments(parser) -> None:
    """The settings that change the numbers, shared by `analyze`, `report` and `sweep`:
    tolerance, scope, gates, stride, causal ESS and precision (the choices from options.py)."""
    parser.add_argument("--tol", type=parse_tolerance, default=None, help="tolerance-ESS threshold (default 1e-3)")
    parser.add_argument(
        "--absolute", action="store_true", help="the tolerance is absolute (default: relative to sigma_1)"
    )
    parser.add_argument(
        "--scope",
        choices=SCOPES,
        default=DEFAULT_SCOPE,
        help="which sigma_1 a relative tolerance refers to: the cut's (default), the largest of the "
        "unit's cuts (reset-aware) or of the layer's",
    )
    parser.add_argument(
        "--gates",
        choices=GATES,
        default=DEFAULT_GATES,
        help="per-token gates around the sequence mixing (silu(z), gated norms) are part of T "
        "(inside, default) or not (outside)",
    )
    parser.add_argument("--stride", type=_positive_int, help="compute every STRIDE-th cut only (a quick preview)")
    parser.add_argument(
        "--no-causal",
        action="store_true",
        help="skip causal ESS (about a third of the time of a recurrent layer such as Mamba's)",
    )
    add_precision_argument(parser)


def settings_options(args) -> dict:
    """The settings of `add_settings_arguments` as keyword arguments (runs.RunSettings, sweep)."""
    return {
        "tol": args.tol,
        "relative": not args.absolute,
        "scope": args.scope,
        "gates": args.gates,
        "stride": args.stride,
        "causal": not args.no_causal,
        "precision": args.precision,
    }


def add_precision_argument(parser) -> None:
    """--precision (core/precision.py), for analyses and sweeps."""
    parser.add_argument(
        "--precision",
        choices=PRECISIONS,
        default=DEFAULT_PRECISION,
        help="accuracy contract: 'ess' (default) gives every ESS as exact spectra would, fast; "
        "'exact' keeps every singular value exact (for spectra far below the tolerance)",
    )


def figure_options(args) -> dict:
    """The keyword options of a figure kind from `figure`'s command line."""
    options = {}
    if args.layers is not None:
        layers = parse_layers(args.layers)
        if args.kind in ("spectrum", "operator"):
            if layers is None or len(layers) != 1:
                raise UsageError(f"--kind {args.kind} shows one layer: give --layers N")
            options["layer"] = layers[0]
        elif layers is not None:
            options["layers"] = layers
    for name in ("t", "unit", "variant", "against"):
        value = getattr(args, name)
        if value is not None:
            options[name] = value
    if args.any_prompt:
        options["check_prompt"] = False
    if args.positions is not None:
        try:
            options["positions"] = [int(p) for p in args.positions.split(",")]
        except ValueError:
            raise UsageError(f"--positions takes comma-separated integers, got {args.positions!r}") from None
    return options


def _quantile(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a quantile such as 0.99, got {text!r}") from None
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"the quantile must lie in (0, 1], got {text!r}")
    return value


def add_advice_options(parser) -> None:
    """The options of `ess-explorer advise` (sweep/advice.py)."""
    parser.add_argument("sweep_dir", metavar="SWEEP_DIR", help="a sweep folder (ess-explorer sweep --out)")
    parser.add_argument("--quantile", type=_quantile, default=0.99, help="fraction of cuts to cover (default 0.99)")
    parser.add_argument("--variant", choices=VARIANTS, default="tolerance", help="the ESS to follow")
    parser.add_argument("--kv-heads", type=_positive_int, help="KV heads of attention layers (default: the config)")
    parser.add_argument("--n-boot", type=_positive_int, default=1000, help="bootstrap resamples (default 1000)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the bootstrap (default 0)")
    parser.add_argument("--out", "-o", help="write the advice as JSON (Advice.to_dict) to this file")
