"""The training notebook: generated from the kernel-side modules, parameterized by a link's spec.

`notebooks/train.ipynb` reads as a story: this run's values (the parameters cell), then the
model, the data, the learning rate, one step, the loop and the time-limit saver; then a markdown
cell `## Appendix: the session's machinery` and everything else (the run's fields, launch,
preflight, speed-ups, the CPU, signals, the session), whose last cells run it. So it runs on a
bare Kaggle image without this package installed. The code lives once, in `lab/`; this module
pastes it in (`scripts/make-train-notebook` writes the file, and a test fails when the committed
notebook is stale). Each code cell starts with the `%%kernel_source` magic, which runs the cell
and also appends it to a script: the script is what torchrun's workers run, since code defined in
a notebook cannot be pickled into spawned processes.

A link's notebook (`link_notebook`) is the template with its parameters cell written for the link's
spec by this module, not by papermill's translator: one cell, its values one per line with what
each means, Cyrillic as Cyrillic.
"""
from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import nbformat

from lab.kernel import APPENDIX, READING_ORDER, STORY
from lab.spec import LinkSpec

PACKAGE = Path(__file__).resolve().parent
TRAIN_NOTEBOOK = PACKAGE.parent / "notebooks" / "train.ipynb"
# In the order a reader meets them: the story, then the appendix.
KERNEL_MODULES = READING_ORDER
KAGGLE_LIMIT_BYTES = 1_000_000
APPENDIX_HEADING = "## Appendix: the session's machinery"
# The run's fields a link's session holds instead (LinkSpec.of empties them in the run): not shown twice.
HELD_BY_SESSION = ("resume_from", "data_dir")

_LAB_IMPORT = re.compile(r"^(from lab(\.\w+)* import .*|import lab(\.\w+)*.*)$")


def module_path(module: str) -> Path:
    """`config` and `spec` are the package's own (the control side shares them); the rest is `lab/kernel/`."""
    return PACKAGE / f"{module}.py" if module in ("config", "spec") else PACKAGE / "kernel" / f"{module}.py"


def kernel_source(module: str) -> str:
    """A module's code as a notebook cell: without its package imports, which the
    notebook's shared namespace makes unnecessary, and without the future import."""
    text = module_path(module).read_text(encoding="utf-8")
    out, skipping = [], False
    for line in text.splitlines():
        if skipping:
            skipping = ")" not in line
            continue
        if line.startswith("from __future__ import"):
            continue
        if _LAB_IMPORT.match(line):
            skipping = "(" in line and ")" not in line
            continue
        out.append(line)
    return "\n".join(out).strip() + "\n"


def top_level_names(source: str) -> set[str]:
    names = set()
    for node in ast.parse(source).body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(t.id for t in targets if isinstance(t, ast.Name))
    return names


def check_no_clashes() -> None:
    """Modules share one namespace in the notebook: a name defined twice would silently
    replace the first definition."""
    seen: dict[str, str] = {}
    for module in KERNEL_MODULES:
        for name in top_level_names(kernel_source(module)):
            if name in seen:
                raise ValueError(f"{name!r} is defined in both {module_path(seen[name])} and {module_path(module)}; "
                                 f"rename one: the training notebook puts them in one namespace")
            seen[name] = module


# --- the parameters cell -----------------------------------------------------------------------

TEMPLATE_PARAMETERS = """# This run's values: `lab run`, the control notebook and the lab's machines write this cell for each
# session (lab.spec.LinkSpec: the run's fields, then the session's own). Empty: every field's default.
run = {}
session = {}
"""


def field_comments(module: str, cls: str) -> dict[str, str]:
    """Each field of class `cls` in `module` with the comment beside it there: what a field means
    is written once, in its dataclass."""
    lines = module_path(module).read_text(encoding="utf-8").splitlines()
    body = next(n for n in ast.parse("\n".join(lines)).body if isinstance(n, ast.ClassDef) and n.name == cls).body
    return {n.target.id: lines[n.lineno - 1].partition("  # ")[2].strip() for n in body
            if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)}


