"""The one atomic file write of the package.

A reader never sees half a file and two writers never collide: the bytes go to a uniquely
named temporary file in the target's folder, are flushed and fsynced, then replace the
target in one rename. The temporary file is removed on any failure, KeyboardInterrupt
included.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path
from typing import Callable

__all__ = ["atomic_write", "atomic_write_with", "exclusive"]


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def atomic_write_with(path, write: Callable, *, mode: str = "wb") -> Path:
    """Write ``path`` atomically by calling ``write(handle)`` on an open temporary file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, 0o666 & ~_umask())  # mkstemp makes 0600; the file gets the usual permissions
        with os.fdopen(fd, mode) as handle:
            write(handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    return path


def atomic_write(path, data: bytes | str) -> Path:
    """Write ``data`` (bytes, or text as UTF-8) to ``path`` atomically."""
    payload = data.encode("utf-8") if isinstance(data, str) else bytes(data)
    return atomic_write_with(path, lambda handle: handle.write(payload))


@contextlib.contextmanager
def exclusive(folder):
    """Hold an exclusive lock on ``folder`` itself for the block: writers of the files in it
    take turns instead of interleaving (POSIX ``flock`` on the folder, so no lock file is
    left behind; the lock goes with the process, so a killed writer never leaves it held)."""
    import fcntl

    fd = os.open(folder, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing releases the lock
