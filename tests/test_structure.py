"""The package's boundaries, checked: each package imports only the packages docs/ARCHITECTURE.md
lists for it, every exported name resolves, no private name crosses a module (nor, in train and
checkpoint, a private attribute), no import circle, one prune pipeline (plan, then write) with
declared planners, and a top level that is only the public surface. Every module is parsed once
(``_tree``)."""

from __future__ import annotations

import ast
import builtins
import functools
import importlib
import pkgutil
import re
import subprocess
import sys
from pathlib import Path

import pytest

import sparsetool

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "sparsetool"
TINY = ROOT / "fixtures" / "tiny-gpt2"


def _modules() -> dict[str, Path]:
    out = {}
    for p in sorted(PACKAGE.rglob("*.py")):
        parts = list(p.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = p
    return out


MODULES = _modules()


@functools.cache
def _tree(path: Path) -> ast.Module:
    """A file's syntax tree, parsed once for all the tests of this module."""
    return ast.parse(path.read_text())


def _package_of(module: str, path: Path) -> str:
    return module if path.name == "__init__.py" else module.rpartition(".")[0]


@functools.cache
def _imports(module: str, path: Path, *, everywhere: bool) -> tuple[tuple[int, str, str], ...]:
    """(line, imported module or package, imported name or "") of each sparsetool import."""
    tree = _tree(path)
    pkg = _package_of(module, path)
    found = []
    for node in ast.walk(tree) if everywhere else tree.body:
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = pkg.split(".")[: len(pkg.split(".")) - node.level + 1]
                base = ".".join(parts + ([base] if base else []))
            if base.split(".")[0] == "sparsetool":
                found += [(node.lineno, base, a.name) for a in node.names]
        elif isinstance(node, ast.Import):
            found += [
                (node.lineno, a.name, "")
                for a in node.names
                if a.name.split(".")[0] == "sparsetool"
            ]
    return tuple(found)


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def test_no_private_name_is_imported_across_modules():
    """``from m import _x`` or ``m._x`` with m another sparsetool module: none. A private module
    (``cli/_params.py``) may be imported inside its own package only."""
    crossings = []
    for module, path in MODULES.items():
        aliases = {}
        for line, base, name in _imports(module, path, everywhere=True):
            full = f"{base}.{name}" if name else base
            if full in MODULES:  # a module imported by name
                aliases[name or base] = full
                home = full.rpartition(".")[0]
                if _private(full.rpartition(".")[2]) and not (module + ".").startswith(home + "."):
                    crossings.append(f"{module}:{line} imports private module {full}")
            elif _private(name) and base != module:
                crossings.append(f"{module}:{line} from {base} import {name}")
        for node in ast.walk(_tree(path)):
            if isinstance(node, ast.Attribute) and _private(node.attr):
                chain, value = [], node.value
                while isinstance(value, ast.Attribute):
                    chain.append(value.attr)
                    value = value.value
                if isinstance(value, ast.Name) and value.id in aliases:
                    target = ".".join([aliases[value.id], *reversed(chain)])
                    if target in MODULES and target != module:
                        crossings.append(f"{module}:{node.lineno} uses {target}.{node.attr}")
    assert not crossings, "\n".join(crossings)


# Where a private attribute of an object is read only by the module that defines it (the run
# directory reads the trainer's public state; the writer asks a checkpoint for a shard's file).
OWN_ATTRIBUTES_ONLY = ("sparsetool.train", "sparsetool.checkpoint")
# Public functions of the standard library whose names begin with an underscore: os._exit ends
# the process from the thread that counts a training run's signals (train/signals.py).
STANDARD_UNDERSCORED = {"os._exit"}


def _private_attributes_defined(tree: ast.AST) -> set[str]:
    """The private names a module defines: functions, classes, assigned names and attributes."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            names.add(node.attr)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
    return {n for n in names if _private(n)}


def test_no_module_reads_a_private_attribute_another_module_defines():
    """``obj._x`` (obj not ``self`` or ``cls``) only where ``_x`` is defined in the same module, in
    the parts listed above. By name: it cannot tell two classes' ``_x`` apart in one module."""
    reaches = []
    for module, path in MODULES.items():
        if not module.startswith(OWN_ATTRIBUTES_ONLY):
            continue
        tree = _tree(path)
        own = _private_attributes_defined(tree)
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Attribute)
                and _private(node.attr)
                and node.attr not in own
                and not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"))
                and ast.unparse(node) not in STANDARD_UNDERSCORED
            ):
                reaches.append(f"{module}:{node.lineno} reads {ast.unparse(node)}")
    assert not reaches, "\n".join(reaches)


