"""Shared test settings: everything offline, results cached in a throwaway folder."""

import os

# Set before transformers is imported anywhere: a hub id then fails in ~1 s instead of
# retrying DNS for ~23 s, and no test can reach a network by accident.
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
