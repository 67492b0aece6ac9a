"""Types of the command line's arguments: each parses one value or raises a one-line error.

A bad value is a `UsageError` (exit status 2) or an argparse type error, whose message
says what was wrong and what is allowed; nothing here touches a model or a file.
"""

from __future__ import annotations

import argparse

__all__ = ["UsageError", "MAX_LAYER_INDEX", "parse_layers", "figure_options"]


class UsageError(Exception):
    """A bad command line (exit status 2)."""


MAX_LAYER_INDEX = 100_000


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


def _tolerance(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number such as 1e-3, got {text!r}") from None
    if not value >= 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"the tolerance must be a finite number >= 0, got {text!r}")
    return value


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
    from ..views.render import MAX_PPI

    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--ppi is a number such as 300, got {text!r}") from None
    if not 0 < value <= MAX_PPI:
        raise argparse.ArgumentTypeError(f"--ppi must be in (0, {MAX_PPI}] (300 is print resolution), got {text!r}")
    return value


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
