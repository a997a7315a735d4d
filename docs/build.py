"""Keep the docs true to the code: the ``--help`` excerpts, the tables of contents and the shown
output of the examples are generated here, and ``--check`` says when any of them has drifted.

    python docs/build.py            rewrite what drifted, in README.md and docs/*.md
    python docs/build.py --check    change nothing; list what drifted and exit 1 if anything did
                                    (tests/test_docs.py runs this)
    python docs/build.py --slow     also run the examples marked slow (training runs, minutes)
                                    and rewrite their output

Markers in a page (HTML comments, invisible on GitHub):

    <!-- toc -->...<!-- /toc -->     the page's ## and ### headings, as links
    <!-- help: CMD -->               the next ```text block is `sparsetool CMD --help`
    <!-- example: run -->            the next ```console block is run and its output checked
    <!-- example: slow -->           run only with --slow (its output is then rewritten)
    <!-- example: not run: WHY -->   never run (a 7B model, a download, a GPU)

Every ```console block carries one of the example markers. A page's examples run in order in one
scratch directory holding copies of ``fixtures/`` and ``examples/`` (the README's set-up does the
same), so an example may use the files an earlier one on the same page wrote. ``sparsetool``
commands run in this process (plain tables, as in a pipe; 100 columns); anything else runs in
bash. A line ``...`` in a shown output stands for any number of lines.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
os.environ["COLUMNS"] = "100"  # before rich is imported: every table and note wraps alike
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # as the sparsetool command sets it
sys.path.insert(0, str(ROOT))

FENCE = re.compile(r"^```(\w*)\n(.*?)^```\n", re.S | re.M)
MARK = re.compile(r"<!-- (help|example): ([^>]*?) -->\n(?=```)")
TOC = re.compile(r"(<!-- toc -->\n)(.*?)(<!-- /toc -->)", re.S)
STDLIB = re.compile(r"/[^\s()]*/lib/python3\.\d+\b")


def pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


# --- tables of contents ------------------------------------------------------------------------


def slug(title: str) -> str:
    """GitHub's anchor for a heading."""
    t = re.sub(r"[^\w\- ]", "", title.strip().lower().replace("`", ""))
    return t.replace(" ", "-")


def toc(text: str) -> str:
    body = FENCE.sub("", text)
    lines = []
    for level, title in re.findall(r"^(##|###) (.+)$", body, re.M):
        indent = "  " if level == "###" else ""
        lines.append(f"{indent}- [{title.strip()}](#{slug(title)})")
    return "\n".join(lines) + "\n"


# --- --help excerpts ---------------------------------------------------------------------------


def help_text(command: str) -> str:
    from typer.testing import CliRunner

    from sparsetool.cli.main import app

    args = [*command.split(), "--help"] if command != "sparsetool" else ["--help"]
    r = CliRunner().invoke(app, args, prog_name="sparsetool", env={"COLUMNS": "100"})
    assert r.exit_code == 0, r.output
    return "\n".join(line.rstrip() for line in r.output.strip("\n").splitlines()) + "\n"


# --- examples ----------------------------------------------------------------------------------


def split_pipe(line: str) -> tuple[str, str]:
    """``cmd | rest`` -> (cmd, rest) at the first ``|`` outside quotes."""
    quote = None
    for i, ch in enumerate(line):
        if quote:
            quote = None if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch == "|":
            return line[:i].strip(), line[i + 1 :].strip()
    return line.strip(), ""


class Shell:
    """Runs one page's example lines in a scratch directory."""

    def __init__(self, cwd: Path):
        self.cwd = cwd
        self.code = 0

    def sparsetool(self, argv: list[str]):
        from typer.testing import CliRunner

        from sparsetool.cli.main import app

        old = Path.cwd()
        os.chdir(self.cwd)
        try:
            return CliRunner().invoke(app, argv, prog_name="sparsetool")
        finally:
            os.chdir(old)

    def run(self, line: str) -> str:
        if line == "echo $?":
            return f"{self.code}\n"
        cmd, rest = split_pipe(line)
        words = shlex.split(cmd, comments=True)
        if words and words[0] == "sparsetool":
            r = self.sparsetool(words[1:])
            self.code = r.exit_code
            if r.exception and not isinstance(r.exception, SystemExit):
                raise RuntimeError(f"{line}: {r.exception!r}") from r.exception
            if not rest:
                return r.output
            p = subprocess.run(
                ["bash", "-c", rest], input=r.stdout, cwd=self.cwd, text=True, capture_output=True
            )
            return r.stderr + p.stdout + p.stderr
        p = subprocess.run(["bash", "-c", line], cwd=self.cwd, text=True, capture_output=True)
        self.code = p.returncode
        return p.stdout + p.stderr


def parse_console(block: str) -> list[tuple[str, str]]:
    """[(command, shown output)] of a console block."""
    steps: list[tuple[str, list[str]]] = []
    for line in block.splitlines():
        if line.startswith("$ "):
            steps.append((line[2:], []))
        elif steps:
            steps[-1][1].append(line)
    return [(c, "\n".join(out) + "\n" if out else "") for c, out in steps]


