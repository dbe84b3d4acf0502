"""The kernel package stands alone: it is what the training notebook holds, on a bare Kaggle image."""
import ast
from pathlib import Path

import lab.kernel
from lab import notebooks

KERNEL = Path(lab.kernel.__file__).parent


def _lab_imports(path: Path) -> list[str]:
    """Every `lab...` module a file imports, wherever the import sits (functions included)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found += [a.name for a in node.names if a.name.split(".")[0] == "lab"]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").split(".")[0] == "lab":
            found.append(node.module)
    return found


def test_the_kernel_imports_nothing_of_the_control_side():
    offending = {f"{path.name}: {name}" for path in KERNEL.glob("*.py") for name in _lab_imports(path)
                 if name not in ("lab.config", "lab.spec") and not name.startswith("lab.kernel")}
    assert not offending, "lab/kernel may import only lab.config, lab.spec and lab.kernel: " + ", ".join(sorted(offending))


def test_the_walker_sees_imports_inside_functions(tmp_path):
    sample = tmp_path / "m.py"
    sample.write_text("import os\ndef f():\n    from lab.corpus import core\n    import lab.runs\n")
    assert _lab_imports(sample) == ["lab.corpus", "lab.runs"]


def test_the_notebook_pastes_exactly_the_kernel_package_the_runs_fields_and_the_spec():
    modules = {p.stem for p in KERNEL.glob("*.py") if p.stem != "__init__"} | {"config", "spec"}
    assert sorted(lab.kernel.READING_ORDER) == sorted(modules)
    assert len(set(lab.kernel.READING_ORDER)) == len(lab.kernel.READING_ORDER)
    assert notebooks.KERNEL_MODULES == lab.kernel.READING_ORDER == lab.kernel.STORY + lab.kernel.APPENDIX


def _used(module: str) -> str | None:
    """The pasted module a `lab...` import names (None: not one the notebook pastes)."""
    name = module.split(".")
    return name[1] if name[:2] in (["lab", "config"], ["lab", "spec"]) else name[2] if name[:2] == ["lab", "kernel"] \
        and len(name) > 2 else None


def test_each_appendix_module_uses_only_the_story_and_the_appendix_before_it():
    order = lab.kernel.READING_ORDER
    for i, module in enumerate(order):
        if module in lab.kernel.STORY:
            continue
        for name in _lab_imports(notebooks.module_path(module)):
            used = _used(name)
            assert used is None or used in order[:i], f"{module} imports {name}, pasted after it"


def definition_time_names(source: str) -> set[str]:
    """The names a module uses while it is defined, not when its functions run: its top-level
    statements, decorators, default values, base classes and class bodies (annotations aside:
    the notebook runs each cell as its module does, under `from __future__ import annotations`)."""
    found: set[str] = set()

    def visit(node: ast.stmt) -> None:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            exprs = [*node.decorator_list, *node.args.defaults, *filter(None, node.args.kw_defaults)]
        elif isinstance(node, ast.ClassDef):
            exprs = [*node.decorator_list, *node.bases, *(k.value for k in node.keywords)]
            for child in node.body:
                visit(child)
        elif isinstance(node, ast.AnnAssign):
            exprs = [node.value] if node.value else []
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            exprs = []
        else:
            exprs = [node]
        found.update(n.id for e in exprs for n in ast.walk(e) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load))

    for statement in ast.parse(source).body:
        visit(statement)
    return found


def _imported_from(path: Path, modules: set[str]) -> set[str]:
    """The names a module imports from the pasted `modules`."""
    return {a.asname or a.name for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
            if isinstance(node, ast.ImportFrom) and node.module and _used(node.module) in modules
            for a in node.names}


def test_the_story_is_defined_by_what_comes_before_it_and_calls_the_rest_only_inside_its_functions():
    """Read top to bottom, the story stands alone: each of its modules is defined with only the
    modules before it; a name told later (the saver the loop uses, a file helper or a speed-up of
    the appendix) it only calls, when the notebook runs, after every cell has."""
    order = lab.kernel.READING_ORDER
    for i, module in enumerate(lab.kernel.STORY):
        path = notebooks.module_path(module)
        early = _imported_from(path, set(order[i:])) & definition_time_names(path.read_text(encoding="utf-8"))
        assert not early, f"{module} needs {sorted(early)}, told after it, while it is defined"


def test_the_definition_time_check_sees_bases_defaults_and_class_bodies_not_function_bodies():
    source = ("class A(Base):\n    x: int = LIMIT\n    def f(self, y=DEFAULT) -> Hint:\n        return called()\n"
              "@decorator\ndef g():\n    return late\nTOP = value\n")
    assert definition_time_names(source) == {"Base", "LIMIT", "DEFAULT", "decorator", "value"}


def test_the_notebook_opens_with_the_story_in_the_issues_order():
    """A person who opens it on Kaggle meets the model first, then the data, the learning rate, one
    step, the loop and the time-limit saver; the run's fields come in the appendix, without the
    form's words in two languages."""
    assert lab.kernel.STORY == ["model", "data", "schedule", "step", "train", "saver"]
    assert lab.kernel.APPENDIX[:2] == ["config", "spec"]
    config = notebooks.kernel_source("config")
    assert "Обучение" not in config and "label_ru" not in config and "/proc/cpuinfo" not in config
    assert "KAGGLE" not in config and len(config.splitlines()) < 260
