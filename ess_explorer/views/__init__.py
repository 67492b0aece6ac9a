"""Views of an ESSResult: state.py (view options, validated once), data.py and frames.py
(view data), params.py, specs.py and linked.py (the explorer's Vega-Lite views), charts.py
(one import for all of those), theme.py and figures.py (paper figures) and render.py (the
one vl-convert path, no network). See docs/architecture.md."""
