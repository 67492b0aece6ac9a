"""Hostile input: every bad input gets a clear answer, nothing is lost, nothing is silent.

Three parts:
- property-based fuzzing (hypothesis) of the core's entry points and of the command line:
  every outcome is a correct result or a ValueError (the core), an exit status 0 / 1 / 2
  with no traceback (the CLI);
- writes that fail (concurrent writers, an interrupt, a full disk, a cache that cannot
  be written): the old file stays whole, no temporary file stays behind, the result is
  never lost;
- regression tests of bad inputs, each asserting the kind of outcome and that nothing was
  written.

No model is needed except where a test says so (the small built-in zoo model, offline).
"""

from __future__ import annotations

import contextlib
import copy
import errno
import io
import json
import math
import os
import shutil
import subprocess
import threading
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from ess_explorer import atomic
from ess_explorer.app import cli
from ess_explorer.core import spectra
from ess_explorer.core.ess import entropy_ess, tolerance_ess
from ess_explorer.core.operators import DiagonalSSM
from ess_explorer.core.spectra import hankel_singular_values
from ess_explorer.io import ResultCache, table_bytes, write_result_dir
from ess_explorer.result import ESSResult
from ess_explorer.runs import AnalysisRun, RunSettings
from ess_explorer.synthetic import reference_result

# hypothesis draws huge floats into float32 arrays on purpose; numpy's cast warning is noise here
pytestmark = pytest.mark.filterwarnings("ignore:overflow encountered in cast:RuntimeWarning")

FUZZ = settings(max_examples=600, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)


@pytest.fixture(scope="module")
def ref():
    return reference_result(16)


def files_in(folder: Path) -> list[str]:
    return sorted(p.name for p in Path(folder).rglob("*") if p.is_file())


# ---- fuzzing: the core -------------------------------------------------------------------------
dtypes = st.sampled_from([np.float64, np.float32, np.int64, np.bool_, np.complex128])
wild_floats = st.floats(allow_nan=True, allow_infinity=True, width=64)


@st.composite
def operators(draw):
    length = draw(st.integers(0, 6))
    batch = draw(st.sampled_from([(), (1,), (2,), (0,)]))
    dtype = draw(dtypes)
    elements = wild_floats if draw(st.booleans()) else st.floats(-10, 10)
    if dtype == np.bool_:
        elements = st.booleans()
    elif dtype == np.int64:
        elements = st.integers(-5, 5)
    array = draw(hnp.arrays(dtype, batch + (length, length), elements=elements))
    return np.tril(array) if draw(st.booleans()) and array.ndim >= 2 else array


def check_spectrum(sigma: torch.Tensor, shape) -> None:
    """What every accepted spectrum must be: finite, non-negative, descending per cut."""
    assert sigma.shape[:-1] == tuple(shape[:-1])
    assert bool(torch.isfinite(sigma).all()) and bool((sigma >= 0).all())
    assert bool((sigma[..., :-1] >= sigma[..., 1:] - 1e-9 * (1 + sigma[..., :1])).all())


def test_fuzz_hankel_singular_values():
    @FUZZ
    @given(
        op=operators(),
        top_k=st.one_of(st.none(), st.integers(-2, 4), st.just(1.5), st.just(True)),
        stride=st.one_of(st.none(), st.integers(-1, 3)),
    )
    def run(op, top_k, stride):
        try:
            sigma = hankel_singular_values(op, top_k=top_k, stride=stride)
        except ValueError:
            return
        length = op.shape[-1]
        assert op.ndim >= 2 and length >= 1 and np.isrealobj(op) and op.dtype.kind == "f"
        check_spectrum(sigma, op.shape[:-2] + (len(range(0, length, stride or 1)), 0))
        assert sigma.shape[-1] <= length // 2 and (top_k is None or sigma.shape[-1] <= top_k)

    run()


