"""matplotlib is the ``plot`` extra: every picture sparsetool draws gets it from
``sparsetool.util.plotting.pyplot``, which turns its absence into one error line naming the
extra. Its absence is simulated in a subprocess (``sys.modules["matplotlib"] = None`` makes every
import of it raise ImportError)."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "fixtures" / "tiny-gpt2"
EXTRA = "pip install 'sparsetool[plot]'"

WITHOUT_MATPLOTLIB = "import sys; sys.modules['matplotlib'] = None\n"


def _without_matplotlib(code: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", WITHOUT_MATPLOTLIB + code],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=120,
    )


@pytest.mark.parametrize(
    "args",
    [
        ["report", str(TINY), "--plot", "r.png"],
        ["diff", str(TINY), str(TINY), "--plot", "d.png"],
        ["simulate", "--model", "gpt2-small", "--sweep", "--plot", "s.png"],
    ],
    ids=lambda a: a[0],
)
def test_a_plot_without_matplotlib_is_one_error_line_naming_the_extra(tmp_path, args):
    code = f"from sparsetool.cli.main import main; sys.argv[1:] = {args!r}; main()"
    r = _without_matplotlib(code, tmp_path)
    assert r.returncode == 1, r.stderr
    assert r.stderr.count("\n") == 1 and r.stderr.startswith("error: "), r.stderr
    assert "matplotlib" in r.stderr and EXTRA in r.stderr
    assert list(tmp_path.iterdir()) == []  # no picture, no temporary file left


def test_every_drawing_function_names_the_extra_without_matplotlib(tmp_path):
    """The pictures no CLI test above reaches: train's loss.png, the demo's bars, bench's and
    eval's figures. Each asks ``pyplot`` first, so its input does not matter here."""
    code = """
import json
from sparsetool.errors import SparsetoolError
from sparsetool.bench.plot import bench_figure
from sparsetool.hardware.plot import sweep_figure
from sparsetool.demo import plot_perplexity
from sparsetool.ops.eval import plot_eval
from sparsetool.train.runfiles import Log

messages = {}
for name, draw in [
    ("train", lambda: Log(Path("."), None).loss_figure("t")),
    ("demo", lambda: plot_perplexity({}, "p.png")),
    ("bench", lambda: bench_figure({})),
    ("simulate", lambda: sweep_figure([], "t")),
    ("eval", lambda: plot_eval(None, "e.png")),
]:
    try:
        draw()
    except SparsetoolError as e:
        messages[name] = str(e)
print(json.dumps(messages))
"""
    r = _without_matplotlib("from pathlib import Path\n" + code, tmp_path)
    assert r.returncode == 0, r.stderr
    messages = json.loads(r.stdout)
    assert sorted(messages) == ["bench", "demo", "eval", "simulate", "train"]
    for name, message in messages.items():
        assert "\n" not in message and EXTRA in message, (name, message)
    assert messages["train"].startswith("writing the run's loss.png needs matplotlib")


def _imports_matplotlib(node: ast.AST) -> bool:
    if isinstance(node, ast.Import):
        return any(a.name.split(".")[0] == "matplotlib" for a in node.names)
    return isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "matplotlib"


def test_matplotlib_is_set_up_in_one_module_and_imported_only_after_it():
    """Only ``util/plotting.py`` imports matplotlib first; any other import of it is inside a
    function, after that function called ``pyplot()``."""
    found = []
    for path in sorted((ROOT / "sparsetool").rglob("*.py")):
        rel = str(path.relative_to(ROOT))
        if rel == "sparsetool/util/plotting.py":
            continue
        tree = ast.parse(path.read_text())
        found += [f"{rel}:{n.lineno} (top level)" for n in tree.body if _imports_matplotlib(n)]
        for fn in ast.walk(tree):
            if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            calls = [
                n.lineno
                for n in ast.walk(fn)
                if isinstance(n, ast.Call) and getattr(n.func, "id", None) == "pyplot"
            ]
            for n in ast.walk(fn):
                if _imports_matplotlib(n) and not any(line < n.lineno for line in calls):
                    found.append(f"{rel}:{n.lineno} before pyplot()")
    assert found == []
