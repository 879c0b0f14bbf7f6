"""The house rules of the tree, checked on every run (issue 31):

* the formatter and the linter agree with the tree (``ruff format --check``, ``ruff check``, pinned ruff);
* no import cycle between modules, and no import reaching a layer above its own (lazy imports count:
  a cycle or an upward import cannot hide inside a function);
* the runtime wing (everything a training job imports) never parses arguments, prints, draws progress or
  measures memory: only the tools wing (``energon_pack/cli``, ``energon_pack/bench``) does;
* the stress harness stays outside the installed package, and ``py.typed`` ships.
"""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "energon_pack"

#: layers bottom up (ARCHITECTURE.md): a module may import its own layer or a lower one
LAYERS = {
    "errors": 0, "records": 0, "env": 0, "packing": 0, "lazy_exports": 0, "processes": 0,
    "thd": 1, "pixels": 1, "video": 1, "storage": 1, "object_reads": 1, "object_waits": 1,
    "chat": 2,
    "energon": 3, "sft": 3,
    "qwen_vl": 4,
    "integrations": 5,
    "bench": 6,  # the tools wing: user-facing benchmarks, then the commands
    "cli": 7,
    "__init__": 8, "__main__": 8,
}  # fmt: skip
#: the tools wing: the only place that parses arguments, prints, draws progress or measures memory
TOOLS = ("cli", "bench")
FORBIDDEN_IMPORTS = {"argparse", "tqdm", "psutil"}


def _module_name(path: Path) -> str:
    parts = ("energon_pack",) + path.relative_to(PACKAGE).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def import_graph() -> dict[str, set[str]]:
    """module -> the energon_pack modules it imports anywhere in its body (``from pkg import mod`` names
    ``pkg.mod``, not ``pkg``)."""
    modules = _modules()
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        here = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = here.split(".")[: len(here.split(".")) - node.level + 1]
                    base = ".".join(anchor + ([base] if base else []))
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
            else:
                continue
            graph[name].update(t for t in targets if t in modules and t != name)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def layer_of(module: str) -> int:
    top = module.split(".")[1] if "." in module else "__init__"
    return LAYERS[top]


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    """``a -> b`` for every import of a module from a higher layer (the package's face excepted)."""
    found = []
    for module, targets in sorted(graph.items()):
        for target in sorted(targets):
            if target != "energon_pack" and layer_of(target) > layer_of(module):
                found.append(f"{module} -> {target}")
    return found


# ----------------------------------------------------------------------------- import graph
def test_the_walk_sees_lazy_and_relative_imports():
    graph = import_graph()
    assert "energon_pack.thd" in graph["energon_pack.sft.collate"]  # from ..thd import ...
    assert "energon_pack.pixels.pixel_kernels" in graph["energon_pack.pixels.backend"]  # inside a function
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert upward_imports({"energon_pack.thd": {"energon_pack.cli.main"}, "energon_pack.cli.main": set()}) == [
        "energon_pack.thd -> energon_pack.cli.main"
    ]


def test_no_import_cycle_between_modules():
    assert cycles(import_graph()) == []


def test_every_top_level_module_has_a_layer_and_no_import_reaches_up():
    graph = import_graph()
    unknown = sorted({m.split(".")[1] for m in graph if "." in m} - set(LAYERS))
    assert unknown == [], f"add {unknown} to LAYERS (and to ARCHITECTURE.md's map)"
    assert upward_imports(graph) == []


# ----------------------------------------------------------------------------- the runtime wing
def _violations(path: Path, root: Path = PACKAGE) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [f"import {a.name}" for a in node.names if a.name.split(".")[0] in FORBIDDEN_IMPORTS]
        elif (
            isinstance(node, ast.ImportFrom)
            and not node.level
            and (node.module or "").split(".")[0] in FORBIDDEN_IMPORTS
        ):
            found.append(f"from {node.module} import")
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "print":
            found.append("print()")
    return [f"{path.relative_to(root)}:{v}" for v in found]


def test_the_runtime_wing_never_parses_arguments_prints_draws_progress_or_measures_memory():
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.relative_to(PACKAGE).parts[0].removesuffix(".py") not in TOOLS:
            found += _violations(path)
    assert found == []


def test_the_check_sees_a_print_and_an_argparse(tmp_path):
    bad = tmp_path / "probe.py"
    bad.write_text("import argparse\nfrom tqdm import tqdm\n\ndef f():\n    print('x')\n")
    assert _violations(bad, tmp_path) == ["probe.py:import argparse", "probe.py:from tqdm import", "probe.py:print()"]


# ----------------------------------------------------------------------------- the package's contents
def test_the_stress_harness_and_tests_stay_outside_the_installed_package():
    assert not [p for p in PACKAGE.rglob("*.py") if "stress" in p.name]
    graph = import_graph()
    text = "\n".join(p.read_text() for p in PACKAGE.rglob("*.py"))
    assert "import harness" not in text and "from harness" not in text and "from tests" not in text
    assert all(m.startswith("energon_pack") for m in graph)


def test_py_typed_ships():
    assert (PACKAGE / "py.typed").is_file()
    assert '"py.typed"' in (ROOT / "pyproject.toml").read_text()


# ----------------------------------------------------------------------------- format and lint
def _ruff() -> list[str]:
    exe = Path(sys.executable).with_name("ruff")
    if exe.exists():
        return [str(exe)]
    found = shutil.which("ruff")
    if found is None:
        pytest.fail("ruff is not installed: `pip install -e '.[test]'` (setup.sh --test) pins it")
    return [found]


@pytest.mark.parametrize("args", [("format", "--check", "--diff"), ("check", "--no-fix")], ids=["format", "lint"])
def test_ruff_agrees_with_the_tree(args):
    proc = subprocess.run([*_ruff(), *args, "."], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-6000:]
