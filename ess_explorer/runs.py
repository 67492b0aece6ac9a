"""One analysis run, described once and computed through the cache once.

Every entry point that analyses a model on a prompt (the ``ess-explorer`` command line, the
explorer's session, the sweep) goes through here:

    settings = RunSettings(tol=1e-3, gates="inside")           # what changes the numbers
    request = RunRequest("zoo:mamba2_n16", prompt="ba 07 ...", settings=settings)
    result, hit, store = run_cached(request, cache=ResultCache())
    store()                                                     # a computed result into the cache

- `RunSettings`: the analysis options that change the numbers (layers, tolerance and its
  scope, gates, precision, stride, causal ESS, device), checked when made; `RunRequest`:
  them with the model source, the prompt (or chat) and the hub revision asked for.
- `AnalysisRun`: the frozen description of one run: the model's identity (file hashes, or a
  hub id and its commit), the token ids, the settings, the weights' dtype and the package
  version. `AnalysisRun.cache_key` is its cache key (io.CacheKey: the sha256 of a canonical
  JSON of all of it, carrying that JSON so an entry is checked against it before it is
  served).
- `open_run`: the lookup and the load. The identity and the tokenizer are read from the
  files without the weights (sources.identity_without_weights), so a cached run never loads
  the model; a hub id whose commit cannot be told before loading is looked up once loaded.
- `run_cached`: `open_run`, then `analyze` on a miss; returns the result, whether the cache
  answered, and ``store()``, which writes a computed result to the cache (called by the
  caller once its own output is written: a cache that cannot be written never costs it).

The model-dependent steps (`RunSteps`: load, identities, analyse) are parameters, so a caller
can keep a model loaded or a test can stand in for them.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Callable

from ._version import __version__
from .core.ess import DEFAULT_RELATIVE, DEFAULT_TOL, check_scope, check_tolerance
from .core.gates import check_gates
from .core.precision import check_precision
from .io import CacheKey, digest
from .options import DEFAULT_GATES, DEFAULT_PRECISION, DEFAULT_SCOPE
from .prompt_tokens import tokenize
from .result import ESSResult

__all__ = [
    "RunSettings",
    "RunRequest",
    "AnalysisRun",
    "RunSteps",
    "OpenedRun",
    "open_run",
    "run_cached",
    "quiet_transformers",
    "LOADED_DTYPE",
]

# load_model always loads float32 weights: the dtype a run is described with before loading.
LOADED_DTYPE = "float32"


@dataclass(frozen=True)
class RunSettings:
    """The analysis options that change the numbers (as in `analysis.analyze`), checked when
    made: a bad value is a ValueError before any model is loaded.

    layers: sorted layer indices, or None for every layer. tol, relative, scope: the
    tolerance of tolerance-ESS (core/ess.py). gates: the gate policy (core/gates.py).
    precision: the accuracy contract (core/precision.py). stride: every stride-th cut only,
    or None (every cut). causal: compute causal ESS. device: where the spectra are computed
    (None: the model's). units: the first n units or these unit indices (None: all).
    """

    layers: tuple[int, ...] | None = None
    tol: float = DEFAULT_TOL
    relative: bool = DEFAULT_RELATIVE
    scope: str = DEFAULT_SCOPE
    gates: str = DEFAULT_GATES
    precision: str = DEFAULT_PRECISION
    stride: int | None = None
    causal: bool = True
    device: str | None = None
    units: int | tuple[int, ...] | None = None

    def __post_init__(self):
        check_tolerance(self.tol, self.relative)
        check_scope(self.scope, self.relative)
        check_gates(self.gates)
        check_precision(self.precision)
        if self.stride is not None and (
            isinstance(self.stride, bool) or not isinstance(self.stride, int) or self.stride < 1
        ):
            raise ValueError(f"stride must be a positive integer or None, got {self.stride!r}")
        if self.layers is not None:
            object.__setattr__(self, "layers", tuple(sorted({int(i) for i in self.layers})))
        if self.units is not None and not isinstance(self.units, int):
            object.__setattr__(self, "units", tuple(int(u) for u in self.units))
        object.__setattr__(self, "tol", float(self.tol))
        object.__setattr__(self, "device", None if self.device is None else str(self.device))

    def analyze_options(self) -> dict:
        """The keyword arguments of `analysis.analyze` these settings stand for."""
        return {
            "layers": None if self.layers is None else list(self.layers),
            "tol": self.tol,
            "relative": self.relative,
            "scope": self.scope,
            "gates": self.gates,
            "precision": self.precision,
            "stride": self.stride,
            "causal": self.causal,
            "device": self.device,
            **(
                {} if self.units is None else {"units": self.units if isinstance(self.units, int) else list(self.units)}
            ),
        }


@dataclass(frozen=True)
class AnalysisRun:
    """What determines one result: the model's identity, the prompt's token ids (and its text
    and separators), the settings, the dtype of the weights, the hub revision asked for and
    the package version (a new version may compute differently: it never reuses an entry)."""

    identity: dict
    input_ids: tuple[int, ...]
    settings: RunSettings = field(default_factory=RunSettings)
    prompt: str | None = None
    separators: tuple[int, ...] | None = None
    dtype: str = LOADED_DTYPE
    revision: str | None = None
    version: str = __version__

    def cache_key(self) -> CacheKey:
        """The sha256 of the canonical JSON of this run (io.digest), carrying that JSON."""
        settings = self.settings
        options = {
            "causal": settings.causal,
            "device": settings.device,
            "gates": settings.gates,
            "precision": settings.precision,
            "revision": self.revision,
        }
        if self.separators is not None:
            options["separators"] = list(self.separators)
        if settings.units is not None:
            options["units"] = settings.units if isinstance(settings.units, int) else list(settings.units)
        record = {
            "identity": self.identity,
            "input_ids": [int(i) for i in self.input_ids],
            "prompt": self.prompt,
            "layers": None if settings.layers is None else list(settings.layers),
            "dtype": str(self.dtype),
            "tol": settings.tol,
            "relative": bool(settings.relative),
            "scope": settings.scope,
            "stride": settings.stride,
            "version": str(self.version),
            "options": options,
        }
        return digest(record)


@contextlib.contextmanager
def quiet_transformers():
    """transformers' weight-loading bar and notices silenced for the duration (a notebook cell
    or a --quiet command line reports its own progress); restored after. The level is set on
    the standard "transformers" logger, which installs no handler of its own (transformers'
    set_verbosity would bind one to whatever stderr is at that moment)."""
    import logging

    try:
        from transformers.utils import logging as hf_logging
    except ImportError:
        yield
        return
    logger = logging.getLogger("transformers")
    level, bar = logger.level, hf_logging.is_progress_bar_enabled()
    logger.setLevel(logging.ERROR)
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        logger.setLevel(level)
        if bar:
            hf_logging.enable_progress_bar()


def _load(source: str, revision: str | None):
    from . import sources

    return sources.load_model(source, revision=revision)


def _identity(source: str, model, revision: str | None) -> dict:
    from .sources import model_identity

    return model_identity(source, model, revision=revision)


def _identity_without_weights(source: str, revision: str | None):
    from .sources import identity_without_weights

    return identity_without_weights(source, revision)


def _analyze(model, input_ids, tokenizer, **options) -> ESSResult:
    from .analysis import analyze

    return analyze(model, input_ids, tokenizer=tokenizer, **options)


@dataclass(frozen=True)
class RunSteps:
    """The model-dependent steps of a run. load(source, revision) -> (model, tokenizer);
    identity(source, model, revision) -> dict; identity_without_weights(source, revision) ->
    (identity, tokenizer) or None; analyze(model, input_ids, tokenizer, **options) -> ESSResult.
    Defaults: sources.load_model, sources.model_identity, sources.identity_without_weights,
    analysis.analyze."""

    load: Callable = _load
    identity: Callable = _identity
    identity_without_weights: Callable = _identity_without_weights
    analyze: Callable = _analyze


@dataclass(frozen=True)
class RunRequest:
    """What a caller asks for: a model ``source`` (load_model's), a ``prompt`` (a text or token
    ids) or a ``chat`` (a conversation; exactly one of the two), the ``settings`` and the hub
    ``revision`` (None: the default branch)."""

    source: str
    prompt: object = None
    chat: object = None
    settings: RunSettings = RunSettings()
    revision: str | None = None


@dataclass
class OpenedRun:
    """A run looked up and, on a miss, loaded: ``hit`` is the cached result (None: a miss, and
    ``model`` is loaded); ``run`` the description (None when no cache key could be made:
    no cache, or no tokenizer to read the prompt). `inputs` are the prompt's (text, token ids,
    separators); `store` writes a computed result under the run's key."""

    request: RunRequest
    cache: object | None
    tokenizer: object | None = None
    model: object | None = None
    run: AnalysisRun | None = None
    hit: ESSResult | None = None
    given: tuple | None = None  # (text, ids, separators), tokenised once per tokenizer

    def inputs(self) -> tuple[str | None, list[int], list[int] | None]:
        if self.given is None:
            self.given = tokenize(self.tokenizer, prompt=self.request.prompt, chat=self.request.chat)
        return self.given

    def store(self, result: ESSResult) -> None:
        if self.cache is not None and self.run is not None:
            self.cache.put(self.run.cache_key(), result)