def test_fuzz_tolerance_and_entropy_ess():
    wild = st.one_of(wild_floats, st.integers(-3, 3), st.booleans(), st.none(), st.text(max_size=3))

    @FUZZ
    @given(
        op=operators(),
        tol=wild,
        relative=st.one_of(st.booleans(), st.just("no"), st.integers(0, 1), st.none()),
        spectra_given=st.booleans(),
    )
    def run(op, tol, relative, spectra_given):
        given_kw = {"spectra": np.abs(op) if op.dtype.kind == "f" else op} if spectra_given else {}
        args = () if spectra_given else (op,)
        try:
            ess = tolerance_ess(*args, tol=tol, relative=relative, **given_kw)
        except ValueError:
            pass
        else:
            assert isinstance(tol, (int, float)) and not isinstance(tol, bool) and math.isfinite(tol) and tol >= 0
            assert isinstance(relative, bool)
            assert ess.dtype == torch.int64 and bool((ess >= 0).all())
        try:
            ent = entropy_ess(*args, **given_kw)
        except ValueError:
            return
        assert bool(torch.isfinite(ent).all()) and bool((ent >= 0).all())

    run()


def test_fuzz_diagonal_ssm():
    @FUZZ
    @given(
        length=st.integers(0, 5),
        n=st.integers(0, 3),
        dtype=dtypes,
        scale=st.sampled_from([0.5, 1.0, 3.0, 1e3]),
        same=st.booleans(),
        nan=st.booleans(),
    )
    def run(length, n, dtype, scale, same, nan):
        rng = np.random.default_rng(length * 31 + n)
        a = (rng.uniform(-1, 1, (length, n)) * scale).astype(dtype)
        b = rng.normal(size=(length, n)).astype(dtype)
        c = rng.normal(size=(length if same else length + 1, n)).astype(dtype)
        if nan and a.size and dtype in (np.float64, np.float32):
            a.flat[0] = np.nan
        try:
            ssm = DiagonalSSM(a, b, c)
        except ValueError:
            return
        assert dtype in (np.float64, np.float32) and length >= 1 and n >= 1 and same and not nan
        try:
            sigma = hankel_singular_values(ssm)
        except ValueError as error:
            assert "overflow" in str(error)
            return
        check_spectrum(sigma, (length, 0))

    run()


# ---- fuzzing: the command line -----------------------------------------------------------------
class FakeTokenizer:
    """As many ids as the reference result has tokens (16), from the text: the cache serves an
    entry only to the run whose token ids it holds."""

    def __call__(self, text, add_special_tokens=False):
        return {"input_ids": [ord(c) % 64 for c in (text * 16)[:16]]}


class FakeModel:
    def parameters(self):
        yield torch.zeros(1)


@contextlib.contextmanager
def fake_cli(ref, tmp_path):
    """The CLI with the model steps replaced (the synthetic result) and the renderer
    replaced by a stub (size checks still run), cache under tmp_path."""
    import vl_convert

    calls = {"analyze": 0}

    def analyze(model, ids, tokenizer, **kw):
        calls["analyze"] += 1
        result = copy.deepcopy(ref)
        result.input_ids = list(ids)
        return result

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(cli, "_load_model", lambda source, revision: (FakeModel(), FakeTokenizer()))
        mp.setattr(cli, "_analyze", analyze)
        mp.setattr(cli, "_identity", lambda source, model, revision: {"kind": "fake", "source": source})
        mp.setattr(cli, "_default_source", lambda: "zoo:fake")
        mp.setenv("ESS_EXPLORER_CACHE", str(tmp_path / "cache"))
        mp.delenv("ESS_EXPLORER_DEBUG", raising=False)
        for name in ("vegalite_to_pdf", "vegalite_to_png"):
            mp.setattr(vl_convert, name, lambda *a, **k: b"stub")
        mp.setattr(vl_convert, "vegalite_to_svg", lambda *a, **k: '<svg width="100" height="100"></svg>')
        mp.setattr("sys.stdin", io.StringIO(""))
        yield calls


def run_cli(argv) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli.main([str(a) for a in argv])
    return code, out.getvalue(), err.getvalue()


def assert_clean(code: int, err: str) -> None:
    assert code in (0, 1, 2), code
    assert "Traceback" not in err and "internal error" not in err, err
    if code:
        errors = [line for line in err.splitlines() if line.startswith("ess-explorer: error: ")]
        assert len(errors) == 1, err


