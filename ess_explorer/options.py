"""The option lists of the package, each defined once: every entry point imports them.

The command line (app/cli.py, app/arguments.py), the ``%ess`` magic, the explorer's controls,
the views and the core take their choices from here, and `check_choice` refuses anything
else in one wording. A new choice is added here and nowhere else; tests/test_options.py checks
that the command line, the magic and the controls offer exactly these lists.

VARIANTS      the ESS variants: tolerance-ESS, entropy-ESS, causal ESS (core/ess.py, core/causal.py)
SCOPES        which sigma_1 a relative tolerance refers to: each cut's, the unit's largest, the layer's
GATES         the gate policy: per-token gates inside T or outside it (core/gates.py)
PRECISIONS    the accuracy contracts (core/precision.py)
AGGREGATES    how a layer's units are reduced to one curve (TSS is reduced the same way)
METRICS       what the overview heatmap shows: ESS / attainable ceiling, or ESS
FIGURE_KINDS  the paper figures of views/figures.py (`figure(result, kind)`)

The package's own environment switches (ESS_EXPLORER_DEBUG, ESS_EXPLORER_CUDA_KERNELS) are read
by `environment_switch`, so that every one of them takes the same words.
"""

from __future__ import annotations

import os

__all__ = [
    "VARIANTS",
    "SCOPES",
    "GATES",
    "PRECISIONS",
    "AGGREGATES",
    "METRICS",
    "FIGURE_KINDS",
    "DEFAULT_SCOPE",
    "DEFAULT_GATES",
    "DEFAULT_PRECISION",
    "check_choice",
    "environment_switch",
]

VARIANTS = ("tolerance", "entropy", "causal")
SCOPES = ("cut", "unit", "layer")
GATES = ("inside", "outside")
PRECISIONS = ("ess", "exact")
AGGREGATES = ("mean", "max", "sum")
METRICS = ("utilisation", "ess")
# The defaults among them (what `analyze` and every entry point use when not told).
DEFAULT_SCOPE = "cut"  # each cut on its own scale
DEFAULT_GATES = "inside"
DEFAULT_PRECISION = "ess"
FIGURE_KINDS = ("ess_time", "spectrum", "operator", "overview", "utilisation", "diagnostics", "compare")


def check_choice(name: str, value, choices: tuple[str, ...]) -> str:
    """``value`` when it is one of ``choices``; else a ValueError naming the option and every
    allowed value (the one wording of a refused choice)."""
    if not isinstance(value, str) or value not in choices:
        raise ValueError(f"{name} must be one of {', '.join(map(repr, choices))}; got {value!r}")
    return value


SWITCHED_OFF = ("0", "false", "no", "off")  # what turns an environment switch off (any case)


def environment_switch(name: str, default: bool) -> bool:
    """Whether the environment variable ``name`` is on: ``default`` where it is unset or
    empty, off where it is one of SWITCHED_OFF, else on."""
    value = os.environ.get(name, "").strip().lower()
    return default if not value else value not in SWITCHED_OFF
