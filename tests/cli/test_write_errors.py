"""Outputs that cannot be written (a read-only filesystem, an immutable directory, a full disk, a
path through a file): one ``error:`` line naming the output and what to do, whatever the errno,
before the work starts; and eval prints its results before it draws its plot."""

from __future__ import annotations

import builtins
import errno
import io
import json
import os
from pathlib import Path

import pytest

from helpers import ROOT, run

TINY = ROOT / "fixtures" / "tiny-gpt2"

ADVICE = {  # what each errno's line tells the user to do about the output named by {option}
    "EROFS": "The filesystem is read-only; choose another {option}",
    "EPERM": "Give {option} a path in a directory you may write to",
    "ENOSPC": "Free some space or choose another {option}",
}


@pytest.fixture(params=sorted(ADVICE))
def locked(request, tmp_path, monkeypatch) -> tuple[Path, str]:
    """A directory in which every write fails with one errno, as on a read-only filesystem
    (EROFS: even unlinking a file that is not there), an immutable directory (EPERM) or a full
    disk (ENOSPC). The tests run as root, where chmod stops nothing, so the calls are refused
    here. Returns the directory and the errno's name."""
    d = tmp_path / "locked"
    d.mkdir()
    code = getattr(errno, request.param)
    root = str(d)

    def inside(path) -> bool:
        if isinstance(path, int):
            return False
        p = os.path.abspath(os.fsdecode(path))
        return p == root or p.startswith(root + os.sep)

    def refuse(path):
        raise OSError(code, os.strerror(code), os.fsdecode(path))

    real = {
        name: getattr(os, name)
        for name in ("open", "mkdir", "unlink", "remove", "rmdir", "rename", "replace")
    }
    real_open = builtins.open

    def os_open(path, flags, *a, **kw):
        if inside(path) and flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT):
            refuse(path)
        return real["open"](path, flags, *a, **kw)

    def one_path(name):
        def call(path, *a, **kw):
            if inside(path):
                refuse(path)
            return real[name](path, *a, **kw)

        return call

    def two_paths(name):
        def call(src, dst, *a, **kw):
            if inside(src) or inside(dst):
                refuse(dst)
            return real[name](src, dst, *a, **kw)

        return call

    def file_open(file, mode="r", *a, **kw):
        if inside(file) and any(c in mode for c in "wax+"):
            refuse(file)
        return real_open(file, mode, *a, **kw)

    monkeypatch.setattr(os, "open", os_open)
    for name in ("mkdir", "unlink", "remove", "rmdir"):
        monkeypatch.setattr(os, name, one_path(name))
    for name in ("rename", "replace"):
        monkeypatch.setattr(os, name, two_paths(name))
    monkeypatch.setattr(builtins, "open", file_open)
    monkeypatch.setattr(io, "open", file_open)
    return d, request.param


def one_error(r, path: Path, code: str, option: str = "-o") -> str:
    """The one stderr line of a refused write: the path, the errno and what to do."""
    assert r.exit_code == 1, r.output
    assert "Traceback" not in r.output, r.output
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith(
        f"error: writing {path} failed: {os.strerror(getattr(errno, code))} [{code}]; "
    ), lines[0]
    assert lines[0].endswith(ADVICE[code].format(option=option)), lines[0]
    return lines[0]


def left_in(d: Path) -> list[str]:
    return sorted(p.name for p in d.iterdir())


@pytest.mark.parametrize("command", ["prune", "densify"])
def test_prune_and_densify_into_a_locked_directory(locked, command):
    d, code = locked
    extra = ["--sparsity", "0.5"] if command == "prune" else []
    r = run(command, TINY, "-o", d / "out", *extra)
    one_error(r, d / "out", code)
    assert left_in(d) == []


def test_shrink_into_a_locked_directory_is_refused_before_it_scores(locked, tmp_path, monkeypatch):
    from moe_models import save_moe

    import sparsetool.ops.shrink.kind as shrink_kind

    d, code = locked
    src = save_moe("mixtral", tmp_path / "moe", "some text to train a tokenizer on " * 20)
    called = []
    monkeypatch.setattr(shrink_kind, "open_model", lambda *a, **kw: called.append(1))
    r = run("shrink", src, "-o", d / "out", "--experts", "0.5", "--criterion", "random")
    one_error(r, d / "out", code)
    assert left_in(d) == [] and not called