def literal(value) -> str:
    """A value as Python source a person reads: strings in double quotes with their own letters
    (papermill's translator writes Cyrillic as \\u escapes), lists and dicts the same inside."""
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(map(literal, value)) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{literal(str(k))}: {literal(v)}" for k, v in value.items()) + "}"
    return repr(value)


def _assignment(name: str, values: dict, comments: dict[str, str]) -> list[str]:
    lines = [f"{name} = {{"]
    for key, value in values.items():
        comment = comments.get(key)
        lines.append(f"    {literal(key)}: {literal(value)}," + (f"  # {comment}" if comment else ""))
    return lines + ["}"]


def parameters_source(spec: LinkSpec) -> str:
    """The parameters cell of a link's notebook: this run's values once, one per line, with what
    each means; the run's fields its session holds instead (`HELD_BY_SESSION`) only when set."""
    run = {k: v for k, v in spec.run.to_dict().items() if k not in HELD_BY_SESSION or v}
    lines = ["# This run's values: the run's fields, then this session's own (lab.spec.LinkSpec).",
             *_assignment("run", run, field_comments("config", "RunConfig")),
             *_assignment("session", spec.session.to_dict(), field_comments("spec", "Session"))]
    return "\n".join(lines) + "\n"


def parameterized(spec: LinkSpec) -> dict:
    """papermill's parameters for a link: its spec's one JSON form, `run` and `session` (where
    papermill writes the cell itself, as a box's remote half does)."""
    return spec.to_dict()


def link_notebook(spec: LinkSpec) -> nbformat.NotebookNode:
    """The training notebook of one link, as it is pushed to Kaggle or executed by papermill: the
    template with its parameters cell written for `spec` (tagged as papermill tags the cell it
    writes, so that papermill given parameters replaces this one rather than adding a second)."""
    nb = nbformat.reads(TRAIN_NOTEBOOK.read_text(encoding="utf-8"), as_version=4)
    cell = next(c for c in nb.cells if "parameters" in c.metadata.get("tags", []))
    cell.source = parameters_source(spec)
    cell.metadata["tags"] = ["parameters", "injected-parameters"]
    nb.metadata["papermill"] = {"parameters": spec.to_dict()}
    return nb


def write_link_notebook(spec: LinkSpec, path: Path) -> Path:
    """A link's notebook written to `path`, for papermill to execute from there (given a notebook
    object instead, papermill would keep a whole copy of it in the executed notebook's metadata)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(link_notebook(spec), str(path))
    return path


# --- the cells around the modules --------------------------------------------------------------

INTRO = """# Train a GPT

The lab kit's training notebook. It runs the same on Kaggle (*GPU T4 ×2*) and on your own card:
`lab run` and the control notebook write this run's values into the **parameters** cell below and
execute it with papermill; on Kaggle it is pushed as a private kernel.

Read it top to bottom: this run's values, then the story — **the model, the data, the learning
rate, one step, the loop and the time-limit saver**. Below the story, the
*Appendix: the session's machinery* holds everything else (the run's fields, the checkpoint's
files, launch, preflight, speed-ups, the CPU, signals, the session); its last cells run the story.

