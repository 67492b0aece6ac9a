"""Every option list lives in ess_explorer/options.py; the command line, the %ess magic, the
explorer's controls, the views and the core offer exactly it (no entry point retypes one)."""

from __future__ import annotations

import argparse

import pytest

from ess_explorer import options
from ess_explorer.app import controls, magic
from ess_explorer.app.cli import build_parser


def _subcommands() -> dict[str, argparse.ArgumentParser]:
    action = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return action.choices


def _choices(parser: argparse.ArgumentParser, flag: str) -> tuple:
    action = next(a for a in parser._actions if flag in a.option_strings)
    return tuple(action.choices)


@pytest.mark.parametrize(
    "command, flag, expected",
    [
        ("analyze", "--scope", options.SCOPES),
        ("analyze", "--gates", options.GATES),
        ("analyze", "--precision", options.PRECISIONS),
        ("report", "--scope", options.SCOPES),
        ("report", "--gates", options.GATES),
        ("report", "--precision", options.PRECISIONS),
        ("sweep", "--scope", options.SCOPES),
        ("sweep", "--gates", options.GATES),
        ("sweep", "--precision", options.PRECISIONS),
        ("figure", "--variant", options.VARIANTS),
        ("advise", "--variant", options.VARIANTS),
    ],
)
def test_the_command_line_offers_exactly_the_one_list(command, flag, expected):
    assert _choices(_subcommands()[command], flag) == expected


def test_figure_kinds_are_the_figures_module_kinds_and_the_cli_refuses_others(tmp_path, capsys):
    from ess_explorer.app.cli import main
    from ess_explorer.views.figures import KINDS

    assert tuple(KINDS) == options.FIGURE_KINDS
    assert main(["figure", str(tmp_path), "--kind", "heatmap", "--out", str(tmp_path / "f.pdf")]) == 2
    assert ", ".join(options.FIGURE_KINDS) in capsys.readouterr().err


def test_the_magic_offers_exactly_the_variants_and_aggregates():
    assert _choices(magic._parser(), "--variant") == options.VARIANTS
    for variant in options.VARIANTS:  # causal included: %ess opens every view the widget offers
        assert magic.parse_ess_args(f"--variant {variant}")[2]["variant"] == variant
    for unit in options.AGGREGATES:
        assert magic.parse_ess_args(f"--unit {unit}")[2]["unit"] == unit
    with pytest.raises(ValueError, match="unit must be mean, max, sum"):
        magic.parse_ess_args("--unit median")


@pytest.mark.parametrize("text", ["-1", "inf", "nan"])
def test_the_magic_and_the_cli_read_a_tolerance_by_one_rule(text, capsys):
    """One parser (arguments.parse_tolerance): what the CLI refuses, the magic refuses in the
    same words; what it takes, the magic takes."""
    from ess_explorer.app.cli import main

    rule = "the tolerance must be a finite number >= 0"
    assert main(["analyze", f"--tol={text}", "--prompt", "a b"]) == 2
    assert rule in capsys.readouterr().err
    with pytest.raises(ValueError, match=rule):
        magic.parse_ess_args(f"--tol={text}")
    assert magic.parse_ess_args("--tol 1e-2")[2]["tol"] == 1e-2


def test_the_controls_offer_exactly_the_one_lists():
    made = controls.make_controls([("hub id or folder", controls.CUSTOM)])
    values = {name: tuple(value for _, value in made[name].options) for name in made if hasattr(made[name], "options")}
    assert values["variant_w"] == options.VARIANTS
    assert values["scope_w"] == options.SCOPES
    assert values["gates_w"] == options.GATES
    assert values["metric_w"] == options.METRICS


def test_the_widget_traits_accept_exactly_the_one_lists():
    from ess_explorer.app.widget import ESSExplorer

    traits = ESSExplorer.class_traits()
    assert tuple(traits["variant"].values) == options.VARIANTS
    assert tuple(traits["scope"].values) == options.SCOPES
    assert tuple(traits["gates"].values) == options.GATES
    assert tuple(traits["overview_metric"].values) == options.METRICS


def test_the_core_checks_accept_exactly_the_one_lists():
    from ess_explorer.core.ess import check_scope, check_variant
    from ess_explorer.core.gates import check_gates
    from ess_explorer.core.precision import check_precision

    for check, choices in (
        (check_variant, options.VARIANTS),
        (check_scope, options.SCOPES),
        (check_gates, options.GATES),
        (check_precision, options.PRECISIONS),
    ):
        assert [check(value) for value in choices] == list(choices)
        with pytest.raises(ValueError, match="must be one of"):
            check("none of them")


def test_check_choice_names_the_option_and_every_allowed_value():
    assert options.check_choice("metric", "ess", options.METRICS) == "ess"
    with pytest.raises(ValueError, match=r"metric must be one of 'utilisation', 'ess'; got 'rank'"):
        options.check_choice("metric", "rank", options.METRICS)
    with pytest.raises(ValueError, match="got 1"):
        options.check_choice("metric", 1, options.METRICS)


@pytest.mark.parametrize(
    "value, default, on",
    [
        (None, False, False),  # unset: the default
        (None, True, True),
        ("", True, True),  # empty: the default too
        ("1", False, True),
        (" Yes ", False, True),
        ("0", True, False),
        ("off", True, False),  # ESS_EXPLORER_DEBUG=off used to turn the tracebacks on
        ("FALSE", True, False),
        ("no", True, False),
    ],
)
def test_every_environment_switch_takes_the_same_words(value, default, on, monkeypatch):
    """`options.environment_switch`, which ESS_EXPLORER_DEBUG (the command line and the magic)
    and ESS_EXPLORER_CUDA_KERNELS (core/eigen.py) are read by."""
    if value is None:
        monkeypatch.delenv("ESS_EXPLORER_TEST_SWITCH", raising=False)
    else:
        monkeypatch.setenv("ESS_EXPLORER_TEST_SWITCH", value)
    assert options.environment_switch("ESS_EXPLORER_TEST_SWITCH", default=default) is on
