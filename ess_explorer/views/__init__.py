"""Views of an ESSResult: charts.py (view data and the linked Vega-Lite specs), figures.py
(the paper theme and figure kinds) and render.py (the one vl-convert path, no network)."""