@pytest.mark.parametrize(
    "command",
    [("report", TINY), ("diff", TINY, TINY), ("simulate", "--model", "gpt2-small", "--sweep")],
)
def test_a_plot_into_a_locked_directory(locked, command):
    d, code = locked
    r = run(*command, "--plot", d / "out.png")
    one_error(r, d / "out.png", code, "--plot")
    assert left_in(d) == [] and not r.stdout


def test_eval_refuses_a_locked_plot_before_it_evaluates(locked, monkeypatch):
    import sparsetool.ops.eval as ops_eval

    d, code = locked
    called = []
    monkeypatch.setattr(ops_eval, "open_model", lambda *a, **kw: called.append(1))
    r = run("eval", TINY, "--plot", d / "ppl.png")
    one_error(r, d / "ppl.png", code, "--plot")
    assert not called


@pytest.mark.parametrize(
    "command", [("train", "--preset", "tiny", "--steps", "1", "--warmup", "0"), ("demo",)]
)
def test_train_and_demo_into_a_locked_directory(locked, command):
    d, code = locked
    r = run(*command, "-o", d / "run")
    one_error(r, d / "run", code)
    assert left_in(d) == []


@pytest.mark.parametrize(
    "command",
    [
        ("train", "--preset", "tiny", "--steps", "1", "--warmup", "0"),
        ("demo",),
        ("prune", TINY, "--sparsity", "0.5"),
        ("densify", TINY),
    ],
)
def test_an_output_under_a_file(tmp_path, command):
    (tmp_path / "afile").write_text("not a directory")
    out = tmp_path / "afile" / "out"
    r = run(*command, "-o", out)
    assert r.exit_code == 1 and "Traceback" not in r.output, r.output
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and str(out) in lines[0], r.stderr
    assert "is a file, not a directory" in lines[0] or "Not a directory" in lines[0], lines[0]


def test_removing_a_missing_temporary_on_a_read_only_disk_is_not_an_error(tmp_path, monkeypatch):
    from sparsetool.checkpoint.output_files import remove

    def unlink(path, *a, **kw):  # what a read-only filesystem answers, the file there or not
        raise OSError(errno.EROFS, os.strerror(errno.EROFS), os.fsdecode(path))

    monkeypatch.setattr(os, "unlink", unlink)
    remove(tmp_path / "never-made")


# ----------------------------------------------------------------------------- eval: results first
@pytest.mark.parametrize("as_json", [False, True])
def test_eval_prints_its_results_before_a_plot_that_fails(tiny_run, tmp_path, monkeypatch, as_json):
    import sparsetool.ops.eval as ops_eval
    from sparsetool.checkpoint.output_files import write_error

    def full_disk(result, out):
        raise write_error(OSError(errno.ENOSPC, os.strerror(errno.ENOSPC)), out, "--plot")

    monkeypatch.setattr(ops_eval, "plot_eval", full_disk)
    png = tmp_path / "ppl.png"
    r = run(
        "eval", tiny_run, "--max-tokens", "300", "--plot", png, *(["--json"] if as_json else [])
    )
    one_error(r, png, "ENOSPC", "--plot")
    if as_json:
        assert json.loads(r.stdout)["checkpoints"][0]["tokens"] > 0
    else:
        assert "perplexity" in r.stdout and "baseline" in r.stdout


@pytest.mark.parametrize(
    "command, module, function, printed",
    [
        (("report", TINY), "sparsetool.ops.report", "plot_report", "targeted sparsity: "),
        (("diff", TINY, TINY), "sparsetool.ops.diff", "plot_diff", "all 98,304 targeted weights"),
    ],
)
def test_report_and_diff_print_their_results_before_a_plot_that_fails(
    tmp_path, monkeypatch, command, module, function, printed
):
    import importlib

    from sparsetool.checkpoint.output_files import write_error

    def full_disk(result, out, **kw):
        raise write_error(OSError(errno.ENOSPC, os.strerror(errno.ENOSPC)), out, "--plot")

    monkeypatch.setattr(importlib.import_module(module), function, full_disk)
    png = tmp_path / "p.png"
    r = run(*command, "--plot", png, columns=200)
    one_error(r, png, "ENOSPC", "--plot")
    assert printed in r.stdout and "plot:" not in r.stdout
    r = run(*command, "--plot", png, "--json")
    one_error(r, png, "ENOSPC", "--plot")
    assert json.loads(r.stdout)["summary"]
