"""The house's layout: lab's packages stand on floors and import only downwards (imports inside
functions counted), no import cycle among its modules, no module too long to read in one sitting
and no function longer than a screen, the kernel side imports nothing of the control side, and the
driver reads no machine's private record."""
from __future__ import annotations

import ast
from pathlib import Path

from conftest import ROOT

MAX_LINES = 550
MAX_FUNCTION_LINES = 60
# What the driver once read out of `Link.detail`, flags only one machine sets: it decides from the
# link's typed outcome instead (lab.runs).
HOST_FLAGS = {"input_not_ready", "abandoned", "refused", "session_started", "limit_min", "in_driver"}
# lab's packages (a top-level module counts as one), lowest first. A package imports only those on
# a lower floor, or those before it on its own floor; `../shared/DESIGN.md` draws the same floors.
FLOORS = [
    ("config", "spec", "home", "faults", "fields"),  # spec: the run and a session, pasted into the notebook as config is
    ("kernel", "corpus", "kaggle", "procs"),  # kaggle and procs use the kernel's checkpoint and signals
    ("runs", "sizing", "models", "notebooks", "trial"),  # the trial session pastes kernel modules as notebooks do
    ("machines", "probe"),
    ("settle",),  # where every run is registered: a sweep's and a branch's too
    ("recipes",),
    ("api",),
    ("flags", "ui", "cli"),
]


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


def package_of(module: str) -> str:
    return module.split(".")[1] if module.count(".") else module


def floor_violations(g: dict[str, set[str]], floors: list[tuple[str, ...]]) -> list[str]:
    """"lab.a.m imports lab.b.n" for each import that does not go down the floors."""
    rank = {package: (i, j) for i, floor in enumerate(floors) for j, package in enumerate(floor)}
    out = []
    for module, imports in sorted(g.items()):
        mine = package_of(module)
        for target in sorted(imports):
            theirs = package_of(target)
            if theirs == mine or theirs == "lab":
                continue
            if mine not in rank or theirs not in rank:
                out.append(f"{module} imports {target}: {mine if mine not in rank else theirs} stands on no floor")
            elif not (rank[theirs][0] < rank[mine][0] or (rank[theirs][0] == rank[mine][0]
                                                          and rank[theirs][1] < rank[mine][1])):
                out.append(f"{module} imports {target}")
    return out


def test_labs_packages_import_only_downwards_imports_inside_functions_counted():
    found = floor_violations(graph(), FLOORS)
    assert not found, "imports that do not go down the floors (put the record many read below its readers, or " \
                      "let the caller combine): " + "; ".join(found)


def test_the_floor_check_catches_an_import_up_or_sideways(tmp_path):
    floors = [("config",), ("kernel", "corpus"), ("machines",)]
    g = {"lab.kernel.a": {"lab.config"}, "lab.corpus.b": {"lab.kernel.a"}, "lab.machines.c": {"lab.corpus.b"}}
    assert floor_violations(g, floors) == []
    g["lab.kernel.a"].add("lab.corpus.b")  # sideways, against the floor's order
    g["lab.corpus.b"].add("lab.machines.c")  # up
    assert floor_violations(g, floors) == ["lab.corpus.b imports lab.machines.c", "lab.kernel.a imports lab.corpus.b"]


# What the faces (the control notebook's widgets, the `lab` command) may import of the kit besides
# themselves: the typed API, the run's fields and their words and flags, and where the lab lives.
FACES = ("lab.ui", "lab.cli")
FACES_USE = ("lab.api", "lab.config", "lab.fields", "lab.flags", "lab.home")


def past_the_api(g: dict[str, set[str]]) -> dict[str, list[str]]:
    """Each face module with the kit's modules it imports past `FACES_USE` (imports inside functions counted)."""
    def within(name: str, packages: tuple[str, ...]) -> bool:
        return any(name == p or name.startswith(p + ".") for p in packages)
    found = {m: sorted(i for i in imports if not within(i, FACES + FACES_USE))
             for m, imports in g.items() if within(m, FACES)}
    return {m: i for m, i in found.items() if i}


def test_the_notebook_and_the_command_reach_the_lab_through_its_api_only():
    """ui/ and cli/ import of the kit only lab.api, lab.config, lab.fields, lab.flags and lab.home:
    lab.api returns typed rows (a run's, a machine's, a run's status), so no face reads the registry,
    the sizing, the kernel or the machines itself."""
    found = past_the_api(graph())
    assert not found, "imports past lab.api (ask lab.api for it): " + "; ".join(f"{m}: {', '.join(i)}"
                                                                              for m, i in sorted(found.items()))


def test_the_faces_rule_counts_imports_inside_functions(tmp_path):
    source = tmp_path / "m.py"
    source.write_text("from lab.api import runs\nfrom lab.ui.text import tr\n\ndef f():\n"
                      "    from lab.runs import list_runs  # late\n    import lab.sizing.words  # late\n")
    known = {"lab.api.runs", "lab.ui.text", "lab.runs", "lab.sizing", "lab.sizing.words", "lab.api"}
    g = {"lab.ui.m": lab_imports(source, known, name="lab.ui.m"), "lab.runs": {"lab.config"}}
    assert past_the_api(g) == {"lab.ui.m": ["lab.runs", "lab.sizing.words"]}


def late_imports_without_a_reason(path: Path) -> list[int]:
    """The lines of imports inside a function with no comment beside them (on the line, or above the
    group of imports it stands in) saying why they wait."""
    lines = path.read_text(encoding="utf-8").splitlines()
    out = []
    for fn in ast.walk(ast.parse("\n".join(lines))):
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for node in ast.walk(fn):
            if isinstance(node, (ast.Import, ast.ImportFrom)) and "#" not in lines[node.lineno - 1]:
                above = node.lineno - 2
                while above >= 0 and lines[above].strip().startswith(("from ", "import ")):
                    above -= 1
                if above < 0 or not lines[above].strip().startswith("#"):
                    out.append(node.lineno)
    return sorted(set(out))


def test_imports_stand_at_the_top_unless_a_heavy_dependency_must_wait_with_the_reason_beside_it():
    found = {str(p.relative_to(ROOT)): lines for p in sorted((ROOT / "lab").rglob("*.py"))
             if (lines := late_imports_without_a_reason(p))}
    assert not found, f"imports inside functions with no reason beside them (move them to the top): {found}"


def test_the_late_import_check_wants_a_reason(tmp_path):
    source = tmp_path / "m.py"
    source.write_text("def f():\n    import json\n    import torch  # torch: only when it trains\n"
                      "    # matplotlib and numpy: only for a plot\n    import matplotlib\n    import numpy\n"
                      "    x = 1\n    import scipy\n")
    assert late_imports_without_a_reason(source) == [2, 8]


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


def test_the_kernel_imports_only_lab_config_lab_spec_and_lab_kernel():
    g = graph()
    outside = {m: sorted(i for i in imports if i not in ("lab.config", "lab.spec")
                         and not (i == "lab.kernel" or i.startswith("lab.kernel.")))
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