def test_fuzz_cli_arguments(ref, tmp_path):
    saved = write_result_dir(ref, tmp_path / "saved")
    values = st.sampled_from(
        [
            "0",
            "-1",
            "1e9",
            "nan",
            "inf",
            "1.5",
            "abc",
            "",
            "0-3",
            "0-999999999",
            "2,1",
            "single",
            "double",
            "300",
            "1e-3",
            "-",
            "cpu",
            "\udcff",
            str(saved),
            "x.png",
            "x.pdf",
            "x.txt",
            "overview",
            "spectrum",
            "all",
            "=1+1",
        ]
    )
    flags = st.sampled_from(
        [
            "--layers",
            "--tol",
            "--stride",
            "--device",
            "--revision",
            "--prompt",
            "--width",
            "--height",
            "--ppi",
            "--kind",
            "--out",
            "--t",
            "--unit",
            "--positions",
            "--variant",
            "--font",
            "--absolute",
            "--no-cache",
            "-q",
            "--bogus",
        ]
    )
    command = st.sampled_from(["analyze", "figure", "report", "models", "nonsense"])

    with fake_cli(ref, tmp_path):

        @settings(max_examples=800, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
        @given(cmd=command, rest=st.lists(st.one_of(flags, values), max_size=8))
        def run(cmd, rest):
            argv = (
                [cmd]
                + [str(saved)] * (cmd == "figure")
                + [str(tmp_path / "out" / a) if a in ("x.png", "x.pdf", "x.txt") else a for a in rest]
            )
            code, _, err = run_cli(argv)
            assert_clean(code, err)

        run()


# ---- nothing lost: atomic writes ---------------------------------------------------------------
def test_concurrent_writers_and_a_reader_never_see_half_a_file(ref, tmp_path):
    target = tmp_path / "shared.npz"
    results = []
    for writer in range(4):
        result = copy.deepcopy(ref)
        result.meta["writer"] = writer
        results.append(result)
    errors, seen = [], set()
    done = threading.Event()

    def write(result):
        try:
            for _ in range(5):
                result.save(target)
        except BaseException as error:  # noqa: BLE001
            errors.append(error)

    def read():
        while not done.is_set():
            if target.exists():
                try:
                    seen.add(ESSResult.load(target).meta["writer"])
                except BaseException as error:  # noqa: BLE001
                    errors.append(error)

    reader = threading.Thread(target=read)
    reader.start()
    writers = [threading.Thread(target=write, args=(r,)) for r in results]
    for thread in writers:
        thread.start()
    for thread in writers:
        thread.join()
    done.set()
    reader.join()
    assert errors == []
    assert ESSResult.load(target).meta["writer"] in range(4) and seen <= set(range(4))
    assert files_in(tmp_path) == ["shared.npz"]  # no temporary file left


def test_an_interrupt_inside_the_write_keeps_the_old_file(ref, tmp_path, monkeypatch):
    target = ref.save(tmp_path / "run.npz")
    before = target.read_bytes()

    def interrupted(handle, **arrays):
        handle.write(b"half a file")
        raise KeyboardInterrupt

    monkeypatch.setattr(np, "savez_compressed", interrupted)
    with pytest.raises(KeyboardInterrupt):
        ref.save(target)
    assert target.read_bytes() == before and files_in(tmp_path) == ["run.npz"]


def enospc(*args, **kwargs):
    raise OSError(errno.ENOSPC, "No space left on device")


def test_a_full_disk_keeps_the_old_file_and_the_cache_warns(ref, tmp_path, monkeypatch):
    target = ref.save(tmp_path / "run.npz")
    before = target.read_bytes()
    monkeypatch.setattr(atomic.os, "fsync", enospc)  # the data reach the disk only at fsync
    with pytest.raises(OSError, match="No space"):
        ref.save(target)
    assert target.read_bytes() == before and files_in(tmp_path) == ["run.npz"]
    cache = ResultCache(tmp_path / "cache")
    with pytest.warns(UserWarning, match="No space left on device"):
        assert cache.put("ab" * 32, copy.deepcopy(ref)) is None
    assert files_in(tmp_path / "cache") == []


@contextlib.contextmanager
def small_tmpfs(folder: Path, options: str):
    """A real size-limited (or read-only) file system at ``folder``; skips where mounting
    is not permitted."""
    folder.mkdir(parents=True, exist_ok=True)
    try:
        done = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(folder)], capture_output=True, timeout=10
        )
    except (OSError, subprocess.TimeoutExpired):
        pytest.skip("mount is not available here")
    if done.returncode != 0:
        pytest.skip(f"mounting a tmpfs is not permitted here ({done.stderr.decode(errors='replace').strip()})")
    try:
        yield folder
    finally:
        subprocess.run(["umount", str(folder)], capture_output=True, timeout=10)


