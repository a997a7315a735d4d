"""pyproject.toml's requirements, checked against the code and against constraints.txt: every
third-party package sparsetool imports is a dependency or in an extra, and every dependency is
imported; the tests import only what the test extra brings; constraints.txt pins each requirement
to a version inside its range; CI and the README install the torch it pins."""

from __future__ import annotations

import ast
import importlib.metadata
import re
import sys
import tomllib
from pathlib import Path

from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[1]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
RUNTIME = [Requirement(r) for r in PROJECT["dependencies"]]
EXTRAS = {
    name: [Requirement(r) for r in reqs] for name, reqs in PROJECT["optional-dependencies"].items()
}


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _names(reqs: list[Requirement]) -> set[str]:
    return {_norm(r.name) for r in reqs if _norm(r.name) != "sparsetool"}


def _with_own_extras(extra: str) -> set[str]:
    """The packages an extra installs by name, its ``sparsetool[...]`` extras' included."""
    names = _names(EXTRAS[extra])
    for r in EXTRAS[extra]:
        if _norm(r.name) == "sparsetool":
            for inner in r.extras:
                names |= _with_own_extras(inner)
    return names


def _third_party_imports(root: Path) -> dict[str, str]:
    """Top-level module -> one file importing it, stdlib and relative imports left out."""
    found: dict[str, str] = {}
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                modules = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
                modules = [node.module]
            else:
                continue
            for m in modules:
                top = m.split(".")[0]
                if top not in sys.stdlib_module_names and top != "sparsetool":
                    found.setdefault(top, str(path.relative_to(ROOT)))
    return found


def _distribution(module: str) -> str | None:
    dists = importlib.metadata.packages_distributions().get(module)
    return _norm(dists[0]) if dists else None


def _local(module: str) -> bool:
    """A helper module of the tests, docs or benchmarks (put on sys.path by them)."""
    return any(any((ROOT / d).rglob(f"{module}.py")) for d in ("tests", "docs", "benchmarks"))


def test_sparsetool_imports_only_what_it_declares_and_declares_only_what_it_imports():
    declared = _names(RUNTIME) | {n for extra in EXTRAS for n in _names(EXTRAS[extra])}
    imports = _third_party_imports(ROOT / "sparsetool")
    undeclared = {m: f for m, f in imports.items() if _distribution(m) not in declared}
    assert undeclared == {}
    imported = {_distribution(m) for m in imports}
    assert sorted(_names(RUNTIME) - imported) == []  # a dependency nothing imports is an extra


def test_the_tests_import_only_what_the_test_extra_installs():
    brought = _names(RUNTIME) | _with_own_extras("test")
    assert {"hf", "eval", "bench", "plot"} <= {
        e for r in EXTRAS["test"] if _norm(r.name) == "sparsetool" for e in r.extras
    }
    missing = {}
    for module, where in _third_party_imports(ROOT / "tests").items():
        dist = _distribution(module)
        if dist is None:
            # a helper module of this checkout, or a package a test checks the absence of
            # (compressed-tensors, inside try/except ImportError)
            assert _local(module) or module == "compressed_tensors", (module, where)
        elif dist not in brought:
            missing[module] = where
    assert missing == {}


def _skipped_imports(root: Path) -> list[tuple[str, str]]:
    """(module, file:line) of every ``pytest.importorskip("module")`` under ``root``."""
    found = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "importorskip"
                and node.args
                and isinstance(node.args[0], ast.Constant)
            ):
                found.append((node.args[0].value, f"{path.relative_to(root.parent)}:{node.lineno}"))
    return found


def test_no_test_skips_over_a_package_the_test_extra_installs():
    """A test extra's package missing is a broken install, not a reason to skip: such a test
    imports it plainly and fails. importorskip is for packages outside the test extra."""
    brought = _names(RUNTIME) | _with_own_extras("test")
    skipping = [
        (module, where)
        for module, where in _skipped_imports(ROOT / "tests")
        if _distribution(module.split(".")[0]) in brought
    ]
    assert skipping == []


def test_the_importorskip_check_finds_a_skip(tmp_path):
    (tmp_path / "test_x.py").write_text('import pytest\nnp = pytest.importorskip("numpy")\n')
    found = [(m, w.rsplit("/", 1)[-1]) for m, w in _skipped_imports(tmp_path)]
    assert found == [("numpy", "test_x.py:2")]


def _pins() -> dict[str, str]:
    pins = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        line = line.split("#")[0].strip()
        if line:
            name, _, version = line.partition("==")
            assert version, f"constraints.txt pins exact versions: {line!r}"
            pins[_norm(name)] = version
    return pins


def test_constraints_pin_every_requirement_inside_its_range():
    pins = _pins()
    reqs = RUNTIME + [r for extra in EXTRAS.values() for r in extra]
    outside = []
    for r in reqs:
        if _norm(r.name) == "sparsetool":
            continue
        assert _norm(r.name) in pins, f"constraints.txt does not pin {r.name}"
        if not r.specifier.contains(pins[_norm(r.name)], prereleases=True):
            outside.append(f"{r.name}=={pins[_norm(r.name)]} is outside {r}")
    assert outside == []
    # the extras state ranges: an exact pin belongs in constraints.txt
    assert [str(r) for r in reqs if any(s.operator == "==" for s in r.specifier)] == []


def test_ci_and_the_readme_install_the_pinned_torch_and_use_the_constraints():
    ci = (ROOT / ".ci" / "run").read_text()
    readme = (ROOT / "README.md").read_text()
    torch_pin = f"torch=={_pins()['torch']}"
    assert f"pip install -q {torch_pin}" in ci and f"pip install {torch_pin}" in readme
    installs = [line for line in ci.splitlines() if "-e '.[test]'" in line]
    assert installs and all("-c constraints.txt" in line for line in installs)
    # the packages installed with --no-deps are pinned alike
    pins = _pins()
    no_deps = re.findall(r"--no-deps ([^&]+)", installs[-1])[0].split()
    assert no_deps and all(pins[_norm(p.split("==")[0])] == p.split("==")[1] for p in no_deps)
