"""Shared test settings: everything offline, results and the explorer's JavaScript bundle
cached in a throwaway folder (never the user's ~/.cache)."""

import os
import tempfile

# Set before transformers is imported anywhere: a hub id then fails in ~1 s instead of
# retrying DNS for ~23 s, and no test can reach a network by accident.
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("ESS_EXPLORER_CACHE", tempfile.mkdtemp(prefix="ess-explorer-test-cache-"))

import pytest  # noqa: E402  (after the environment above)


@pytest.fixture
def one_thread():
    """Tiny models train fastest on one thread (and do not fight other jobs for the cores)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
