"""What the command line reads and prints: the prompt (argument, file, stdin or the
model's example), progress lines on stderr, the per-layer summary table, and the per-layer advice."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Callable

from ..bounded import read_text
from .arguments import UsageError

__all__ = ["read_prompt", "read_stdin", "say", "format_summary", "format_advice"]


def read_chat(args) -> list:
    """--chat FILE.json: a list of {"role", "content"} messages (or {"messages": [...]})."""
    if args.prompt is not None or args.prompt_file is not None:
        raise UsageError("give --chat or a prompt (--prompt, --prompt-file), not both")
    path = Path(args.chat)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ValueError(f"cannot read the chat file {path}: no such file") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ValueError(f"cannot read the chat file {path} as JSON ({error})") from None
    # the messages themselves are checked where they are formatted (analysis.chat_tokens)
    return data.get("messages") if isinstance(data, dict) else data


def read_prompt(args, source: str, example_prompt: Callable[[str], str | None]) -> str:
    """--prompt, --prompt-file (a path, or - for stdin), stdin when it is piped, else the
    example prompt of a zoo model (``example_prompt(source)``; so `ess-explorer analyze` alone
    works offline)."""
    if args.prompt is not None and args.prompt_file is not None:
        raise UsageError("give --prompt or --prompt-file, not both")
    if args.prompt == "-" or args.prompt_file == "-":
        text = read_stdin()
    elif args.prompt_file is not None:
        path = Path(args.prompt_file)
        try:
            with open(path, "rb") as handle:
                text = read_text(handle, f"the prompt file {path}")
        except FileNotFoundError:
            raise ValueError(f"cannot read the prompt file {path}: no such file") from None
        except OSError as error:
            raise ValueError(f"cannot read the prompt file {path}: {error}") from None
    elif args.prompt is not None:
        text = args.prompt
    else:
        text = "" if sys.stdin is None or sys.stdin.closed or sys.stdin.isatty() else read_stdin()
        if not text.strip():  # nothing given and nothing piped
            example = example_prompt(source)
            if example is None:
                raise UsageError("give a prompt: --prompt TEXT, --prompt-file FILE, or pipe it on stdin")
            say(args, f"no prompt given: using the example prompt of {source}")
            return example
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:  # undecodable bytes on the command line arrive as lone surrogates
        raise ValueError(
            "the prompt is not valid UTF-8 text; save it as UTF-8 and pass it with --prompt-file"
        ) from None
    if text.endswith("\n"):  # the newline an editor or `echo` adds is not part of the prompt
        text = text[:-1]
    if not text.strip():
        raise ValueError("the prompt is empty: ESS needs at least 2 tokens")
    return text


def read_stdin() -> str:
    """The prompt piped on stdin, read up to MAX_PROMPT_BYTES (an endless stream such as
    /dev/zero is refused at the limit)."""
    stream = sys.stdin
    if stream is None or stream.closed:
        raise ValueError("stdin is closed: give the prompt with --prompt TEXT or --prompt-file FILE")
    try:
        return read_text(getattr(stream, "buffer", stream), "the prompt on stdin")
    except UnicodeDecodeError:  # a text stream that decodes itself (no binary buffer)
        raise ValueError("the prompt on stdin is not valid UTF-8 text; convert it to UTF-8 (e.g. with iconv)") from None
    except ValueError as error:
        if "closed file" in str(error):
            raise ValueError("stdin is closed: give the prompt with --prompt TEXT or --prompt-file FILE") from None
        raise
    except OSError as error:
        raise ValueError(f"cannot read the prompt on stdin ({error}); give it with --prompt-file FILE") from None


def say(args, message: str) -> None:
    if not getattr(args, "quiet", False):
        print(message, file=sys.stderr)


def format_summary(result, *, cache_hit: bool | None = None) -> str:
    """The terminal summary: a header line and a fixed-width table of ESS per layer."""
    from ..io import summary_table

    table = summary_table(result)
    meta = result.meta
    head = (
        f"{meta.get('source') or meta.get('model_id', 'model')} · {result.length} tokens · tol {meta.get('tol')} "
        f"({'relative' if meta.get('relative', True) else 'absolute'}, scope {meta.get('scope', 'cut')}, gates {meta.get('gates', 'outside')})"
    )
    if meta.get("causal") is False:
        head += " · no causal ESS"
    if cache_hit is not None:
        head += " · cache " + ("hit" if cache_hit else "miss (computed)")
    # Per-unit means, then the layer totals in scalars (sum over units of channels x value).
    columns = [
        ("layer", "layer", "{}"),
        ("family", "family", "{}"),
        ("units", "units", "{}"),
        ("mean_ess", "mean ESS", "{:.2f}"),
        ("mean_tss", "mean TSS", "{:.2f}"),
        ("multiplicity", "ch/unit", "{}"),
        ("total_ess", "total ESS", "{:.0f}"),
        ("total_tss", "total TSS", "{:.0f}"),
        # utilisation = peak ESS / peak ceiling (per unit, mean over units): numerator and denominator shown
        ("peak_ess", "peak ESS", "{:.2f}"),
        ("peak_ceiling", "ceiling", "{:.2f}"),
        ("utilisation", "of ceil.", "{:.2f}"),
        ("tss_utilisation", "ESS/TSS", "{:.2f}"),
        ("state", "state", "{}"),
    ]
    cells = [[title for _, title, _ in columns]]
    for row in table.itertuples(index=False):
        record = row._asdict()
        cells.append([fmt.format(record[name]) for name, _, fmt in columns])
    widths = [max(len(r[c]) for r in cells) for c in range(len(columns))]
    lines = [
        "  ".join(
            cell.ljust(w) if c < 3 or c == len(columns) - 1 else cell.rjust(w)
            for c, (cell, w) in enumerate(zip(r, widths))
        )
        for r in cells
    ]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return head + "\n" + "\n".join(line.rstrip() for line in lines)


def _interval(estimate: dict, digits: int = 0) -> str:
    return f"{estimate['value']:.{digits}f} [{estimate['low']:.{digits}f}, {estimate['high']:.{digits}f}]"


def format_advice(advice: dict) -> str:
    """One line per layer of ``Advice.to_dict()``: the state it has, the advised state with its
    interval, and for attention the use of the attainable ceiling and the candidate flag."""
    lines = [
        f"advice at q = {advice['quantile']:g} of {advice['variant']}-ESS per unit "
        f"({advice['confidence']:.0%} bootstrap intervals over {advice['data'].get('n_prompts')} prompts)"
    ]
    for a in advice["layers"]:
        step = "" if a["checkpoint_step"] is None else f" step {a['checkpoint_step']}"
        head = f"{a['model']}{step} layer {a['layer']} ({a['family']}, {a['units']} units):"
        if a["kind"] == "attention":
            verdict = "a recurrent candidate" if a["candidate"] else "no recurrent candidate"
            verdict += f" (full attention would be advised {a['full_attention_state']})"
            body = (
                f"KV cache {a['state_scalars']:.0f} scalars ({a['kv_heads']} KV heads), "
                f"a recurrent state of {_interval(a['advised_per_unit'])} per head covers q; "
                f"ceiling use {_interval(a['ceiling_use'], 2)}; {verdict}"
            )
        else:
            body = (
                f"state {a['state_per_unit']:.0f} per unit, advised {_interval(a['advised_per_unit'])} "
                f"({_interval(a['ratio'], 2)} of it; {a['units_active']} units active)"
            )
        lines.append(f"{head} {body}")
    return "\n".join(lines)