def test_a_real_full_disk_leaves_no_temporary_file(tmp_path):
    big = reference_result(200)  # about 120 KB in a file: larger than 64 KiB
    with small_tmpfs(tmp_path / "small", "size=64k") as folder:
        with pytest.raises(OSError) as caught:
            big.save(folder / "run.npz")
        assert caught.value.errno in (errno.ENOSPC, errno.EDQUOT)
        assert files_in(folder) == []
        with pytest.warns(UserWarning, match="not cached"):
            assert ResultCache(folder).put("cd" * 32, big) is None
        assert files_in(folder) == []


def unwritable_cache(tmp_path: Path, how: str) -> Path:
    """A cache location that cannot be written: a file where the folder should be, or a
    read-only folder (a read-only mount, or permissions when not running as root)."""
    if how == "file":
        (tmp_path / "cache").write_text("not a folder")
        return tmp_path / "cache"
    folder = tmp_path / "cache"
    if os.geteuid() == 0:
        return folder  # mounted read-only by the caller
    folder.mkdir()
    folder.chmod(0o500)
    return folder


@pytest.mark.parametrize("how", ["file", "read-only", "full"])
def test_the_cli_writes_out_when_the_cache_cannot_be_written(ref, tmp_path, monkeypatch, how):
    out = tmp_path / "result"
    with fake_cli(ref, tmp_path) as calls, contextlib.ExitStack() as stack:
        cache = unwritable_cache(tmp_path, how if how != "full" else "file")
        if how == "read-only" and os.geteuid() == 0:
            stack.enter_context(small_tmpfs(cache, "ro,size=64k"))
        if how == "full":
            cache = tmp_path / "cache-ok"
            original = ESSResult.save
            monkeypatch.setattr(
                ESSResult, "save", lambda self, path: enospc() if str(cache) in str(path) else original(self, path)
            )
        code, stdout, err = run_cli(["analyze", "-p", "some text", "--cache-dir", cache, "--out", out, "-q"])
        assert code == 0 and calls["analyze"] == 1, err
        assert "ess-explorer: warning: could not write the cache entry" in err and "Traceback" not in err
        assert files_in(out) == ["meta.json", "result.npz", "table.csv"]
        assert ESSResult.load(out / "result.npz").layers.keys() == ref.layers.keys()


# ---- no raw traceback: the CLI and the magic --------------------------------------------------
@pytest.mark.parametrize(
    "option",
    [
        ["--ppi", "100000"],
        ["--ppi", "0"],
        ["--ppi", "nan"],
        ["--width", "1e9"],
        ["--width", "nan"],
        ["--height", "1e9"],
        ["--layers", "0-999999999"],
    ],
)
def test_figure_sizes_are_refused_before_the_renderer(ref, tmp_path, option):
    saved = write_result_dir(ref, tmp_path / "saved")
    with fake_cli(ref, tmp_path):
        code, _, err = run_cli(["figure", saved, "--kind", "overview", "--out", tmp_path / "f.png", *option])
    assert code == 2 and not (tmp_path / "f.png").exists()
    assert_clean(code, err)


def test_a_huge_figure_is_refused_by_the_pixel_budget(ref):
    from ess_explorer.views.render import figure_bytes

    spec = {
        "$schema": "https://vega.github.io/schema/vega-lite/v5.json",
        "data": {"values": [{"x": 1}]},
        "mark": "point",
        "encoding": {"x": {"field": "x", "type": "quantitative"}},
        "width": 5000,
        "height": 5000,
    }
    with pytest.raises(ValueError, match="pixels"):
        figure_bytes(spec, "png", ppi=2400)
    with pytest.raises(ValueError, match="out of range"):
        figure_bytes({**spec, "width": 1e9}, "pdf")


def test_an_invalid_utf8_prompt_is_one_line(ref, tmp_path, monkeypatch):
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"abc \xff\xfe def")
    with fake_cli(ref, tmp_path) as calls:
        for argv in (["analyze", "--prompt-file", bad], ["analyze", "--prompt", "abc \udcff"]):
            code, _, err = run_cli(argv)
            assert code == 1 and "UTF-8" in err
            assert_clean(code, err)
        monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(b"\xff\xfe"), encoding="utf-8"))
        code, _, err = run_cli(["analyze", "--prompt", "-"])
        assert code == 1 and "UTF-8" in err and calls["analyze"] == 0


