"""The house's layout: no import cycle among lab's modules, no module too long to read in
one sitting and no function longer than a screen, the kernel side imports nothing of the control
side, nothing but the CLI imports the CLI, and the driver reads no machine's private record."""
from __future__ import annotations

import ast
from pathlib import Path

from conftest import ROOT

MAX_LINES = 550
MAX_FUNCTION_LINES = 60
# What the driver once read out of `Link.detail`, flags only one machine sets: it decides from the
# link's typed outcome instead (lab.machines.outcome).
HOST_FLAGS = {"input_not_ready", "abandoned", "refused", "session_started", "limit_min", "in_driver"}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted((ROOT / "lab").rglob("*.py"))}


def lab_imports(path: Path, known: set[str], name: str | None = None) -> set[str]:
    """The lab modules a module imports, at its top level or inside functions: `import a.b`,
    `from a import b` (b a module or a name in a), and relative imports."""
    name = name or module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
        else:
            continue
        for target in targets:
            while target and target not in known:  # lab.a.b.Name -> lab.a.b
                target = target.rpartition(".")[0]
            if target and target != name:
                out.add(target)
    return out


def graph() -> dict[str, set[str]]:
    mods = modules()
    known = set(mods)
    return {name: lab_imports(path, known) for name, path in mods.items()}


def cycles(g: dict[str, set[str]]) -> list[set[str]]:
    """Strongly connected components with more than one module (Tarjan), and self-imports."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[set[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(g.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.add(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(component)

    for v in sorted(g):
        if v not in index:
            visit(v)
    return out


def test_no_import_cycle_among_labs_modules():
    found = cycles(graph())
    assert not found, "import cycles: " + "; ".join(" -> ".join(sorted(c)) for c in found)


def test_the_cycle_finder_finds_a_cycle_through_a_function_level_import(tmp_path):
    g = {"lab.a": {"lab.b"}, "lab.b": {"lab.c"}, "lab.c": {"lab.a"}, "lab.d": {"lab.a"}}
    assert cycles(g) == [{"lab.a", "lab.b", "lab.c"}]
    source = tmp_path / "m.py"
    source.write_text("def f():\n    from lab.sizing import estimate\n    import lab.corpus.manifests\n")
    known = {"lab.sizing", "lab.corpus", "lab.corpus.manifests"}
    assert lab_imports(source, known, name="lab.m") == {"lab.sizing", "lab.corpus.manifests"}


def test_no_module_in_lab_or_the_emulator_is_over_550_lines():
    files = sorted((ROOT / "lab").rglob("*.py")) + sorted((ROOT / "tests" / "kaggle_emulator").rglob("*.py"))
    long = {str(p.relative_to(ROOT)): n for p in files if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_LINES}
    assert not long, f"modules over {MAX_LINES} lines (split them by concern): {long}"


def test_the_kernel_imports_only_lab_config_and_lab_kernel():
    g = graph()
    outside = {m: sorted(i for i in imports if i != "lab.config" and not (i == "lab.kernel" or i.startswith("lab.kernel.")))
               for m, imports in g.items() if m == "lab.kernel" or m.startswith("lab.kernel.")}
    assert not {m: i for m, i in outside.items() if i}, outside


def function_lengths(path: Path) -> dict[str, int]:
    """"Class.method" (or "function", "outer.inner") -> its lines, def to last line."""
    out: dict[str, int] = {}

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                out[prefix + child.name] = child.end_lineno - child.lineno + 1
                visit(child, f"{prefix}{child.name}.")
            elif isinstance(child, ast.ClassDef):
                visit(child, f"{prefix}{child.name}.")
            else:
                visit(child, prefix)
    visit(ast.parse(path.read_text(encoding="utf-8")), "")
    return out


def test_no_function_in_lab_is_over_60_lines():
    long = {f"{p.relative_to(ROOT)}:{name}": n for p in sorted((ROOT / "lab").rglob("*.py"))
            for name, n in function_lengths(p).items() if n > MAX_FUNCTION_LINES}
    assert not long, f"functions over {MAX_FUNCTION_LINES} lines (split them by job): {long}"


def test_the_function_measure_counts_nested_functions_and_methods(tmp_path):
    source = tmp_path / "m.py"
    source.write_text("class A:\n    def f(self):\n        def g():\n            pass\n        return g\n"
                      "def h():\n    return 1\n")
    assert function_lengths(source) == {"A.f": 4, "A.f.g": 2, "h": 2}


def test_nothing_outside_lab_cli_imports_it():
    g = graph()
    found = {m: sorted(i for i in imports if i == "lab.cli" or i.startswith("lab.cli."))
             for m, imports in g.items() if not (m == "lab.cli" or m.startswith("lab.cli."))}
    unexpected = {m: i for m, i in found.items() if i}
    assert not unexpected, f"the CLI is the top layer: these import it (move what they need below it): {unexpected}"


def test_the_driver_reads_no_machines_private_record():
    tree = ast.parse((ROOT / "lab" / "machines" / "driver.py").read_text(encoding="utf-8"))
    reads = [node.lineno for node in ast.walk(tree) if isinstance(node, ast.Attribute) and node.attr == "detail"]
    assert not reads, f"lab/machines/driver.py reads Link.detail (lines {reads}): decide from Link.outcome"
    named = sorted({(node.value, node.lineno) for node in ast.walk(tree)
                    if isinstance(node, ast.Constant) and node.value in HOST_FLAGS}
                   | {(node.arg, node.lineno) for node in ast.walk(tree)
                      if isinstance(node, ast.keyword) and node.arg in HOST_FLAGS})
    assert not named, f"lab/machines/driver.py names machines' private flags: {named}"
