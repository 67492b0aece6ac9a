"""The %ess line magic: ``%load_ext ess_explorer`` then

    %ess                                             # default model, example prompt
    %ess --model zoo:mamba2_n16 --layer 1 "ba 07 ko 31 | ko"
    %ess --model gpt2 --unit max --variant entropy "The cat sat on the mat."
    %ess --result run.npz                            # a saved ESSResult, no model
    %ess --wait                                      # return once the analysis has ended
    %ess --help                                      # every option

It opens the same explorer as ``ess_explorer.explore`` (and returns it, so it displays).
Bad options print argparse's usage and a clear message instead of a traceback; so does any
other failure (a missing result file, a model that cannot be loaded): one line that says
what was wrong. ``ESS_EXPLORER_DEBUG=1`` re-raises with the traceback.
"""

from __future__ import annotations

import argparse
import shlex

from ..options import AGGREGATES, VARIANTS, environment_switch
from .arguments import parse_tolerance

__all__ = ["load_ipython_extension", "ess_magic", "parse_ess_args"]


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # argparse would exit the kernel's process; raise instead
        raise ValueError(f"%ess: {message}\n{self.format_usage()}")


def _unit(text: str):
    if text in AGGREGATES:
        return text
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"unit must be {', '.join(AGGREGATES)} or a unit index, got {text!r}"
        ) from None


def _parser() -> argparse.ArgumentParser:
    p = _Parser(prog="%ess", description="Open the ESS explorer.", add_help=False)
    p.add_argument("prompt", nargs="*", help="prompt text (quote it); default: the model's example prompt")
    p.add_argument("--help", "-h", action="store_true", help="print this help and open nothing")
    p.add_argument("--model", "-m", default=None, help="zoo:NAME, a hub id or a local folder")
    p.add_argument("--layer", "-l", type=int, default=None)
    p.add_argument(
        "--unit", "-u", type=_unit, default="mean", help=f"{', '.join(AGGREGATES)} or a head / channel index"
    )
    p.add_argument("--variant", choices=VARIANTS, default="tolerance", help="the ESS shown")
    p.add_argument(
        "--tol", type=parse_tolerance, default=None, help="tolerance (relative to sigma_1 unless --absolute)"
    )
    p.add_argument("--absolute", action="store_true", help="the tolerance is absolute, not relative to sigma_1")
    p.add_argument("--stride", type=int, default=None, help="position stride of the overview pass (default: auto)")
    p.add_argument("--result", default=None, help="open a saved ESSResult (.npz) instead of running a model")
    p.add_argument(
        "--wait",
        action="store_true",
        help="return once the analysis has ended, so the cell's output holds the finished figure "
        "(a notebook executed for export); default: at once, the analysis continuing in the background",
    )
    return p


def _parse(line: str) -> argparse.Namespace:
    try:
        words = shlex.split(line)
    except ValueError as error:  # an unbalanced quote
        raise ValueError(f"%ess: cannot split the line ({error}); quote the prompt once") from error
    return _parser().parse_args(words)


def parse_ess_args(line: str) -> tuple[str | None, str | None, dict]:
    """(model, prompt, explore options) from the magic's line; ValueError with usage."""
    return _explore_arguments(_parse(line))


def _explore_arguments(args: argparse.Namespace) -> tuple[str | None, str | None, dict]:
    options = {"layer": args.layer, "unit": args.unit, "variant": args.variant}
    if args.tol is not None:
        options["tol"] = args.tol
    if args.absolute:
        options["relative"] = False
    if args.stride is not None:
        if args.stride < 1:
            raise ValueError("%ess: --stride must be a positive integer")
        options["stride"] = args.stride
    if args.result is not None:
        from ..result import ESSResult

        try:
            options["result"] = ESSResult.load(args.result)
        except FileNotFoundError:
            raise ValueError(
                f"%ess: no saved result at {args.result!r}; give the path of a .npz written by "
                "ESSResult.save or `ess-explorer analyze --out`"
            ) from None
    prompt = " ".join(args.prompt) if args.prompt else None
    return args.model, prompt, options


def ess_magic(line: str = ""):
    """%ess [--model M] [--layer N] [--unit U] [--variant V] [--tol X] [--absolute] [--wait] "prompt"
    (``%ess --help`` lists every option)."""
    from .widget import explore

    debug = environment_switch("ESS_EXPLORER_DEBUG", default=False)
    try:
        args = _parse(line)
        if args.help:
            print(_parser().format_help())
            return None
        model, prompt, options = _explore_arguments(args)
    except ValueError as error:
        if debug:
            raise
        print(error)
        return None
    try:
        explorer = explore(model, prompt, **options)
        if args.wait:
            explorer.wait()
        return explorer
    except Exception as error:  # noqa: BLE001 (a notebook user gets one line, not a traceback)
        if debug:
            raise
        first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        print(f"%ess: error: {first} (set ESS_EXPLORER_DEBUG=1 for the traceback)")
        return None


def load_ipython_extension(ipython) -> None:
    """Called by ``%load_ext ess_explorer``: registers the %ess line magic."""
    ipython.register_magic_function(ess_magic, magic_kind="line", magic_name="ess")
