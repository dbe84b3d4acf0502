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
                 if name != "lab.config" and not name.startswith("lab.kernel")}
    assert not offending, "lab/kernel may import only lab.config and lab.kernel: " + ", ".join(sorted(offending))


def test_the_walker_sees_imports_inside_functions(tmp_path):
    sample = tmp_path / "m.py"
    sample.write_text("import os\ndef f():\n    from lab.corpus import core\n    import lab.runs\n")
    assert _lab_imports(sample) == ["lab.corpus", "lab.runs"]


def test_the_notebook_pastes_exactly_the_kernel_package_and_the_runs_fields():
    modules = {p.stem for p in KERNEL.glob("*.py") if p.stem != "__init__"} | {"config"}
    assert sorted(lab.kernel.READING_ORDER) == sorted(modules)
    assert len(set(lab.kernel.READING_ORDER)) == len(lab.kernel.READING_ORDER)
    assert notebooks.KERNEL_MODULES == lab.kernel.READING_ORDER


def test_each_kernel_module_uses_only_the_ones_pasted_before_it():
    order = lab.kernel.READING_ORDER
    for i, module in enumerate(order):
        for name in _lab_imports(notebooks.module_path(module)):
            used = "config" if name == "lab.config" else name.split(".")[2] if name.startswith("lab.kernel.") else None
            if used is not None:
                assert used in order[:i], f"{module} imports {name}, pasted after it"


def test_the_notebook_opens_with_the_model_not_the_control_side():
    """A person who opens it on Kaggle meets the model first, then the data, the step and the saver;
    the run's fields come where the loop needs them, without the form's words in two languages."""
    order = lab.kernel.READING_ORDER
    assert order[0] == "model" and order.index("data") < order.index("step") < order.index("train")
    config = notebooks.kernel_source("config")
    assert "Обучение" not in config and "label_ru" not in config and "/proc/cpuinfo" not in config
    assert "KAGGLE" not in config and len(config.splitlines()) < 260
