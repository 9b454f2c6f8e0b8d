"""The house rules of docs/ARCHITECTURE.md, checked on the source: which package may import
which (dependencies point inward and down), no import circle, the engine core free of
torch and plotly, module and function sizes, and a docstring on every module.

Imports are read with ``ast`` from every ``import`` statement, those inside functions
included (a lazy import is still a dependency), so nothing is executed."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("sim", "policies", "scenarios", "calibration")

#: Who may import whom, by wing (first match of the module name's prefix). The engine
#: core imports only itself; policies read the core's seams, never the engine's process;
#: the application sits on top, its runs below its reports below its commands.
WINGS = (
    ("sim.app.cli", None),
    ("sim.app.reports", ("sim.app.cli",)),
    ("sim.app.runs", ("sim.app.cli", "sim.app.reports")),
    ("sim.app", ("sim.app.cli", "sim.app.reports", "sim.app.runs")),
    ("calibration.cli", ("sim.app", "policies", "scenarios")),
    ("calibration", ("sim.app", "policies", "scenarios", "calibration.cli")),
    ("policies", ("sim.app", "scenarios", "calibration", "sim.engine", "sim.cluster",
                  "sim.simulate", "sim.fastpath")),
    ("scenarios", ("sim.app", "policies", "calibration", "sim.engine", "sim.cluster",
                   "sim.simulate")),
    ("sim", ("sim.app", "policies", "scenarios", "calibration")),
)
#: Libraries the engine core, policies and scenarios never import (calibration and the
#: reports load them lazily, where they are needed).
HEAVY = ("torch", "plotly")
MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 60


def _modules() -> dict[str, Path]:
    out: dict[str, Path] = {}
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            out[name] = path
    return out


MODULES = _modules()


def _imports(path: Path, name: str) -> Iterator[str]:
    """Every module name ``path`` imports (absolute, resolved for relative imports)."""
    is_pkg = path.name == "__init__.py"
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            yield from (a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = name.split(".")
                anchor = anchor[: len(anchor) - node.level + (1 if is_pkg else 0)]
                base = ".".join([*anchor, base] if base else anchor)
            yield base
            # `from package import module` imports the module too.
            yield from (f"{base}.{a.name}" for a in node.names if f"{base}.{a.name}" in MODULES)


def _project_imports(name: str) -> set[str]:
    deps = set()
    for imp in _imports(MODULES[name], name):
        while imp and imp not in MODULES:
            imp = imp.rpartition(".")[0]
        if imp and imp != name:
            deps.add(imp)
    return deps


GRAPH = {name: _project_imports(name) for name in MODULES}


def _wing(name: str) -> tuple[str, tuple[str, ...] | None]:
    for prefix, banned in WINGS:
        if name == prefix or name.startswith(prefix + "."):
            return prefix, banned
    raise AssertionError(f"{name} belongs to no wing")


def _under(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def test_imports_point_inward_and_down() -> None:
    wrong = []
    for name, deps in GRAPH.items():
        wing, banned = _wing(name)
        for dep in deps:
            if banned and any(_under(dep, b) and not _under(dep, wing) for b in banned):
                wrong.append(f"{name} -> {dep}")
    assert not wrong, "imports against the layering:\n" + "\n".join(sorted(wrong))


def test_no_import_circle() -> None:
    """Tarjan's strongly connected components: every one must be a single module
    (package __init__ files re-exporting their own modules aside)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles: list[list[str]] = []

    def edges(v: str) -> list[str]:
        # A package's __init__ importing its own submodules is not a circle.
        return sorted(d for d in GRAPH[v] if not _under(d, v))

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges(v):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                circles.append(sorted(comp))

    for v in sorted(GRAPH):
        if v not in index:
            visit(v)
    assert not circles, f"import circles: {circles}"


@pytest.mark.parametrize("wing", ["sim", "policies", "scenarios"])
def test_core_never_imports_torch_or_plotly(wing: str) -> None:
    bad = [f"{name} -> {imp}" for name, path in MODULES.items()
           if _under(name, wing) and not _under(name, "sim.app")
           for imp in _imports(path, name) if imp.split(".")[0] in HEAVY]
    assert not bad, bad


def _functions(tree: ast.AST) -> Iterator[ast.FunctionDef | ast.AsyncFunctionDef]:
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield node


def _is_command(name: str) -> bool:
    return _under(name, "sim.app.cli") or name == "calibration.cli"


