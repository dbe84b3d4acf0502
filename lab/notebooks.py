"""The training notebook: generated from the kernel-side modules, parameterized by papermill.

`notebooks/train.ipynb` holds the model, the loop and the saver in its own cells, so it
runs on a bare Kaggle image without this package installed. The code lives once, in
`lab/`; this module pastes it in (`scripts/make-train-notebook` writes the file, and a test
fails when the committed notebook is stale). Each code cell starts with the
`%%kernel_source` magic, which runs the cell and also appends it to a script: the script
is what torchrun's workers run, since code defined in a notebook cannot be pickled into
spawned processes.
"""
from __future__ import annotations

import ast
import dataclasses
import json
import re
from pathlib import Path

import nbformat

from lab.config import RunConfig
from lab.fields import field_help
from lab.kernel import READING_ORDER

PACKAGE = Path(__file__).resolve().parent
TRAIN_NOTEBOOK = PACKAGE.parent / "notebooks" / "train.ipynb"
# In the order a reader meets them; each may use only the ones before it.
KERNEL_MODULES = READING_ORDER
KAGGLE_LIMIT_BYTES = 1_000_000

# Settings of one session, not of the run: they stay out of RunConfig.
SESSION_PARAMETERS = {
    "out_dir": ("", "where outputs go; empty: /kaggle/working on Kaggle, ./run elsewhere"),
    "nproc": (0, "processes under torchrun; 0: one per GPU (DDP when there are two or more)"),
    "allow_fallback": (False, "if the newest checkpoint is corrupt, continue from the previous good one"),
    "plot_every_s": (30, "seconds between redraws of the loss plot"),
    "plot_x": ("step", "x axis of the plot: step or tokens"),
    "expect_data_sha256": ("", "sha256 of the data's manifest.json this session must find; empty: any"),
    "expect_ckpt_sha256": ("", "sha256 of the checkpoint this session must resume from; empty: any"),
    "expect_cards": ("", "the cards this session was pushed for ('2xT4'): without them it stops before training "
                         "and leaves no-gpu.json; empty: no check"),
    "allow_cpu": (False, "with expect_cards: train on the CPU when the cards are missing (the person set "
                         "LAB_KAGGLE_ALLOW_CPU to 1)"),
    "nccl_env": ({}, "NCCL settings for this session's workers, from the account's probe, e.g. "
                     "{'NCCL_P2P_DISABLE': '1'}"),
    "nnodes": (1, "hosts that train this run together under torchrun (a group of the lab's boxes); 1: this one"),
    "node_rank": (0, "this host's place in the group: 0 for the first, whose outputs are the run's"),
    "rdzv_endpoint": ("", "where the group's hosts meet: HOST:PORT on the first host"),
}

_LAB_IMPORT = re.compile(r"^(from lab(\.\w+)* import .*|import lab(\.\w+)*.*)$")


def module_path(module: str) -> Path:
    """`config` is the package's own (the control side shares it); the rest is `lab/kernel/`."""
    return PACKAGE / "config.py" if module == "config" else PACKAGE / "kernel" / f"{module}.py"


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


def parameters_source() -> str:
    lines = ["# Parameters: papermill, `lab run` and the New run form replace these values.",
             "# The run (the same fields as `lab train` and the form):"]
    defaults = RunConfig()
    for f in dataclasses.fields(RunConfig):
        lines.append(f"{f.name} = {getattr(defaults, f.name)!r}  # {field_help(f.name)}")
    lines.append("# This session:")
    for name, (value, help_text) in SESSION_PARAMETERS.items():
        lines.append(f"{name} = {value!r}  # {help_text}")
    return "\n".join(lines) + "\n"


def _module_title(module: str) -> str:
    doc = ast.get_docstring(ast.parse(module_path(module).read_text(encoding="utf-8"))) or module
    return f"## `{module}`: {doc.splitlines()[0]}"


INTRO = """# Train a GPT

The lab kit's training notebook. It runs the same on Kaggle (*GPU T4 ×2*) and on your own
card: `lab run` and the control notebook fill the **parameters** cell below and execute it with
papermill; on Kaggle it is pushed as a private kernel. Everything it needs is in these cells —
the model, the training loop and the time-limit saver — so you can read it top to bottom.

* Data: a folder prepared by `lab prepare` (`manifest.json`, `tokenizer.model`, uint16 shards),
  found under `/kaggle/input` (either of Kaggle's layouts) or next to the notebook.
* Outputs: `metrics.jsonl`, `checkpoints/`, `loss.png` in `/kaggle/working` (or `./run`).
* At `limit_min` minutes, on SIGTERM, or at the stop button, training saves a checkpoint and stops.
* `resume_from` continues from a checkpoint with the fields as this cell gives them: `lab run --resume`
  and the control notebook fill in every field as the run had it; by hand, give them all.

The cells below read top to bottom: the model, the learning-rate schedule, the data, the stop signals
and the checkpoint saver, the metrics, the run's fields, the launcher and the speed-ups, one training
step, the loop's parts and the loop, the plot, and the session (inputs, cards) around them.
"""

