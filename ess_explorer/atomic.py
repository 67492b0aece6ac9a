"""The one atomic file write of the package.

A reader never sees half a file and two writers never collide: the bytes go to a uniquely
named temporary file in the target's folder, are flushed and fsynced, then replace the
target in one rename. The temporary file is removed on any failure, KeyboardInterrupt
included.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Callable

__all__ = ["atomic_write", "atomic_write_with", "atomic_link", "exclusive"]


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


@contextmanager
def _temporary(path: Path):
    """(fd, name) of a new temporary file beside ``path``, removed if the block fails."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        yield fd, tmp
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def atomic_write_with(path, write: Callable, *, mode: str = "wb") -> Path:
    """Write ``path`` atomically by calling ``write(handle)`` on an open temporary file."""
    path = Path(path)
    with _temporary(path) as (fd, tmp):
        os.fchmod(fd, 0o666 & ~_umask())  # mkstemp makes 0600; the file gets the usual permissions
        with os.fdopen(fd, mode) as handle:
            write(handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
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


def atomic_link(source, path) -> Path:
    """Make ``path`` a hard link to the file ``source`` (the same bytes, none written), or a
    copy of it where a link cannot be made (another file system); atomically either way.
    Safe with files that are only ever replaced, never written in place (as every file here)."""
    source, path = Path(source), Path(path)
    with _temporary(path) as (fd, tmp):
        os.close(fd)
        os.unlink(tmp)  # the name only: os.link makes the file
        try:
            os.link(source, tmp)
        except OSError:  # another file system, or links not allowed
            linked = False
        else:
            os.replace(tmp, path)
            linked = True
    if not linked:
        with source.open("rb") as data:
            atomic_write_with(path, lambda handle: shutil.copyfileobj(data, handle))
    return path
