"""Freed memory reused while a layer's ESS is computed, instead of returned to the system.

A layer's spectra go through a few dozen arrays of about 100 MB each (a Mamba-130m layer at
L = 512: the operators a, b, c, the kernel's outputs, the spectra, the ESS temporaries), each
freed before the next is made. glibc's malloc serves every block above M_MMAP_THRESHOLD
(128 KiB to 32 MiB) by a fresh mmap and unmaps it on free, so each such array costs a page
fault per 4 KiB page and the kernel's zeroing of it on first touch: measured on a 2-core CPU,
a fresh 100 MB `torch.exp` took 36 ms against 10 ms into a reused one, and that alone was a
tenth of a whole Mamba model's run. The model's forward pass, which captures the operators,
runs inside the same scope: its own large temporaries are of the same kind.

Inside `reused_memory()` the thresholds are raised, so large blocks come from the heap and
freed ones stay there for the next array of the same size; on leaving the outermost one
`malloc_trim` hands the free pages back to the system. Any mallopt call switches off glibc's
own sliding threshold for good, so the scope leaves the thresholds where that sliding one
settles in a process that frees large arrays (32 MiB, and twice that for trimming), not at
its 128 KiB start, which would map and unmap every later array of the user's above 128 KiB.
Scopes nest and may be entered from several threads; only glibc is tuned (elsewhere this
does nothing).
"""

from __future__ import annotations

import ctypes
import sys
import threading
from contextlib import contextmanager

__all__ = ["reused_memory"]

# mallopt's parameters (glibc's malloc.h) and what the scope sets them to.
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
REUSED = {M_MMAP_THRESHOLD: 1 << 30, M_TRIM_THRESHOLD: (1 << 31) - 1}  # mmap only past 1 GiB; never trim
# after: glibc's sliding threshold at its ceiling (DEFAULT_MMAP_THRESHOLD_MAX on 64-bit)
SETTLED = {M_MMAP_THRESHOLD: 32 << 20, M_TRIM_THRESHOLD: 64 << 20}

_lock = threading.Lock()
_depth = 0


def _glibc():
    """glibc's malloc controls, or None (another C library, whose mallopt numbers may differ,
    or another platform). The process's own symbols: no library search at import."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None)
    except OSError:
        return None
    glibc = all(hasattr(libc, name) for name in ("gnu_get_libc_version", "mallopt", "malloc_trim"))
    return libc if glibc else None


_LIBC = _glibc()


def _set(values: dict) -> None:
    for parameter, value in values.items():
        _LIBC.mallopt(parameter, value)


@contextmanager
def reused_memory():
    """Keep freed large blocks for reuse while inside (module docstring)."""
    global _depth
    if _LIBC is None:
        yield
        return
    with _lock:
        _depth += 1
        if _depth == 1:
            _set(REUSED)
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0:
                _set(SETTLED)
                _LIBC.malloc_trim(0)
