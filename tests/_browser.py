"""Shared by the browser tests: Debian's Chromium and the Playwright package, or a clear
outcome when they are missing: a failure when REQUIRE_BROWSER=1 (make test and CI set it,
so a missing browser can never pass as green), else a skip."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

CHROMIUM = Path("/usr/bin/chromium")
ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def required() -> bool:
    return os.environ.get("REQUIRE_BROWSER", "").strip().lower() in ("1", "true", "yes")


def missing(reason: str):
    """Fail (REQUIRE_BROWSER=1) or skip with ``reason``."""
    if required():
        pytest.fail(f"{reason} (REQUIRE_BROWSER=1: browser tests must run here)", pytrace=False)
    pytest.skip(reason)


def require_browser():
    """(chromium path, playwright.sync_api); fails or skips (see module docstring)."""
    if not CHROMIUM.exists():
        missing(f"{CHROMIUM} is not installed (apt-get install -y chromium)")
    try:
        from playwright import sync_api
    except ImportError:
        missing("the playwright package is not installed (pip install playwright; never `playwright install`)")
    return CHROMIUM, sync_api


def launch(playwright, profile, width: int, height: int):
    """A headless Chromium context (Debian's, never a downloaded one) with its own profile."""
    return playwright.chromium.launch_persistent_context(
        str(profile),
        executable_path=str(CHROMIUM),
        headless=True,
        args=ARGS,
        viewport={"width": width, "height": height},
    )
