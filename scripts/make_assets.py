"""Regenerate the pictures in assets/ from the shipped default model (offline).

    python scripts/make_assets.py            # what `make assets` runs

assets/explorer.png  the explorer's five linked views (the chart the widget and the HTML
                     report show), rendered by vl-convert from the explorer's own spec
assets/figure.png    a paper figure (`ess_explorer.figure(result, "ess_time")`)

Both come from `zoo:mamba2_n16_sep` on its example prompt, so they change only when the
model, the prompt or the views change.
"""

from __future__ import annotations

import argparse
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MAX_BYTES = 300_000  # pictures stay small enough for a README


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "assets", help="folder to write (default: assets/)")
    args = parser.parse_args(argv)

    import ess_explorer
    from ess_explorer.app.static import example_prompt
    from ess_explorer.sources import DEFAULT_MODEL
    from ess_explorer.views import charts
    from ess_explorer.views.render import to_png

    source = f"zoo:{DEFAULT_MODEL}"
    model, tokenizer = ess_explorer.load_model(source)
    result = ess_explorer.analyze(model, prompt=example_prompt(source), tokenizer=tokenizer, progress=False)
    result.meta["source"] = source

    explorer = charts.linked_views(result, layer=min(result.layers))
    figure = ess_explorer.figure(result, "ess_time", width="double")
    pictures = {
        "explorer.png": to_png(explorer, scale=0.75),
        "figure.png": to_png(figure, scale=1.0, ppi=150),
    }
    args.out.mkdir(parents=True, exist_ok=True)
    for name, png in pictures.items():
        if len(png) > MAX_BYTES:
            raise SystemExit(f"{name} is {len(png)} bytes, above {MAX_BYTES}: render it smaller")
        (args.out / name).write_bytes(png)
        print(f"{args.out / name}: {len(png) // 1024} KB")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