def _cycles(everywhere: bool) -> list[list[str]]:
    graph = {}
    for module, path in MODULES.items():
        deps = set()
        for _line, base, name in _imports(module, path, everywhere=everywhere):
            full = f"{base}.{name}" if name else base
            deps.add(full if full in MODULES else base)
        # importing a submodule imports its packages anyway: those edges are not circles
        graph[module] = {
            d for d in deps if d in MODULES and d != module and not module.startswith(d + ".")
        }
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles = []

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                cycles.append(sorted(comp))

    for v in graph:
        if v not in index:
            visit(v)
    return cycles


def test_no_import_circle_even_through_imports_inside_functions():
    """e.g. checkpoint.encodings <-> checkpoint.reader: the reader returns stored tensors and
    decoding lives with encoding."""
    assert _cycles(everywhere=True) == []


def test_ops_and_train_meet_only_in_models():
    """A checkpoint as a runnable model lives in ``models``, which ops and train both use: ops
    never imports train, train never imports ops, and models imports neither, even inside
    functions. What chains the two (``sparsetool demo``: training, eval, diff, report, flops) is
    ``sparsetool/demo.py``, a top-level module above both, as ``api.py`` is."""

    def part(module: str) -> str:
        return ".".join(module.split(".")[:2])

    forbidden = {
        "sparsetool.ops": {"sparsetool.train"},
        "sparsetool.train": {"sparsetool.ops"},
        "sparsetool.models": {"sparsetool.ops", "sparsetool.train"},
    }
    crossings = []
    for module, path in MODULES.items():
        for line, base, name in _imports(module, path, everywhere=True):
            full = f"{base}.{name}" if name else base
            target = part(full if full in MODULES else base)
            if target in forbidden.get(part(module), ()):
                crossings.append(f"{module}:{line} imports {full}")
    assert not crossings, "\n".join(crossings)


def test_prune_and_shrink_are_peers_on_one_calibration_pass():
    """Neither of ops/prune and ops/shrink imports the other (inside functions too): what both
    need (the text's options, the windows, the block iterator, the pass's memory, experts'
    routing) is ops/calibration.py's, which imports neither."""
    peers = {"sparsetool.ops.prune", "sparsetool.ops.shrink"}

    def peer(module: str) -> str | None:
        return next((p for p in peers if module == p or module.startswith(p + ".")), None)

    crossings = []
    for module, path in MODULES.items():
        own = peer(module)
        if own is None and module != "sparsetool.ops.calibration":
            continue
        for line, base, _name in _imports(module, path, everywhere=True):
            target = peer(base)
            if target is not None and target != own:
                crossings.append(f"{module}:{line} imports {base}")
    assert not crossings, "\n".join(crossings)