def test_debug_keeps_the_traceback(ref, tmp_path, monkeypatch):
    with fake_cli(ref, tmp_path):
        monkeypatch.setenv("ESS_EXPLORER_DEBUG", "1")
        with pytest.raises(FileNotFoundError, match="no ESS result"):
            cli.main(["figure", str(tmp_path / "missing"), "--kind", "overview", "--out", str(tmp_path / "f.pdf")])


def write_npz(path: Path, header, arrays=None) -> Path:
    payload = {"__header__": np.frombuffer(json.dumps(header).encode("utf-8"), dtype=np.uint8), **(arrays or {})}
    np.savez(path, **payload)
    return path


@pytest.mark.parametrize(
    "field, change",
    [
        ("tokens", {"tokens": 5}),
        ("input_ids", {"input_ids": "abc"}),
        ("input_ids", {"input_ids": [True, False]}),
        ("meta", {"meta": []}),
        ("layers", {"layers": []}),
        ("layers.0", {"layers": {"0": "x"}}),
        ("tokens", {"tokens": ["a"], "input_ids": [1, 2]}),
    ],
)
def test_result_headers_of_the_wrong_type_are_named(tmp_path, field, change):
    header = {"format_version": 1, "tokens": ["a", "b"], "input_ids": [1, 2], "meta": {}, "layers": {}}
    path = write_npz(tmp_path / "bad.npz", {**header, **change})
    with pytest.raises(ValueError, match=f"field {field}"):
        ESSResult.load(path)
    code, _, err = run_cli(["figure", path, "--kind", "overview", "--out", tmp_path / "f.pdf"])
    assert code == 1 and not (tmp_path / "f.pdf").exists()
    assert_clean(code, err)


@pytest.mark.parametrize(
    "name, bad",
    [
        ("tss", lambda a: a[:, :-1]),
        ("positions", lambda a: a + 1000),
        ("singular_values", lambda a: a[0]),
        ("tolerance_ess", lambda a: a.T),
    ],
)
def test_result_arrays_of_inconsistent_shape_are_named(ref, tmp_path, name, bad):
    good = ref.save(tmp_path / "good.npz")
    with np.load(good) as data:
        arrays = {key: data[key] for key in data.files}
    arrays[f"L0/{name}"] = bad(arrays[f"L0/{name}"])
    np.savez(tmp_path / "bad.npz", **arrays)
    with pytest.raises(ValueError, match=f"field L0/{name}"):
        ESSResult.load(tmp_path / "bad.npz")


def test_the_magic_prints_one_line(ref, tmp_path, capsys, monkeypatch):
    from ess_explorer.app import magic

    monkeypatch.delenv("ESS_EXPLORER_DEBUG", raising=False)
    assert magic.ess_magic(f"--result {tmp_path / 'missing.npz'}") is None
    assert magic.ess_magic("--tol nan") is None
    out = capsys.readouterr().out
    assert "no saved result" in out and "finite number" in out and "Traceback" not in out
    monkeypatch.setattr("ess_explorer.app.widget.explore", lambda *a, **k: 1 / 0)
    assert magic.ess_magic(f"--result {ref.save(tmp_path / 'ok.npz')}") is None
    assert "%ess: error: division by zero" in capsys.readouterr().out


# ---- the core: clear errors, never garbage ----------------------------------------------------
def test_core_refusals():
    tril = np.tril(np.ones((6, 6)))
    cases = [
        (lambda: tolerance_ess(np.zeros((0, 0))), "empty"),
        (lambda: tolerance_ess(tril, top_k=0), "top_k"),
        (lambda: tolerance_ess(tril, 1e-3, "no"), "relative"),
        (lambda: hankel_singular_values(tril, positions=[1.5]), "integers"),
        (lambda: hankel_singular_values(tril, positions=[True]), "integers"),
        (lambda: hankel_singular_values(tril, top_k=0), "top_k"),
        (lambda: DiagonalSSM(*(torch.ones(5, 2, dtype=torch.complex128),) * 3), "real floating-point"),
    ]
    for call, message in cases:
        with pytest.raises(ValueError, match=message):
            call()


