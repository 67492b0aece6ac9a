"""The README and the documentation site say what the code does.

The site itself is built by `make test` (`make docs`: `mkdocs build --strict`, so a broken
link or a renamed function in the API reference fails it); these tests keep the README short
and its picture and quick start in place, and check the statements in docs/ that a build
cannot: names, signatures, the import layers and the command line."""

from __future__ import annotations

import importlib
import inspect
import re
import sys
import tomllib
from pathlib import Path

import pytest

import ess_explorer

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
README = ROOT / "README.md"
MAX_README_BYTES = 10 * 1024
MAX_PICTURE_BYTES = 300_000
sys.path.insert(0, str(ROOT / "scripts"))


def _make_target(name: str) -> tuple[list[str], list[str]]:
    """(prerequisites, recipe lines) of one Makefile target."""
    text = (ROOT / "Makefile").read_text()
    match = re.search(rf"^{name}:(.*)\n((?:\t.*\n)*)", text, re.M)
    assert match, f"the Makefile has no {name!r} target"
    return match[1].split(), [line.strip() for line in match[2].splitlines()]


def test_readme_is_short():
    size = len(README.read_bytes())
    assert size <= MAX_README_BYTES, f"README.md is {size} bytes; move detail into docs/ (at most {MAX_README_BYTES})"


def test_readme_shows_pictures_from_assets():
    pictures = re.findall(r"!\[[^\]]+\]\((assets/[^)]+\.png)\)", README.read_text())
    assert "assets/explorer.png" in pictures, pictures
    for picture in pictures:
        data = (ROOT / picture).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n", picture
        assert len(data) < MAX_PICTURE_BYTES, f"{picture} is {len(data)} bytes"


def test_readme_quick_start_is_the_two_make_commands_ci_runs():
    text = README.read_text()
    quick = text[text.index("## Quick start") :]
    block = quick[quick.index("```bash") : quick.index("```", quick.index("```bash") + 3)]
    commands = [line.split("#")[0].strip() for line in block.splitlines()[1:] if line.strip()]
    assert commands == ["make run", "make test"], commands
    ci = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()]
    assert "make test" in ci, "CI must run the README's test command"
    for target in ("run", "test", "docs", "assets"):
        _make_target(target)


def test_make_test_builds_the_docs_with_warnings_as_errors():
    prerequisites, _ = _make_target("test")
    assert "docs" in prerequisites, prerequisites
    _, recipe = _make_target("docs")
    assert any("mkdocs build" in line and "--strict" in line for line in recipe), recipe
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert any(r.startswith("mkdocs>=") for r in extras["docs"]), extras["docs"]
    _, setup = _make_target("setup")
    assert any("docs" in line and "pip install" in line for line in setup), setup


def test_every_public_name_is_in_the_api_reference():
    page = (DOCS / "api" / "index.md").read_text()
    missing = [name for name in ess_explorer.__all__ if f"`{name}`" not in page]
    assert not missing, f"docs/api/index.md does not list {missing}"


def test_every_dotted_name_in_the_docs_exists():
    """`ess_explorer.x.y` in any page names a module or an attribute the package has."""
    wrong = []
    for page in sorted(DOCS.rglob("*.md")):
        for name in sorted(set(re.findall(r"\bess_explorer(?:\.[A-Za-z_]\w*)+", page.read_text()))):
            parts = name.split(".")
            for cut in range(len(parts), 0, -1):
                try:
                    obj = importlib.import_module(".".join(parts[:cut]))
                except ImportError:
                    continue
                try:
                    for attribute in parts[cut:]:
                        obj = getattr(obj, attribute)
                except AttributeError:
                    wrong.append(f"{page.relative_to(ROOT)}: {name}")
                break
    assert not wrong, wrong