# docs/ARCHITECTURE.md's package table, its "imports" column: each part of sparsetool imports only
# these parts (inside functions too). "sparsetool" is the package face (cli: its __version__). The
# top-level modules api.py and demo.py are parts of their own: only the face imports api, only cli
# imports demo, and neither imports cli.
LAYERS = {
    "cli": {"ops", "train", "bench", "hardware", "models", "flops", "checkpoint", "masks", "util"}
    | {"errors", "sparsetool", "demo"},
    "api": {"ops", "hardware", "util", "errors"},
    "demo": {"ops", "train", "flops", "checkpoint", "util", "errors"},
    "ops": {"models", "checkpoint", "masks", "targets", "flops", "util", "errors"},
    "train": {"models", "checkpoint", "masks", "targets", "util", "errors"},
    "bench": {"hardware", "ops", "models", "checkpoint", "targets", "util", "errors"},
    "hardware": {"flops", "checkpoint", "targets", "util", "errors"},
    "models": {"targets", "checkpoint", "util", "errors"},
    "flops": {"targets", "checkpoint", "util", "errors"},
    "targets": {"checkpoint", "util", "errors"},
    "checkpoint": {"util", "errors"},
    "masks": {"util", "errors"},
    "util": {"errors"},
    "errors": set(),
}
# The table's narrower entries, (importing part, imported part) -> the one module on either side
# allowed: bench reaches ops' plots.py and models' open.py.
ONLY_THROUGH = {
    ("bench", "ops"): ("imported", "sparsetool.ops.plots"),
    ("bench", "models"): ("imported", "sparsetool.models.open"),
}