def test_sizes() -> None:
    """Modules of at most 400 lines; functions of at most 60, counted from the first
    statement of the body for the CLI commands (their option declarations apart)."""
    long = []
    for name, path in MODULES.items():
        text = path.read_text()
        if text.count("\n") > MAX_MODULE_LINES:
            long.append(f"{name}: {text.count(chr(10))} lines")
        for fn in _functions(ast.parse(text)):
            first = fn.body[0].lineno if _is_command(name) else fn.lineno
            n = (fn.end_lineno or first) - first + 1
            if n > MAX_FUNCTION_LINES:
                long.append(f"{name}.{fn.name}: {n} lines")
    assert not long, "\n".join(long)


def test_every_module_says_what_it_owns() -> None:
    missing = [name for name, path in MODULES.items()
               if path.stat().st_size and not ast.get_docstring(ast.parse(path.read_text()))]
    assert not missing, missing


def _written_dataclass_inits(tree: ast.Module) -> Iterator[tuple[ast.ClassDef,
                                                                  ast.FunctionDef]]:
    """(class, its own __init__) for every @dataclass class that writes its __init__."""
    for cls in ast.walk(tree):
        if not isinstance(cls, ast.ClassDef) or not any(
                "dataclass" in ast.unparse(d) for d in cls.decorator_list):
            continue
        for fn in cls.body:
            if isinstance(fn, ast.FunctionDef) and fn.name == "__init__":
                yield cls, fn


def _init_mismatches(cls: ast.ClassDef, init: ast.FunctionDef) -> list[str]:
    """How a written dataclass __init__ differs from the one dataclasses would make: its
    parameters are the init fields, in order, with the same defaults (None standing for
    a default_factory), and it assigns every field; the decorator says init=False (else
    dataclasses would still make its own, one exec, and throw it away)."""
    fields = [(f.target.id, f.value) for f in cls.body
              if isinstance(f, ast.AnnAssign) and isinstance(f.target, ast.Name)
              and "ClassVar" not in ast.unparse(f.annotation)]
    wanted = []
    for name, value in fields:
        text = ast.unparse(value) if value is not None else None
        if text is not None and text.startswith("field("):
            if "init=False" in text:
                continue
            text = "None" if "default_factory" in text else text
        wanted.append((name, text))
    args = init.args.args[1:]
    defaults = [None] * (len(args) - len(init.args.defaults)) + [
        ast.unparse(d) for d in init.args.defaults]
    got = [(a.arg, d) for a, d in zip(args, defaults, strict=True)]
    assigned = {t.attr for node in ast.walk(init) if isinstance(node, ast.Assign)
                for t in node.targets if isinstance(t, ast.Attribute)}
    out = [f"{cls.name}.__init__ takes {got}, its fields say {wanted}"] if got != wanted else []
    if not any("init=False" in ast.unparse(d) for d in cls.decorator_list):
        out.append(f"{cls.name}: @dataclass without init=False makes an __init__ it drops")
    out += [f"{cls.name}.__init__ never sets {name}" for name, _ in fields
            if name not in assigned]
    return out


def test_written_dataclass_inits_take_their_fields() -> None:
    """A dataclass that writes its own __init__ (mypyc compiles a written one: see
    sim/batch.py) takes exactly the parameters dataclasses would give it."""
    found, wrong = [], []
    for name, path in MODULES.items():
        for cls, init in _written_dataclass_inits(ast.parse(path.read_text())):
            found.append(f"{name}.{cls.name}")
            wrong += _init_mismatches(cls, init)
    assert {"sim.request.Request", "sim.batch.BatchShape"} <= set(found)
    assert not wrong, "\n".join(wrong)
    broken = ast.parse("@dataclass\nclass A:\n    x: int\n    y: int = 0\n"
                       "    def __init__(self, y: int = 0, x: int = 1) -> None:\n"
                       "        self.x = x\n")
    cls, init = next(_written_dataclass_inits(broken))
    assert len(_init_mismatches(cls, init)) == 3  # the order, y never set, no init=False


def test_the_checks_see_a_violation() -> None:
    """The layering check would catch the core importing a policy (guards the checker)."""
    assert _wing("sim.engine")[1] is not None
    assert any(_under("policies.chunked", b) for b in _wing("sim.engine")[1] or ())
    assert _project_imports("sim.app.cli.main")  # the reader finds imports at all
    assert "sim.engine" in GRAPH["sim.simulate"]
