"""Reads with a bound: prompts, JSON headers and .npz archives from users' files.

A file or stream may be endless (/dev/zero, a pipe), a zip bomb, an array header that
declares terabytes, or JSON nested a million deep. Every read here stops at a stated
limit and says so in one ValueError naming the limit, before the memory is spent. Nothing
is ever unpickled: object arrays are refused by their header.
"""

from __future__ import annotations

import json
import re
import zipfile
from pathlib import Path

import numpy as np

__all__ = [
    "MAX_PROMPT_BYTES",
    "MAX_PROMPTS_FILE_BYTES",
    "MAX_RESULT_BYTES",
    "MAX_HEADER_BYTES",
    "MAX_JSON_DEPTH",
    "read_text",
    "parse_json",
    "read_json",
    "open_npz",
]

# About 250 000 tokens of text: far beyond what an analysis can compute in hours.
MAX_PROMPT_BYTES = 1 << 20
# A sweep's prompt file: a few hundred thousand prompts.
MAX_PROMPTS_FILE_BYTES = 256 << 20
# All arrays of one result file, uncompressed (the dense spectra budget is 2 GiB too).
MAX_RESULT_BYTES = 2 << 30
MAX_HEADER_BYTES = 64 << 20
MAX_JSON_DEPTH = 64


def _size(limit: int) -> str:
    return f"{limit / (1 << 30):g} GiB" if limit >= 1 << 30 else f"{limit / (1 << 20):g} MiB"


def read_text(handle, what: str, limit: int = MAX_PROMPT_BYTES) -> str:
    """At most ``limit`` bytes (characters for a text ``handle``) of UTF-8 text; a longer
    stream (an endless device, a huge file) is refused after reading limit + 1."""
    data = handle.read(limit + 1)
    if len(data) > limit:
        raise ValueError(f"{what} is longer than {_size(limit)}, the most that is read from it; give a shorter text")
    try:
        text = data if isinstance(data, str) else data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise ValueError(
            f"{what} is not valid UTF-8 text (byte {data[error.start]:#04x} at offset {error.start}); save it as UTF-8"
        ) from None
    return text.replace("\r\n", "\n").replace("\r", "\n")  # newlines as Python's text mode reads them


_STRINGS = re.compile(rb'"(?:[^"\\]|\\.)*"')


def read_json(path, what: str, limit: int = MAX_HEADER_BYTES):
    """The JSON value of the file ``path``, read and parsed within ``limit`` bytes (and
    MAX_JSON_DEPTH levels); OSError when it cannot be opened."""
    with open(path, "rb") as handle:
        return parse_json(handle.read(limit + 1), what, limit)


def parse_json(data: bytes, what: str, limit: int = MAX_HEADER_BYTES, depth: int = MAX_JSON_DEPTH):
    """The JSON value in ``data``, refused above ``limit`` bytes or ``depth`` levels of
    nesting (checked on the bytes, before the parser recurses)."""
    if len(data) > limit:
        raise ValueError(f"{what} has {len(data)} bytes, above the limit of {_size(limit)}")
    skeleton = np.frombuffer(_STRINGS.sub(b'""', data), dtype=np.uint8)
    steps = np.isin(skeleton, np.frombuffer(b"[{", np.uint8)).astype(np.int64)
    steps -= np.isin(skeleton, np.frombuffer(b"]}", np.uint8))
    if steps.size and int(np.cumsum(steps).max()) > depth:
        raise ValueError(f"{what} is nested deeper than {depth} levels; it is not a file this package wrote")
    try:
        return json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ValueError(f"{what} is not valid JSON ({error})") from None


def open_npz(path, limit: int | None = None):
    """``numpy.load(path, allow_pickle=False)`` of an .npz archive whose every member was
    checked first: a zip archive (else "not an .npz archive", never numpy's advice to
    unpickle), at most ``limit`` (default MAX_RESULT_BYTES) bytes of arrays in all, each member a plain .npy whose
    header (shape x item size) fits the size the archive records for it."""
    path, limit = Path(path), MAX_RESULT_BYTES if limit is None else limit
    if not path.is_file():
        raise ValueError("it is not a regular file")
    if not zipfile.is_zipfile(path):
        raise ValueError("it is not an .npz archive (no zip structure): damaged, or another kind of file")
    with zipfile.ZipFile(path) as archive:
        members = archive.infolist()
        total = sum(info.file_size for info in members)
        if total > limit:
            raise ValueError(
                f"it holds {total / (1 << 30):.3g} GiB of arrays, above the limit of {_size(limit)} for a result file"
            )
        for info in members:
            with archive.open(info) as member:
                _check_member(member, info)
    return np.load(path, allow_pickle=False)


def _check_member(member, info: zipfile.ZipInfo) -> None:
    fmt = np.lib.format
    name = info.filename
    try:
        version = fmt.read_magic(member)
        readers = {(1, 0): fmt.read_array_header_1_0, (2, 0): fmt.read_array_header_2_0}
        if version not in readers:
            raise ValueError(f"npy format version {version} is not one this package writes")
        shape, _, dtype = readers[version](member)
    except (ValueError, EOFError, OSError) as error:
        raise ValueError(f"member {name} is not a numpy array ({error})") from None
    if dtype.hasobject:
        raise ValueError(f"member {name} holds Python objects; result files hold numbers only (never unpickled)")
    needed = int(np.prod(shape, dtype=object)) * dtype.itemsize
    if needed > info.file_size:
        raise ValueError(
            f"member {name} declares shape {tuple(shape)} ({needed} bytes) but the archive stores {info.file_size}"
        )