SETUP = '''import atexit, os, shutil, sys, tempfile, time
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
    """Runs the cell here and appends it to the script that torchrun workers run."""
    with KERNEL_PY.open("a", encoding="utf-8") as f:
        f.write(f"# --- {line}\\n{cell}\\n\\n")
    exec(compile(cell, f"<{line}>", "exec"), get_ipython().user_ns)


import torch
print(f"python {sys.version.split()[0]}, torch {torch.__version__}, "
      f"{torch.cuda.device_count()} GPU(s): {[torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]}")
'''

WORKER_ENTRY = '''# A torchrun worker runs this script with LOCAL_RANK set; the notebook itself skips it.
if __name__ == "__main__" and "LOCAL_RANK" in os.environ:
    worker_main()
'''

# The control side settled the run's fields once (`lab.settle`) and sends every one of them: the
# session takes them as they are and the loop checks them against the data and the checkpoint it opens.
RUN = '''timeline = preflight(expect_cards, allow_cpu, nccl_env, output_dir(out_dir), SESSION_STARTED_AT)
cfg = RunConfig.from_dict({name: globals()[name] for name in field_names()})
session = inputs_as_sent(cfg, out_dir, expect_data_sha256, expect_ckpt_sha256)
timeline.mark("inputs_checked")'''

TRAIN = '''try:
    result = run_session(cfg, session, KERNEL_PY, nproc=nproc, allow_fallback=allow_fallback,
                         plot_every_s=plot_every_s, plot_x=plot_x, started=SESSION_STARTED,
                         nodes=Nodes(nnodes, node_rank, rdzv_endpoint))
finally:
    timeline.mark("ended")
result'''


def build_train_notebook() -> nbformat.NotebookNode:
    check_no_clashes()
    md, code = nbformat.v4.new_markdown_cell, nbformat.v4.new_code_cell
    cells = [md(INTRO), code(parameters_source(), metadata={"tags": ["parameters"]}),
             md("## Setup\nThe `%%kernel_source` magic used by the cells below."), code(SETUP)]
    for module in KERNEL_MODULES:
        cells += [md(_module_title(module)), code(f"%%kernel_source {module}\n" + kernel_source(module))]
    cells += [code("%%kernel_source entry\n" + WORKER_ENTRY),
              md("## Run\nThe session's cards and image checked, the run's config from the parameters, and where "
                 "this session reads and writes."),
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


def notebook_text(nb: nbformat.NotebookNode | None = None) -> str:
    return nbformat.writes(nb or build_train_notebook()) + "\n"


def write_train_notebook(path: Path = TRAIN_NOTEBOOK) -> Path:
    text = notebook_text()
    if len(text.encode()) > KAGGLE_LIMIT_BYTES:
        raise ValueError(f"the training notebook is {len(text.encode()):,} bytes; Kaggle takes at most 1 MB")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def parameterized(cfg: RunConfig, **session) -> dict:
    """papermill parameters for a run: every RunConfig field plus session settings."""
    unknown = set(session) - set(SESSION_PARAMETERS)
    if unknown:
        raise ValueError(f"unknown session parameters: {sorted(unknown)}")
    return {**json.loads(cfg.to_json()), **session}


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
    ("markdown", "## 4. Новый прогон и калькулятор · New run and the calculator"),
    ("code", "form = ui.new_run(**form_values)"),
    ("markdown", "## 5. Старт · Start"),
    ("code", "ui.start(form, press=press_start)"),
    ("markdown", "## 6. Монитор · Monitor\n«Стоп» и «Продолжить». *Stop and Continue.*"),
    ("code", "monitor = ui.monitor(form, wait_minutes=wait_minutes)"),
    ("markdown", "## 7. Прогоны · Runs\nСравнить кривые, продолжить законченный прогон, ветка охлаждения. "
                 "*Compare curves, continue a finished run, a cooldown branch.*"),
    ("code", "ui.runs()"),
    ("markdown", "## 8. Рецепты · The recipe lab"),
    ("code", "# Points, the law L(N, D), cooldown branches\nfrom lab.ui.recipes import recipe_lab\n\nrecipe_lab()"),
    ("markdown", "## 9. Модель в деле · Try the model\nПрогон, его чекпоинт, начало текста — и модель пишет дальше.\n\n"
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
