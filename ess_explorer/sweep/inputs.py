"""What a sweep runs over: model sources (expanded into runs) and prompts (normalised).

Models: each entry is a hub id, a local model folder, "zoo:NAME", or the output folder of one
training run (a folder without config.json whose ``checkpoint-STEP`` subfolders are model
folders): it becomes one run per checkpoint, ordered by step, all named by the folder. A
folder named ``checkpoint-STEP`` itself is a run at that step.

Prompts: a list of strings or of token-id lists, a text file (one prompt per line; blank
lines skipped), a JSONL file (one object per line, the prompt in ``text_field``, or token ids
in "input_ids"), or a Hugging Face ``datasets.Dataset`` (any object with ``column_names`` and
column access, so the datasets package is optional).
"""

from __future__ import annotations

import numbers
import os
import re
from dataclasses import dataclass
from pathlib import Path

from ..bounded import MAX_PROMPTS_FILE_BYTES, parse_json, read_text
from ..sources import parse_source

__all__ = ["Run", "expand_models", "load_prompts", "CHECKPOINT_PATTERN"]

CHECKPOINT_PATTERN = re.compile(r"^checkpoint-(\d+)$")  # transformers.Trainer's folder names


@dataclass(frozen=True)
class Run:
    """One model to analyse: ``model`` names it in the table, ``checkpoint_step`` is its
    training step (None when unknown), ``source`` is what load_model is given."""

    model: str
    checkpoint_step: int | None
    source: str

    def to_dict(self) -> dict:
        return {"model": self.model, "checkpoint_step": self.checkpoint_step, "source": self.source}


def _checkpoints(folder: Path) -> list[tuple[int, Path]]:
    found = []
    for child in folder.iterdir():
        match = CHECKPOINT_PATTERN.match(child.name)
        if match and (child / "config.json").is_file():
            found.append((int(match.group(1)), child))
    return sorted(found)


def expand_models(models) -> list[Run]:
    """The runs of ``models`` (one source or a list of them), in the order given, the
    checkpoints of a training run by step. ValueError for an empty list, a bad entry, or two
    runs with the same (model, step)."""
    if isinstance(models, (str, os.PathLike)):
        models = [models]
    try:
        entries = list(models)
    except TypeError:
        raise ValueError(f"models must be a source or a list of sources, got {type(models).__name__}") from None
    if not entries:
        raise ValueError("models is empty: give at least one hub id, folder or zoo:NAME")
    runs: list[Run] = []
    for entry in entries:
        kind, value = parse_source(entry)  # ValueError for a non-string or blank entry
        label = str(entry).strip()
        if kind != "folder":
            runs.append(Run(label, None, label))
            continue
        folder = Path(value).expanduser()
        match = CHECKPOINT_PATTERN.match(folder.name)
        if (folder / "config.json").is_file():
            runs.append(Run(label, int(match.group(1)) if match else None, str(folder)))
            continue
        checkpoints = _checkpoints(folder) if folder.is_dir() else []
        if not checkpoints:
            raise ValueError(
                f"{folder} is neither a model folder (config.json) nor a training run (checkpoint-STEP subfolders "
                "with config.json); pass a hub id, a model folder, zoo:NAME or a training output folder"
            )
        runs.extend(Run(label, step, str(path)) for step, path in checkpoints)
    seen = set()
    for run in runs:
        key = (run.model, run.checkpoint_step)
        if key in seen:
            raise ValueError(f"model {run.model!r} (step {run.checkpoint_step}) is listed twice")
        seen.add(key)
    return runs


def _check_prompt(index: int, prompt):
    if isinstance(prompt, str):
        if not prompt.strip():
            raise ValueError(f"prompt {index} is empty")
        return prompt
    if hasattr(prompt, "tolist"):  # a tensor or an array of ids
        prompt = prompt.tolist()
    if not isinstance(prompt, (list, tuple)) or not all(
        isinstance(i, numbers.Integral) and not isinstance(i, bool) for i in prompt
    ):
        raise ValueError(f"prompt {index} must be a string or a list of integer token ids, got {prompt!r:.80}")
    ids = [int(i) for i in prompt]
    if len(ids) < 2:
        raise ValueError(f"prompt {index} has {len(ids)} token(s); ESS needs at least 2")
    return ids


def _read_jsonl(path: Path, lines: list[str], text_field: str) -> list:
    prompts = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        record = parse_json(line.encode("utf-8"), f"{path}:{number}")  # depth-bounded: no RecursionError
        if isinstance(record, dict) and text_field in record:
            prompts.append(record[text_field])
        elif isinstance(record, dict) and "input_ids" in record:
            prompts.append(record["input_ids"])
        elif isinstance(record, str):
            prompts.append(record)
        else:
            raise ValueError(f"{path}:{number} has no {text_field!r} field (nor input_ids); pass text_field=")
    return prompts


def _read_file(path: Path, text_field: str) -> list:
    if not path.is_file():
        raise ValueError(f"no prompt file {path}; give a text file (one prompt per line), a .jsonl file or a list")
    try:
        with open(path, "rb") as handle:
            lines = read_text(handle, f"the prompt file {path}", limit=MAX_PROMPTS_FILE_BYTES).splitlines()
    except OSError as error:
        raise ValueError(f"cannot read the prompt file {path}: {error}") from None
    if path.suffix.lower() in (".jsonl", ".ndjson"):
        return _read_jsonl(path, lines, text_field)
    return [line for line in lines if line.strip()]


def load_prompts(prompts, *, text_field: str = "text") -> list:
    """Prompts as a list of strings and token-id lists (see the module docstring); the
    prompt_id of the table is the index into this list. ValueError when none is usable."""
    if isinstance(prompts, (str, os.PathLike)):
        items = _read_file(Path(prompts).expanduser(), text_field)
    elif hasattr(prompts, "column_names"):  # a datasets.Dataset, duck-typed
        columns = list(prompts.column_names)
        column = text_field if text_field in columns else "input_ids" if "input_ids" in columns else None
        if column is None:
            raise ValueError(f"the dataset has no {text_field!r} column (columns: {columns}); pass text_field=")
        items = list(prompts[column])
    else:
        try:
            items = list(prompts)
        except TypeError:
            raise ValueError(
                f"prompts must be a list, a file path or a dataset, got {type(prompts).__name__}"
            ) from None
    if not items:
        raise ValueError("no prompts: give at least one")
    return [_check_prompt(i, p) for i, p in enumerate(items)]