def test_a_solver_that_fails_on_stable_decays_is_not_called_an_overflow(monkeypatch):
    """A LinAlgError from a solver (a GPU's batched solver that did not converge) on an operator
    whose decays are stable says that, and what to do; on growing decays it is the overflow."""
    from ess_explorer.core import spectra

    def fails(*_args):
        raise torch.linalg.LinAlgError("linalg.eigh: the algorithm failed to converge")

    monkeypatch.setattr(spectra, "_hankel_singular_values", fails)
    stable = torch.full((20, 2), 0.9, dtype=torch.float64)
    with pytest.raises(ValueError, match=r"did not converge .*largest \|a\| = 0.9\).*device='cpu'"):
        hankel_singular_values(DiagonalSSM(stable, torch.ones_like(stable), torch.ones_like(stable)))
    growing = torch.full((20, 2), 3.0, dtype=torch.float64)
    with pytest.raises(ValueError, match="overflow the floating-point range .largest .a. = 3: decays above 1"):
        hankel_singular_values(DiagonalSSM(growing, torch.ones_like(growing), torch.ones_like(growing)))


def test_a_growing_decay_is_a_clear_overflow_error():
    a = torch.full((200, 2), 1e3, dtype=torch.float64)
    ssm = DiagonalSSM(a, torch.ones_like(a), torch.ones_like(a))
    with pytest.raises(ValueError, match="overflow"):
        tolerance_ess(ssm)
    with pytest.raises(ValueError, match="NaN or infinite"):  # its dense form already overflows
        tolerance_ess(ssm.materialize())


def test_a_dense_operator_over_the_memory_budget_is_refused_before_allocating(monkeypatch):
    huge = torch.zeros(1, 1, dtype=torch.float64).expand(20000, 20000)  # no memory behind it
    with pytest.raises(ValueError, match=r"about [0-9.]+ GiB.*stride.*top_k.*DiagonalSSM"):
        hankel_singular_values(huge)
    monkeypatch.setattr(spectra, "DENSE_BUDGET_BYTES", 500_000)
    op = torch.tril(torch.ones(200, 200, dtype=torch.float64))
    with pytest.raises(ValueError, match="budget"):
        hankel_singular_values(op)
    sigma = hankel_singular_values(op, positions=[100], top_k=3)  # the way out the message names
    assert sigma.shape == (1, 3) and sigma[0, 0] > 0


# ---- analyze, sources, the zoo (the small built-in model) -------------------------------------
@pytest.fixture(scope="module")
def tiny():
    from ess_explorer.sources import load_model

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return load_model("zoo:mamba2_n16")


def no_forward(monkeypatch):
    import ess_explorer.analysis as analysis

    def forbidden(*args, **kwargs):
        raise AssertionError("the forward pass ran before the input was checked")

    monkeypatch.setattr(analysis, "capture", forbidden)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"input_ids": [True, False, True]}, "integers"),
        ({"input_ids": [1, 2, 3], "layers": range(10**9)}, "out of range"),
        ({"input_ids": [1, 2, 3], "device": "no-such-device"}, "not usable"),
    ],
)
def test_analyze_checks_before_the_forward_pass(tiny, monkeypatch, kwargs, message):
    from ess_explorer.analysis import analyze

    no_forward(monkeypatch)
    with pytest.raises(ValueError, match=message):
        analyze(tiny[0], progress=False, **kwargs)


@pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA is available here")
def test_cuda_without_cuda_is_refused_before_the_forward_pass(tiny, monkeypatch):
    from ess_explorer.analysis import analyze

    no_forward(monkeypatch)
    with pytest.raises(ValueError, match="device 'cuda' is not usable"):
        analyze(tiny[0], [1, 2, 3], device="cuda", progress=False)


def model_copy(tmp_path: Path, files=("config.json", "model.safetensors")) -> Path:
    from ess_explorer.sources import model_dir

    folder = tmp_path / "model"
    folder.mkdir()
    for name in files:
        shutil.copy(model_dir("mamba2_n16") / name, folder / name)
    return folder