* Data: a folder prepared by `lab prepare` (`manifest.json`, `tokenizer.model`, uint16 shards),
  found under `/kaggle/input` (either of Kaggle's layouts) or next to the notebook.
* Outputs: `metrics.jsonl`, `checkpoints/`, `loss.png` in `/kaggle/working` (or `./run`).
* At the session's time limit, on SIGTERM, or at the stop button, training saves a checkpoint and stops.
"""

SETUP = '''import __future__, atexit, os, shutil, sys, tempfile, time
from pathlib import Path
from IPython import get_ipython
from IPython.core.magic import register_cell_magic

SESSION_STARTED = time.monotonic()  # the time limit counts from here
SESSION_STARTED_AT = time.time()  # the same moment on the wall clock: the first mark of the session's timeline
KERNEL_PY = Path(tempfile.mkdtemp(prefix="lab-kernel-")) / "lab_kernel.py"
atexit.register(shutil.rmtree, KERNEL_PY.parent, ignore_errors=True)  # the workers are gone by then
KERNEL_PY.write_text("from __future__ import annotations\\n# The code of the training notebook, for torchrun workers.\\n")


@register_cell_magic
def kernel_source(line, cell):
    """Runs the cell here as its module runs (annotations not evaluated), and appends it to the
    script that torchrun workers run."""
    with KERNEL_PY.open("a", encoding="utf-8") as f:
        f.write(f"# --- {line}\\n{cell}\\n\\n")
    exec(compile(cell, f"<{line}>", "exec", __future__.annotations.compiler_flag), get_ipython().user_ns)
'''

APPENDIX_INTRO = APPENDIX_HEADING + """

Everything the story calls that is not the story: the run's fields and this session's own
(`config`, `spec`), the checkpoint's files, the metrics file, the CPU, the ranks agreeing, the
speed-ups (compiling, DDP's settings, one host sync per sync point), the launcher, where this
process trains, what to do when a step does not fit the card, the plot, the session (its inputs,
torchrun) and its first checks (preflight). The last cells run the story."""

WORKER_ENTRY = '''# A torchrun worker runs this script with LOCAL_RANK set; the notebook itself skips it.
if __name__ == "__main__" and "LOCAL_RANK" in os.environ:
    worker_main()
'''

# The control side settled the run's fields once (`lab.settle`) and sends every one of them: the
# session takes them as they are and the loop checks them against the data and the checkpoint it opens.
RUN = '''spec = LinkSpec.from_dict({"run": run, "session": session})  # this run's values, once
timeline = preflight(spec.session.expect_cards, spec.session.allow_cpu, spec.session.nccl_env,
                     output_dir(spec.session.out_dir), SESSION_STARTED_AT)
paths = inputs_as_sent(spec)
timeline.mark("inputs_checked")'''

TRAIN = '''try:
    result = run_session(spec, paths, KERNEL_PY, started=SESSION_STARTED)
finally:
    timeline.mark("ended")
result'''


def _module_title(module: str) -> str:
    doc = ast.get_docstring(ast.parse(module_path(module).read_text(encoding="utf-8"))) or module
    return f"## `{module}`: {doc.splitlines()[0]}"


def _module_cells(modules: list[str]) -> list:
    md, code = nbformat.v4.new_markdown_cell, nbformat.v4.new_code_cell
    return [cell for module in modules
            for cell in (md(_module_title(module)), code(f"%%kernel_source {module}\n" + kernel_source(module)))]


def build_train_notebook() -> nbformat.NotebookNode:
    check_no_clashes()
    md, code = nbformat.v4.new_markdown_cell, nbformat.v4.new_code_cell
    cells = [md(INTRO), code(TEMPLATE_PARAMETERS, metadata={"tags": ["parameters"]}),
             md("## Setup\nThe `%%kernel_source` magic the cells below run under."), code(SETUP),
             *_module_cells(STORY), md(APPENDIX_INTRO), *_module_cells(APPENDIX),
             code("%%kernel_source entry\n" + WORKER_ENTRY),
             md("## Run\nThis run's spec from the parameters, built once; the session's cards and image checked; "
                "where it reads and writes."),
             code(RUN),
             md("## Train\nProgress below; the loss plot refreshes while it trains and is saved as `loss.png`."),
             code(TRAIN)]
    nb = nbformat.v4.new_notebook(cells=cells)
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.metadata["language_info"] = {"name": "python"}
    # Stable ids keep the committed file byte-identical between generations.
    for i, cell in enumerate(nb.cells):
        cell["id"] = f"cell-{i:02d}"
    return nb


def story_cells(nb: nbformat.NotebookNode) -> list:
    """The cells before the appendix's heading: this run's values and the story."""
    end = next(i for i, c in enumerate(nb.cells) if c.cell_type == "markdown" and c.source.startswith(APPENDIX_HEADING))
    return nb.cells[:end]


def notebook_text(nb: nbformat.NotebookNode | None = None) -> str:
    return nbformat.writes(nb or build_train_notebook()) + "\n"


def write_train_notebook(path: Path = TRAIN_NOTEBOOK) -> Path:
    text = notebook_text()
    if len(text.encode()) > KAGGLE_LIMIT_BYTES:
        raise ValueError(f"the training notebook is {len(text.encode()):,} bytes; Kaggle takes at most 1 MB")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


# =======================================================================================
# The control notebook (control side): short cells, each calling `lab.ui`; written by
# `scripts/make-control-notebook`, and a test fails when the committed file is stale.

CONTROL_NOTEBOOK = PACKAGE.parent / "notebooks" / "control.ipynb"

CONTROL_INTRO = """# Пульт лабы · Lab control

Запускайте ячейки по порядку (Shift+Enter). Форма «Новый прогон» сразу считает размер, время, память и квоту;
«Старт» запускает прогон, монитор ниже показывает его loss. Переключатель **RU | EN** — язык формы.

*Run the cells in order (Shift+Enter). The New run form sizes the run as you type; Start launches it and the
monitor below shows its loss. The **RU | EN** switch sets the form's language.*"""

CONTROL_PARAMETERS = """# Для запуска без человека (papermill, тесты); человеку здесь ничего менять не нужно.
# For headless runs (papermill, tests); a person leaves these as they are.
form_values = {}     # поля формы заранее / fields to pre-fill, e.g. {"layers": 12}
press_start = False  # нажать «Старт» / press Start
wait_minutes = 0     # монитор ждёт конца прогона / the monitor waits for the run to end"""

CONTROL_CELLS = [
    ("markdown", CONTROL_INTRO),
    ("parameters", CONTROL_PARAMETERS),
    ("markdown", "## 1. Настройка · Setup"),
    ("code", "from lab import ui\n\nui.setup()"),
    ("markdown", "## 2. Машины · Machines\nАккаунты Kaggle: добавить (kaggle.json), проба, удалить; квота; чекпоинты на "
                 "Kaggle. *Kaggle accounts: add (kaggle.json), probe, remove; quota; checkpoints kept on Kaggle.*"),
    ("code", "ui.machines()"),
    ("markdown", "## 3. Данные · Data\nСозвездия: объявить из папки или файлов, изменить, подготовить. "
                 "*Constellations: declare from a folder or files, edit, prepare.*"),
    ("code", "ui.data()"),
    ("markdown", "## 4. Новый прогон · New run\nПоля, калькулятор рядом и «Старт» под ним. "
                 "*The fields, the calculator beside them and Start under it.*"),
    ("code", "form = ui.new_run(**form_values)\nui.start(form, press=press_start)"),
    ("markdown", "## 5. Монитор · Monitor\n«Стоп» и «Продолжить». *Stop and Continue.*"),
    ("code", "monitor = ui.monitor(form, wait_minutes=wait_minutes)"),
    ("markdown", "## 6. Прогоны · Runs\nСравнить кривые, продолжить законченный прогон, ветка охлаждения. "
                 "*Compare curves, continue a finished run, a cooldown branch.*"),
    ("code", "ui.runs()"),
    ("markdown", "## 7. Рецепты · The recipe lab"),
    ("code", "# Points, the law L(N, D), cooldown branches\nfrom lab.ui.recipes import recipe_lab\n\nrecipe_lab()"),
    ("markdown", "## 8. Модель в деле · Try the model\nПрогон, его чекпоинт, начало текста — и модель пишет дальше.\n\n"
                 "*A run, one of its checkpoints, a prompt: the model writes on.*"),
    ("code", "ui.try_model()"),
]


def build_control_notebook() -> nbformat.NotebookNode:
    nb = nbformat.v4.new_notebook()
    nb.metadata = {"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"},
                   "language_info": {"name": "python"}}
    for kind, source in CONTROL_CELLS:
        if kind == "markdown":
            cell = nbformat.v4.new_markdown_cell(source)
        else:
            cell = nbformat.v4.new_code_cell(source)
            if kind == "parameters":
                cell.metadata["tags"] = ["parameters"]
        nb.cells.append(cell)
    for i, cell in enumerate(nb.cells):  # stable ids: regenerating changes nothing
        cell["id"] = f"cell-{i:02d}"
    return nb


def control_notebook_text() -> str:
    return nbformat.writes(build_control_notebook())


def write_control_notebook(path: Path = CONTROL_NOTEBOOK) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(control_notebook_text(), encoding="utf-8")
    return path