def _part(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def test_each_package_imports_only_the_packages_the_architecture_lists():
    crossings = []
    for module, path in MODULES.items():
        if module in ("sparsetool", "sparsetool.__main__"):  # the face and `python -m`
            continue
        part = _part(module)
        for line, base, name in _imports(module, path, everywhere=True):
            full = f"{base}.{name}" if f"{base}.{name}" in MODULES else base
            target = _part(full)
            if target == part:
                continue
            side, only = ONLY_THROUGH.get((part, target), (None, None))
            if target not in LAYERS[part]:
                crossings.append(f"{module}:{line} imports {full} ({part} -> {target})")
            elif side == "imported" and not (full + ".").startswith(only + "."):
                crossings.append(f"{module}:{line} imports {full} ({part} reaches only {only})")
    assert not crossings, "\n".join(crossings)


def test_the_architecture_table_states_the_layers_checked_here():
    """The table in docs/ARCHITECTURE.md and LAYERS above agree: every part, every package in its
    "imports" column, and the narrower entries naming their module."""
    doc = (ROOT / "docs" / "ARCHITECTURE.md").read_text()
    table = doc.split("| part | what it holds | imports |", 1)[1].split("\n\n", 1)[0]
    stated = {}
    for row in table.strip().splitlines()[1:]:
        cells = [c.strip() for c in row.strip().strip("|").split("|")]
        part = cells[0].strip("`").removesuffix("/").removesuffix(".py")
        imports = cells[-1].replace("`sparsetool.__version__`", "sparsetool")
        names = re.sub(r"\([^)]*\)", "", imports)
        stated[part] = {n.strip() for n in re.split(r"[,;]", names) if n.strip() not in ("", "-")}
        for (importer, imported), (_side, only) in ONLY_THROUGH.items():
            if importer == part:
                file = only.rpartition(".")[2] + ".py"
                assert f"{imported} (`{file}`" in imports, (part, imported, file)
    assert stated == LAYERS


def test_every_name_in_every___all___resolves():
    checked = []
    for info in pkgutil.walk_packages(sparsetool.__path__, "sparsetool."):
        if info.name.endswith("__main__"):
            continue
        module = importlib.import_module(info.name)
        for name in getattr(module, "__all__", ()):
            getattr(module, name)  # a lazy table naming a missing module raises here
            checked.append(f"{info.name}.{name}")
    for name in sparsetool.__all__:
        getattr(sparsetool, name)
    assert "sparsetool.checkpoint.decode" in checked and len(checked) > 300


def test_checkpoint_reader_returns_stored_tensors_and_encodings_decode():
    """Decoding lives with encoding: the reader hands out tensors as stored and never imports the
    encodings; ``checkpoint.encodings.decode`` turns them into dense tensors and masks."""
    from sparsetool.checkpoint import decode, open_checkpoint

    reader = "sparsetool.checkpoint.reader"
    reached = {
        f"{base}.{name}" if f"{base}.{name}" in MODULES else base
        for _line, base, name in _imports(reader, MODULES[reader], everywhere=True)
    }
    assert "sparsetool.checkpoint.encodings" not in reached, reached
    with open_checkpoint(TINY) as ck:
        lt = ck.logical[0]
        dense, mask = decode(ck, lt)
        assert mask is None and dense.equal(ck.read_stored(lt.stored[0]))


def test_import_star_leaves_the_builtin_eval_alone():
    scope: dict = {}
    exec("from sparsetool import *", scope)
    assert "eval" not in scope and "prune" in scope and "load" in scope
    assert sparsetool.eval.__module__ == "sparsetool.api" and builtins.eval("1 + 1") == 2


def test_the_top_level_is_the_public_surface():
    top = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert top == ["__init__.py", "__main__.py", "api.py", "demo.py", "errors.py"]
    helpers = sorted(p.stem for p in (PACKAGE / "util").glob("*.py") if p.stem != "__init__")
    assert {"options", "configfile", "wording", "workers", "memory", "progress"} <= set(helpers)


def test_the_util_helpers_import_without_torch():
    code = (
        "import sys; import sparsetool.util.options, sparsetool.util.configfile, "
        "sparsetool.util.wording, sparsetool.util.workers, sparsetool.util.memory, "
        "sparsetool.util.progress, sparsetool.util.corpus, sparsetool.checkpoint.reader, "
        "sparsetool.checkpoint.counting, sparsetool.models; "
        "print('torch' in sys.modules)"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert r.stdout.strip() == "False", r.stderr


def _top_level_definitions(name: str) -> list[str]:
    where = []
    for module, path in MODULES.items():
        for node in _tree(path).body:
            targets = (
                node.targets
                if isinstance(node, ast.Assign)
                else [node]
                if isinstance(node, (ast.FunctionDef, ast.ClassDef))
                else []
            )
            if any(getattr(t, "id", getattr(t, "name", None)) == name for t in targets):
                where.append(module)
    return where


def test_one_progress_type():
    """Progress callbacks have one type (docs/ARCHITECTURE.md: one implementation each)."""
    assert _top_level_definitions("Progress") == ["sparsetool.util.progress"]


# ------------------------------------------------------------------------ the prune pipeline


def test_planners_declare_the_protocol_of_their_write_order(tmp_path):
    from sparsetool.ops.prune import PruneOptions, plan_prune
    from sparsetool.ops.prune.calibrated import CalibratedPlanner
    from sparsetool.ops.prune.magnitude import MagnitudePlanner
    from sparsetool.ops.prune.planner import BlockOrderPlanner, FileOrderPlanner

    plan = plan_prune(TINY, PruneOptions(sparsity=0.5))
    assert isinstance(plan.planner, MagnitudePlanner)
    assert isinstance(plan.planner, FileOrderPlanner) and not isinstance(
        plan.planner, BlockOrderPlanner
    )
    opts = PruneOptions(sparsity=0.5, method="wanda", calibration=str(tmp_path / "t.txt"))
    calibrated = CalibratedPlanner(plan.ckpt, plan.targets, opts, plan.targeting)
    assert isinstance(calibrated, BlockOrderPlanner) and not isinstance(
        calibrated, FileOrderPlanner
    )


@pytest.mark.parametrize(
    "opts",
    [
        dict(sparsity=0.6),
        dict(sparsity=0.6, scope="global"),
        dict(fraction=0.5, encoding="bitmask"),
    ],
)
def test_prune_checkpoint_is_plan_then_write(tmp_path, opts):
    from sparsetool.ops.prune import PruneOptions, plan_prune, prune_checkpoint, write_pruned

    whole = prune_checkpoint(TINY, tmp_path / "whole", PruneOptions(**opts))
    plan = plan_prune(TINY, PruneOptions(**opts))
    assert plan.targets and plan.planner.nonzero_after is not None
    parts = write_pruned(plan, tmp_path / "parts")
    assert parts.to_json()["tensors"] == whole.to_json()["tensors"]
    for f in sorted((tmp_path / "whole").iterdir()):
        assert f.read_bytes() == (tmp_path / "parts" / f.name).read_bytes(), f.name


def test_the_prune_pipeline_has_no_type_ignore():
    files = [
        *sorted((PACKAGE / "ops" / "prune").glob("*.py")),
        *sorted((PACKAGE / "masks").glob("*.py")),
    ]
    flagged = [
        f"{p.relative_to(ROOT)}:{i}"
        for p in files
        for i, line in enumerate(p.read_text().splitlines(), 1)
        if "type: ignore" in line
    ]
    assert not flagged, flagged


# ------------------------------------------------------------------------ the linter


def test_ruff_is_configured_and_installed_with_the_tests():
    """Lines of 100, imports sorted; the test extra brings ruff, so test_ruff_check_is_clean runs
    wherever the tests do."""
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert project["tool"]["ruff"]["line-length"] == 100
    assert "I" in project["tool"]["ruff"]["lint"]["select"]  # import sorting
    assert any(d.startswith("ruff") for d in project["project"]["optional-dependencies"]["test"])


def _ruff() -> str:
    import shutil

    ruff = shutil.which("ruff", path=str(Path(sys.executable).parent)) or shutil.which("ruff")
    if ruff is None:
        pytest.skip("ruff is not installed (pip install -e '.[test]' brings it)")
    return ruff


def test_ruff_check_is_clean():
    r = subprocess.run(
        [_ruff(), "check", "--no-cache", "."], capture_output=True, text=True, cwd=ROOT
    )
    assert r.returncode == 0, r.stdout + r.stderr


# The files pyproject.toml still exempts from E501 (lines over 100) may only get fewer: lower this
# when a file leaves the list, never raise it.
LONG_LINE_FILES_AT_MOST = 0


def test_the_long_line_exemptions_only_shrink():
    """E501 is on everywhere but in the files pyproject.toml lists one by one (ruff check . fails
    on a long line anywhere else); each listed file still has a line over 100, so a file wrapped
    to 100 must leave the list, and the list is no longer than it was."""
    import tomllib

    lint = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["ruff"]["lint"]
    assert "E501" not in lint.get("ignore", []) + lint.get("extend-ignore", [])
    listed = [f for f, codes in lint["per-file-ignores"].items() if "E501" in codes]
    assert [f for f in listed if not (ROOT / f).is_file()] == []  # paths, not patterns
    assert len(listed) <= LONG_LINE_FILES_AT_MOST
    r = subprocess.run(
        [
            _ruff(),
            "check",
            "--no-cache",
            "--select",
            "E501",
            "--config",
            "lint.per-file-ignores = {}",
            "--output-format",
            "concise",
            *listed,
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    long = {line.split(":")[0] for line in r.stdout.splitlines() if ": E501 " in line}
    assert [f for f in listed if f not in long] == [], "no line over 100 left: take it off the list"


# ------------------------------------------------------------------------ names and their homes


def _defined(path: Path) -> set[str]:
    """The names a module defines at its top level, or imports from outside sparsetool (the one
    module that wraps a library, ``cli/_click.py``, is their home here); not those it imports
    from other sparsetool modules."""
    names = set()
    for node in _tree(path).body:
        if (
            isinstance(node, ast.ImportFrom)
            and not node.level
            and node.module.split(".")[0] != "sparsetool"
        ):
            names |= {a.asname or a.name for a in node.names}
        for sub in ast.walk(node) if isinstance(node, (ast.If, ast.Try)) else [node]:
            if isinstance(sub, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(sub.name)
            elif isinstance(sub, (ast.Assign, ast.AnnAssign)):
                for target in sub.targets if isinstance(sub, ast.Assign) else [sub.target]:
                    names |= {n.id for n in ast.walk(target) if isinstance(n, ast.Name)}
    return names


def _exported(path: Path) -> list[str]:
    for node in _tree(path).body:
        if (
            isinstance(node, ast.Assign)
            and any(getattr(t, "id", "") == "__all__" for t in node.targets)
            and isinstance(node.value, ast.List)
        ):
            return [e.value for e in node.value.elts if isinstance(e, ast.Constant)]
    return []


def test_names_are_imported_from_the_module_that_defines_them():
    """Only a package's ``__init__.py`` (its face) and ``api.py`` hand out names defined in other
    sparsetool modules: a plain module's ``__all__`` lists what it defines, and ``from m import x``
    names the module defining ``x``, in the package and in the tests alike."""
    plain = {m: p for m, p in MODULES.items() if p.name != "__init__.py" and m != "sparsetool.api"}
    defined = {m: _defined(p) for m, p in plain.items()}
    found = [
        f"{m}.__all__ lists {n}, defined elsewhere"
        for m, p in plain.items()
        for n in _exported(p)
        if n not in defined[m]
    ]
    files = {**MODULES, **{str(p.relative_to(ROOT)): p for p in (ROOT / "tests").rglob("*.py")}}
    for module, path in files.items():
        for line, base, name in _imports(module, path, everywhere=True):
            if (
                base in plain
                and name
                and f"{base}.{name}" not in MODULES
                and name not in defined[base]
            ):
                found.append(
                    f"{module}:{line} imports {name} from {base}, which does not define it"
                )
    assert not found, "\n".join(found)


def test_every_package_face_loads_its_names_through_one_helper():
    """``sparsetool.util.lazy.lazy_names`` makes every lazy face's ``__getattr__``/``__dir__``."""
    faces = [p for p in PACKAGE.rglob("__init__.py") if "__getattr__" in p.read_text()]
    own = [
        str(p.relative_to(ROOT))
        for p in faces
        if any(
            isinstance(n, ast.FunctionDef) and n.name in ("__getattr__", "__dir__")
            for n in _tree(p).body
        )
    ]
    assert not own, own
    assert {p.parent.name for p in faces} >= {
        "sparsetool",
        "checkpoint",
        "flops",
        "masks",
        "hardware",
    }
    assert all("lazy_names(__name__, _WHERE)" in p.read_text() for p in faces)


ENCODING_NAMES = {"zeros", "mask", "nan", "bitmask"}


def test_nothing_outside_checkpoint_compares_encoding_names():
    """What callers branch on is a property of the encoding's record
    (``sparsetool.checkpoint.codecs.Codec``: ``streamed``, ``kept_counts_in_header``,
    ``nan_sentinel``, ``compressed``, ...), never ``encoding == "bitmask"``."""
    found = []
    for module, path in MODULES.items():
        if module.startswith("sparsetool.checkpoint"):
            continue
        for node in ast.walk(_tree(path)):
            if not isinstance(node, ast.Compare):
                continue
            for side in (node.left, *node.comparators):
                items = side.elts if isinstance(side, (ast.Tuple, ast.List, ast.Set)) else [side]
                if any(isinstance(i, ast.Constant) and i.value in ENCODING_NAMES for i in items):
                    found.append(f"{module}:{node.lineno}")
    assert not found, found


def test_typer_private_click_is_imported_in_one_module():
    """typer keeps its vendored click private (``typer._click``); pyproject pins the tested typer
    and only ``cli/_click.py`` reaches into it."""
    found = []
    for module, path in MODULES.items():
        for node in ast.walk(_tree(path)):
            names = (
                [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else []
            )
            if any(n == "typer._click" or n.startswith("typer._click.") for n in names):
                found.append(module)
    assert sorted(set(found)) == ["sparsetool.cli._click"]