def test_model_folders_that_do_not_fit_are_named_errors(tmp_path):
    from ess_explorer.sources import load_model

    folder = model_copy(tmp_path)
    with pytest.warns(UserWarning, match="pass input_ids"):
        model, tokenizer = load_model(str(folder))
    assert tokenizer is None and model is not None
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "num_hidden_layers": config["num_hidden_layers"] + 1}))
    with pytest.raises(ValueError, match="missing keys: backbone.layers"):
        load_model(str(folder))
    (folder / "config.json").write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON") as caught:
        load_model(str(folder))
    assert "HF_HUB_OFFLINE" not in str(caught.value)
    (folder / "config.json").write_text(json.dumps(config))
    weights = (folder / "model.safetensors").read_bytes()
    (folder / "model.safetensors").write_bytes(weights[: len(weights) // 2])
    with pytest.raises(ValueError, match="weights"):
        load_model(str(folder))
    code, _, err = run_cli(["analyze", "--model", folder, "-p", "ab", "--no-cache", "-q"])
    assert code == 1
    assert_clean(code, err)


def test_a_hub_id_without_network_fails_fast(tmp_path, monkeypatch):
    import socket

    from ess_explorer import sources

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))  # nothing cached
    probes = []

    def no_network(address, timeout=None):
        probes.append(timeout)
        raise OSError(errno.ENETUNREACH, "Network is unreachable")

    monkeypatch.setattr(socket, "create_connection", no_network)
    monkeypatch.setattr("transformers.AutoConfig.from_pretrained", lambda *a, **k: pytest.fail("went to the hub"))
    with pytest.raises(ValueError, match="network connection"):
        sources.load_model("someone/some-model")
    assert probes == [sources.HUB_PROBE_TIMEOUT] and sources.HUB_PROBE_TIMEOUT <= 5


def test_zoo_load_goes_through_the_safetensors_only_path(tmp_path, monkeypatch):
    from ess_explorer import sources, zoo

    pickled = tmp_path / "zoo" / "pickled"
    pickled.mkdir(parents=True)
    shutil.copy(sources.model_dir("mamba2_n16") / "config.json", pickled / "config.json")
    (pickled / "pytorch_model.bin").write_bytes(b"not to be unpickled")
    monkeypatch.setattr(sources, "ZOO_DIR", tmp_path / "zoo")
    monkeypatch.setattr(torch, "load", lambda *a, **k: pytest.fail("torch.load ran on a zoo file"))
    with pytest.raises(ValueError, match="safetensors only"):
        zoo.load("pickled")


# ---- files: save paths, the cache key, CSV ----------------------------------------------------
def test_save_keeps_an_npz_path_and_refuses_what_is_not_a_file(ref, tmp_path):
    assert ref.save(tmp_path / "a.npz") == tmp_path / "a.npz"
    assert ref.save(tmp_path / "b") == tmp_path / "b.npz"  # the documented ".npz" suffix
    (tmp_path / "folder").mkdir()
    with pytest.raises(ValueError, match="not a regular file"):
        ref.save(tmp_path / "folder")
    if Path("/dev/full").exists():
        with pytest.raises(ValueError, match="not a regular file"):
            ref.save("/dev/full")
        assert not Path("/dev/full.npz").exists()


def test_device_and_revision_change_the_cache_key(ref, tmp_path):
    with fake_cli(ref, tmp_path) as calls:
        for argv in ([], ["--device", "cpu"], ["--revision", "v2"], ["--device", "cpu"]):
            code, out, err = run_cli(["analyze", "-p", "same prompt", *argv])
            assert code == 0, err
        assert calls["analyze"] == 3  # the repeated --device cpu is the only hit
    assert AnalysisRun({}, (1, 2)).cache_key() != AnalysisRun({}, (1, 2), RunSettings(device="cpu")).cache_key()


def test_csv_escapes_formula_cells_and_keeps_numbers(ref):
    result = copy.deepcopy(ref)
    result.tokens = ["=HYPERLINK(1)", "+1", "-2", "@x", "plain"] + result.tokens[5:]
    import pandas as pd

    table = pd.read_csv(io.BytesIO(table_bytes(result, "csv")), keep_default_na=False)
    first = table[(table.layer == 0) & (table.unit == 0)].sort_values("t")
    assert list(first.token[:5]) == ["'=HYPERLINK(1)", "'+1", "'-2", "'@x", "plain"]
    assert table.tolerance_ess.dtype.kind == "i" and table.tss.dtype.kind == "f"
    assert np.array_equal(first.tolerance_ess.to_numpy(), ref.layers[0].tolerance_ess[0])


def test_the_widget_refuses_a_nan_tolerance_first(ref):
    from ess_explorer.app.widget import ESSExplorer

    with pytest.raises(ValueError, match="tol must be a finite number"):
        ESSExplorer(result=ref, tol=float("nan"), static=False)
    with pytest.raises(ValueError, match="relative must be True or False"):
        ESSExplorer(result=ref, relative="no", static=False)