def test_the_analyze_signature_in_the_docs_is_the_code():
    """Written signatures list the parameters in the code's order, with `*` where the
    keyword-only ones start; written calls pass only keywords the code has."""
    from ess_explorer.analysis import analyze

    parameters = inspect.signature(analyze).parameters
    names = list(parameters)
    seen = 0
    for page in sorted(DOCS.rglob("*.md")) + [README]:
        text = " ".join(page.read_text().split())
        for call in re.findall(r"analyze\((model, [^)]*)\)", text):
            items = [item.strip() for item in call.split(",") if item.strip() != "..."]
            if "input_ids=None" in items:  # a signature
                seen += 1
                written = [item.split("=")[0] for item in items if item != "*"]
                assert written == names[: len(written)], f"{page.name}: analyze({call}) against {names}"
                star = items.index("*")
                assert parameters[names[star]].kind is inspect.Parameter.KEYWORD_ONLY, f"{page.name}: {call}"
                assert parameters[names[star - 1]].kind is not inspect.Parameter.KEYWORD_ONLY, f"{page.name}: {call}"
            else:
                unknown = [i.split("=")[0] for i in items if "=" in i and i.split("=")[0] not in names]
                assert not unknown, f"{page.name}: analyze({call}) passes {unknown}"
    assert seen >= 2, "docs/usage.md and docs/architecture.md write the signature of analyze"


def test_architecture_names_every_layer_of_the_import_contract():
    contracts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    layers = next(c for c in contracts if c["type"] == "layers")["layers"]
    text = (DOCS / "architecture.md").read_text()
    diagram = text[text.index("```") : text.index("```", text.index("```") + 3)]
    lines = [line for line in diagram.splitlines() if line.strip() and line.strip() != "|"][1:]
    assert len(lines) == len(layers), (lines, layers)
    for line, layer in zip(lines, layers):
        for module in (m.strip() for m in layer.split("|")):
            assert re.search(rf"(^|\s){re.escape(module)}(\.py|/)", line), f"layer {layer!r}: {module} not in {line!r}"


def test_cli_page_is_generated_from_the_parser():
    from docs_hooks import CLI_MARKER, cli_help

    from ess_explorer.app.cli import build_parser

    assert CLI_MARKER in (DOCS / "cli.md").read_text()
    text = cli_help()
    commands = next(a for a in build_parser()._actions if a.__class__.__name__ == "_SubParsersAction").choices
    for name, parser in commands.items():
        assert f"### ess-explorer {name} --help" in text
        for action in parser._actions:
            for flag in action.option_strings:
                assert flag in text, f"{name} {flag}"


@pytest.mark.parametrize(
    "written, numpy",
    [
        (
            "Summary.\n\nParameters\n----------\nop : an array\nk, n : two numbers\n    more on them\n\n"
            "Returns\n-------\ntensor (P, K), descending\n\nRaises ValueError for a bad op.",
            "Summary.\n\nParameters\n----------\nop\n    an array\nk, n\n    two numbers\n    more on them\n\n"
            "Returns\n-------\ntensor\n    (P, K), descending\n\nRaises\n------\nValueError\n    for a bad op.",
        ),
        ("No sections: name : text stays.", "No sections: name : text stays."),
    ],
)
def test_the_api_reference_reads_the_numpyish_docstrings(written, numpy):
    from griffe_docstrings import numpyish_to_numpy

    assert numpyish_to_numpy(written) == numpy


def test_shapes_keep_their_asterisk_outside_code():
    from griffe_docstrings import escape_shapes

    assert escape_shapes("a (*batch, L) and ``(*batch, L)``") == "a (\\*batch, L) and ``(*batch, L)``"


def test_the_families_page_shows_the_model_type_registry():
    """docs/families.md's support table is the registry rendered (no hand-kept copy), and its
    per-family table has a row for every family a supported model type can have."""
    from docs_hooks import MODEL_TYPES_MARKER, on_page_markdown

    from ess_explorer.capture import REGISTRY

    text = (DOCS / "families.md").read_text()
    assert MODEL_TYPES_MARKER in text
    rendered = on_page_markdown(text, None, None, None)
    assert MODEL_TYPES_MARKER not in rendered
    for name, entry in REGISTRY.items():
        assert f"| {name} | `{entry.layers}` | {', '.join(entry.families)} |" in rendered, name
    described = {
        family.strip()
        for line in text.splitlines()
        if line.startswith("| ") and not line.startswith("| family")
        for family in line.split("|")[1].split(",")
    }
    needed = {family for entry in REGISTRY.values() for family in entry.families}
    assert needed <= described, needed - described
