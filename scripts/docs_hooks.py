"""MkDocs hooks (mkdocs.yml: hooks):

- the pictures in the top-level assets/ folder are served at assets/ on the site, so the
  README and the docs show the same files; the zoo's pictures (ess_explorer/zoo/assets/*.png,
  next to the zoo README that shows them) at assets/zoo/;
- the `<!-- cli-help -->` marker in cli.md becomes the help of every `ess-explorer` command,
  taken from the parser itself, so the page cannot fall behind the code;
- the `<!-- model-types -->` marker in families.md becomes the table of supported model types,
  rendered from the registry (ess_explorer.capture.support_table).
"""

from __future__ import annotations

import os
from pathlib import Path

from mkdocs.structure.files import File

ROOT = Path(__file__).resolve().parents[1]
ASSETS = ROOT / "assets"
ZOO_ASSETS = ROOT / "ess_explorer" / "zoo" / "assets"
CLI_MARKER = "<!-- cli-help -->"
MODEL_TYPES_MARKER = "<!-- model-types -->"


def on_files(files, config):
    for picture in sorted(ASSETS.glob("*.png")):
        files.append(File.generated(config, f"assets/{picture.name}", abs_src_path=str(picture)))
    for picture in sorted(ZOO_ASSETS.glob("*.png")):
        files.append(File.generated(config, f"assets/zoo/{picture.name}", abs_src_path=str(picture)))
    return files


def cli_help() -> str:
    """Markdown with the --help text of `ess-explorer` and of each of its commands."""
    os.environ["COLUMNS"] = "100"  # argparse wraps to the terminal: fix it for the page
    from ess_explorer.app.cli import build_parser

    parser = build_parser()
    parts = ["### ess-explorer --help", "", "```text", parser.format_help().rstrip(), "```"]
    subcommands = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction")
    for name, sub in subcommands.choices.items():
        parts += ["", f"### ess-explorer {name} --help", "", "```text", sub.format_help().rstrip(), "```"]
    return "\n".join(parts) + "\n"


def on_page_markdown(markdown, page, config, files):
    if CLI_MARKER in markdown:
        markdown = markdown.replace(CLI_MARKER, cli_help())
    if MODEL_TYPES_MARKER in markdown:
        from ess_explorer.capture import support_table

        markdown = markdown.replace(MODEL_TYPES_MARKER, support_table())
    return markdown