def open_run(request: RunRequest, *, cache=None, steps: RunSteps = RunSteps()) -> OpenedRun:
    """Look the run up in ``cache`` (an io.ResultCache or None) before loading, load the model
    on a miss (``steps.load``), and look it up again when the identity needed the weights."""
    source, revision = request.source, request.revision
    opened = OpenedRun(request, cache)
    identity = None
    if cache is not None:
        found = steps.identity_without_weights(source, revision)
        if found is not None:
            identity, opened.tokenizer = found
            if _look_up(opened, identity, LOADED_DTYPE, revision):
                return opened
    opened.model, opened.tokenizer = steps.load(source, revision)
    opened.given = None  # the loaded tokenizer reads the prompt
    if cache is not None:
        if identity is None:  # e.g. a hub id whose commit is known once loaded
            identity = steps.identity(source, opened.model, revision)
        _look_up(opened, identity, _dtype_of(opened.model), revision)
    return opened


def _look_up(opened: OpenedRun, identity: dict, dtype: str, revision) -> bool:
    """Describe the run (the prompt tokenised by ``opened.tokenizer``) and ask the cache; True
    on a hit. No tokenizer or a prompt it cannot read: no description (a miss, not an error:
    the analysis says what is wrong)."""
    import warnings

    try:
        with warnings.catch_warnings():
            if opened.model is None:  # a look-up before loading: the run itself warns, once
                warnings.simplefilter("ignore")
            text, ids, separators = opened.inputs()
    except ValueError:
        opened.given = None
        return False
    opened.run = AnalysisRun(
        identity,
        tuple(ids),
        opened.request.settings,
        prompt=text,
        separators=None if separators is None else tuple(separators),
        dtype=dtype,
        revision=revision,
    )
    opened.hit = opened.cache.get(opened.run.cache_key())
    return opened.hit is not None


def _dtype_of(model) -> str:
    parameters = getattr(model, "parameters", None)
    if parameters is None:
        return "unknown"
    return str(next(iter(parameters())).dtype).replace("torch.", "")


def run_cached(
    request: RunRequest, *, cache=None, steps: RunSteps = RunSteps(), **analysis
) -> tuple[ESSResult, bool, Callable[[], None]]:
    """(result, hit, store): the run from ``cache`` or computed (``steps.analyze`` with the
    settings; ``analysis`` passes options that do not change the numbers, e.g. progress,
    max_seconds, keep_operators). meta gains the source, the prompt text and the chat."""
    opened = open_run(request, cache=cache, steps=steps)
    if opened.hit is not None:
        return opened.hit, True, _nothing
    text, ids, separators = opened.inputs()
    options = request.settings.analyze_options()
    if separators is not None:
        options["separators"] = separators
    result = steps.analyze(opened.model, ids, opened.tokenizer, **options, **analysis)
    result.meta["source"] = request.source
    if text is not None:
        result.meta["prompt"] = text
    if request.chat is not None:
        result.meta["chat"] = [dict(message) for message in request.chat]
    return result, False, lambda: opened.store(result)


def _nothing() -> None:
    return None