def normal(text: str) -> str:
    text = STDLIB.sub("STDLIB", text)
    return "\n".join(line.rstrip() for line in text.strip("\n").splitlines())


def matches(shown: str, got: str) -> bool:
    """``shown`` equals ``got``, a line ``...`` standing for any number of lines."""
    parts = [
        re.escape(line) if line != "..." else r"(?:[^\n]*\n)*?"
        for line in normal(shown).split("\n")
    ]
    pattern = "".join(p if p.startswith("(?:") else p + r"\n" for p in parts)
    return re.fullmatch(pattern, normal(got) + "\n") is not None


def render_console(steps: list[tuple[str, str]]) -> str:
    out = []
    for cmd, shown in steps:
        out.append(f"$ {cmd}\n")
        text = "\n".join(line.rstrip() for line in shown.strip("\n").splitlines())
        out.append(text + "\n" if text else "")
    return "".join(out)


# --- one page ----------------------------------------------------------------------------------


def build_page(path: Path, slow: bool, log: list[str]) -> str:
    text = path.read_text()
    rel = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
    m = TOC.search(text)
    if m:
        text = text[: m.start(2)] + toc(text) + text[m.end(2) :]
    scratch = None
    pieces, pos = [], 0
    for fence in FENCE.finditer(text):
        mark = None
        for m2 in MARK.finditer(text, max(0, fence.start() - 300), fence.start() + 3):
            mark = m2 if m2.end() == fence.start() else mark
        lang, body = fence.group(1), fence.group(2)
        line_no = text.count("\n", 0, fence.start()) + 1
        new_body = body
        if lang == "console" and not mark:
            log.append(
                f"{rel}:{line_no}: a console block without <!-- example: run|slow|not run: WHY -->"
            )
        elif mark and mark.group(1) == "help":
            new_body = help_text(mark.group(2).strip())
        elif mark and mark.group(1) == "example":
            kind = mark.group(2).strip()
            if kind not in ("run", "slow") and not kind.startswith("not run: "):
                log.append(f"{rel}:{line_no}: unknown example marker {kind!r}")
            elif kind == "run" or (kind == "slow" and slow):
                missing = _missing_programs(body)
                if missing:
                    print(f"{rel}:{line_no}: skipped: {', '.join(missing)} not installed")
                    pieces.append(text[pos : fence.start(2)] + body)
                    pos = fence.end(2)
                    continue
                if scratch is None:
                    scratch = Path(tempfile.mkdtemp(prefix="sparsetool-docs-"))
                    for d in ("fixtures", "examples"):
                        shutil.copytree(ROOT / d, scratch / d)
                shell = Shell(scratch)
                steps = []
                for cmd, shown in parse_console(body):
                    got = shell.run(cmd)
                    if matches(shown, got):
                        steps.append((cmd, shown))
                    else:
                        log.append(f"{rel}:{line_no}: the output of `{cmd}` changed")
                        steps.append((cmd, STDLIB.sub(_stdlib_shown(shown), got)))
                new_body = render_console(steps)
        pieces.append(text[pos : fence.start(2)] + new_body)
        pos = fence.end(2)
        if new_body != body and mark and mark.group(1) == "help":
            log.append(f"{rel}:{line_no}: `sparsetool {mark.group(2).strip()} --help` changed")
    pieces.append(text[pos:])
    if scratch is not None:
        shutil.rmtree(scratch, ignore_errors=True)
    new = "".join(pieces)
    if m and toc(text) != m.group(2):
        log.append(f"{rel}: table of contents changed")
    return new


def _missing_programs(block: str) -> list[str]:
    """Programs a block pipes into that this machine lacks (jq, say)."""
    wanted = {
        seg.split()[0]
        for cmd, _ in parse_console(block)
        for seg in cmd.split("|")[1:]
        if seg.split()
    }
    return sorted(w for w in wanted if w.isidentifier() and shutil.which(w) is None)


def _stdlib_shown(shown: str) -> str:
    """Keep the standard library path the docs already show, so a refresh on another machine
    does not rewrite it."""
    m = STDLIB.search(shown)
    return m.group(0) if m else _here_stdlib()


def _here_stdlib() -> str:
    import sysconfig

    return sysconfig.get_paths()["stdlib"]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="change nothing; exit 1 on drift")
    ap.add_argument("--slow", action="store_true", help="also run the examples marked slow")
    ap.add_argument("pages", nargs="*", type=Path, help="pages to build (default: all)")
    args = ap.parse_args(argv)
    log: list[str] = []
    for path in [p.resolve() for p in args.pages] or pages():
        new = build_page(path, args.slow, log)
        if not args.check and new != path.read_text():
            path.write_text(new)
    for line in log:
        print(line)
    if args.check and log:
        print("the docs drifted from the code: run `python docs/build.py` and review the diff")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
