"""The benchmarks cannot rot unseen: each of ``benchmarks/*.py`` and ``investigations/*.py`` there
imports, and every script among them (a file with a ``__main__`` block) answers ``--help``, each
in its own process; and the results' index and commands stay readable."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BENCHMARKS = ROOT / "benchmarks"
FILES = sorted([*BENCHMARKS.glob("*.py"), *BENCHMARKS.glob("investigations/*.py")])


def _env(path: Path) -> dict[str, str]:
    # a script imports its siblings as top-level modules (Python puts its folder first on sys.path)
    path = os.pathsep.join(filter(None, [str(path.parent), os.environ.get("PYTHONPATH")]))
    return {**os.environ, "PYTHONPATH": path, "HF_HUB_OFFLINE": "1"}


def _is_script(path: Path) -> bool:
    return 'if __name__ == "__main__":' in path.read_text()


def test_there_are_benchmarks_and_a_measuring_helper():
    names = {p.name for p in FILES}
    assert "measure.py" in names and sum(_is_script(p) for p in FILES) >= 10


@pytest.mark.parametrize("path", FILES, ids=lambda p: str(p.relative_to(BENCHMARKS)))
def test_every_benchmark_imports_and_answers_help(path):
    r = subprocess.run(
        [sys.executable, "-c", f"import {path.stem}"],
        cwd=ROOT,
        env=_env(path),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    if not _is_script(path):
        return
    r = subprocess.run(
        [sys.executable, str(path), "--help"],
        cwd=ROOT,
        env=_env(path),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.startswith("usage:"), r.stdout[:500]


def test_no_benchmark_reaches_into_the_tests_or_edits_sys_path():
    found = [
        p.name
        for p in FILES
        if "sys.path.insert" in p.read_text() or "sys.path.append" in p.read_text()
    ]
    assert found == []


def test_the_measuring_helper_reports_a_child_s_peak_rss_and_json():
    sys.path.insert(0, str(BENCHMARKS))
    try:
        from measure import run_measured
    finally:
        sys.path.remove(str(BENCHMARKS))
    grow = "import json; b = bytearray(64 * 2**20); b[::4096] = b'x' * len(b[::4096]); "
    m = run_measured([sys.executable, "-c", grow + "print(json.dumps({'n': len(b)}))"])
    assert m.ok and m.json() == {"n": 64 * 2**20}
    assert m.peak_rss_mib >= 64 and m.peak_rss_kib == round(m.peak_rss_mib * 1024)
    assert m.wall_s > 0 and m.cpu_s >= 0
    failed = run_measured([sys.executable, "-c", "import sys; sys.exit('error: no')"])
    assert not failed.ok and failed.json() is None and failed.error_line() == "error: no"


RESULTS = [BENCHMARKS / "RESULTS.md", BENCHMARKS / "archive" / "RESULTS-archive.md"]


def _anchor(title: str) -> str:
    """GitHub's anchor for a heading (docs/build.py's slug)."""
    return re.sub(r"[^\w\- ]", "", title.strip().lower().replace("`", "")).replace(" ", "-")


@pytest.mark.parametrize("path", RESULTS, ids=lambda p: p.name)
def test_the_results_index_lists_every_section_in_the_file_s_order(path):
    text = path.read_text()
    body = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)
    headings = re.findall(r"^## (.+)$", body, re.M)
    top = text.split("\n## ", 1)[0]
    index = re.findall(r"^- \d{4}-\d\d-\d\d: \[(.+)\]\(#([^)]+)\)$", top, re.M)
    assert len(headings) >= 3
    assert [title for title, _ in index] == headings
    assert [anchor for _, anchor in index] == [_anchor(h) for h in headings]


def test_the_results_name_their_inputs_not_a_machine_s_paths():
    text = (BENCHMARKS / "RESULTS.md").read_text()
    assert re.findall(r"(?<![\w.])/(?:work|tmp|home|root|mnt)/\S*", text) == []
    assert "| SMOLLM2 |" in text and "| HELDOUT |" in text and "| PEER_PYTHON |" in text
