"""The house's layout: no import cycle among lab's modules, no module too long to read in
one sitting, and the kernel side imports nothing of the control side."""
from __future__ import annotations

import ast
from pathlib import Path

from conftest import ROOT

MAX_LINES = 550



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


def test_nothing_outside_lab_cli_imports_lab_cli():
    def in_cli(name: str) -> bool:
        return name == "lab.cli" or name.startswith("lab.cli.")
    inward = {m: sorted(i for i in imports if in_cli(i)) for m, imports in graph().items() if not in_cli(m)}
    inward = {m: i for m, i in inward.items() if i}
    assert not inward, f"the `lab` command is thin over the rest, not a library: {inward}"
