# Two entry points for a fresh machine (Python 3.11, registries only, no GPU needed):
#   make run    set up, then analyse the built-in default model and write ess-report.html
#   make test   set up (plus Debian chromium for the browser tests), lint, build the docs with
#               warnings as errors, then run the test suite
PYTHON ?= python3
VENV   ?= .venv
BIN     = $(VENV)/bin
PROMPT ?=

.PHONY: setup run test test-fast lint docs assets bench lab browser clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

# pyproject.toml asks for a tested torch range; installing the CPU build 2.13.0 first keeps
# the resolver from pulling multi-GB CUDA wheels on a machine without a GPU.
setup: $(BIN)/python
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e ".[test,docs]"

run: setup
	HF_HUB_OFFLINE=1 $(BIN)/ess-explorer report --out ess-report.html $(if $(PROMPT),--prompt "$(PROMPT)",) < /dev/null

# Chromium for the browser tests; the Liberation fonts the paper figures are drawn in (the
# print checks read them back from the PDFs).
browser:
	@(test -x /usr/bin/chromium && fc-list 2>/dev/null | grep -qi "liberation serif") || \
		(apt-get update -qq && apt-get install -y -qq chromium fonts-liberation fontconfig)

# The house rules: the import layers (import-linter contract in pyproject.toml), lint and format.
lint: setup
	$(BIN)/lint-imports
	$(BIN)/ruff check ess_explorer tests benchmarks scripts
	$(BIN)/ruff format --check ess_explorer tests benchmarks scripts

# The documentation site (mkdocs.yml) into site/; --strict: a warning (a broken link, a renamed
# function in the API reference, a docstring the handler cannot read) fails the build.
docs: setup
	HF_HUB_OFFLINE=1 NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --site-dir site

# The pictures in assets/ (README and docs), from the shipped default model, offline.
assets: setup
	HF_HUB_OFFLINE=1 $(BIN)/python scripts/make_assets.py

test: setup browser lint docs
	HF_HUB_OFFLINE=1 REQUIRE_BROWSER=1 REQUIRE_RAY=1 $(BIN)/python -m pytest -q -n 2 --dist loadfile

test-fast: setup
	HF_HUB_OFFLINE=1 $(BIN)/python -m pytest -q -m "not slow and not browser"

# The whole benchmark in one run (about 30-40 min on 2 CPU cores): the engine's paths, a
# Mamba-130m-shaped layer at L = 1024, whole models, the explorer's first chart, then the views.
bench: setup
	HF_HUB_OFFLINE=1 $(BIN)/python benchmarks/bench_engine.py --full --models
	HF_HUB_OFFLINE=1 $(BIN)/python benchmarks/bench_explorer.py --first-only --models gpt2 mamba lfm2 mamba2 --lengths 128 512
	$(BIN)/python benchmarks/bench_ql.py
	$(BIN)/python benchmarks/bench_core.py
	$(BIN)/python benchmarks/bench_analyze.py
	$(BIN)/python benchmarks/bench_views.py

lab: setup
	$(BIN)/jupyter lab notebooks/

clean:
	rm -rf $(VENV) .pytest_cache test-artifacts site
