"""The training notebook: generated, parameterized, executed by papermill as Kaggle would run it."""
import ast
import dataclasses
import json
import os
import shutil
import signal
import sys
import threading
import time
from pathlib import Path

import nbformat
import papermill as pm
import pytest

from conftest import lab
from lab import notebooks as notebook
from lab.config import RunConfig
from lab.kernel import APPENDIX, STORY
from lab.kernel.checkpoint import checkpoint_step, list_checkpoints
from lab.kernel.metrics import read_metrics
from lab.procs import descendants
from lab.spec import LinkSpec, Session

TINY_PARAMS = dict(context=32, width=32, heads=2, layers=2, batch_per_card=4, eval_every=20, eval_batches=2,
                   lr=3e-3, warmup_steps=2, plot_every_s=1)
SESSION_FIELDS = {f.name for f in dataclasses.fields(Session)}


def _spec(**params) -> LinkSpec:
    """A link's spec from flat values: a session's own field (limit_min, resume_from, ...) goes to the
    session, the rest to the run."""
    run = {k: v for k, v in params.items() if k not in SESSION_FIELDS}
    return LinkSpec.of(RunConfig.from_dict(run), **{k: v for k, v in params.items() if k in SESSION_FIELDS})


def test_the_committed_notebook_is_generated_from_the_current_modules():
    committed = notebook.TRAIN_NOTEBOOK.read_text(encoding="utf-8")
    assert committed == notebook.notebook_text(), "notebooks/train.ipynb is stale: run scripts/make-train-notebook"


def test_the_notebook_has_no_outputs_and_fits_kaggles_limit():
    nb = nbformat.read(notebook.TRAIN_NOTEBOOK, as_version=4)
    assert all(not c.get("outputs") and not c.get("execution_count") for c in nb.cells if c.cell_type == "code")
    assert notebook.TRAIN_NOTEBOOK.stat().st_size < 200_000  # well under Kaggle's 1 MB


def test_the_template_takes_a_links_spec_as_its_two_parameters_and_shows_no_defaults():
    params = pm.inspect_notebook(str(notebook.TRAIN_NOTEBOOK))
    assert set(params) == {"run", "session"} and params["run"]["default"] == params["session"]["default"] == "{}"


def _code_lines(cells) -> int:
    return sum(len(c.source.splitlines()) for c in cells if c.cell_type == "code")


def test_a_links_notebook_reads_as_a_story_with_this_runs_values_once():
    spec = LinkSpec.of(RunConfig(constellations=["сказки", "pydoc"], context=256, width=128, heads=4, layers=4,
                                 limit_min=700.0, steps_until=3000, data_dir="/home/me/lab-home/data/x"),
                       limit_min=90.0, resume_from="lab-ckpt-run-1", expect_cards="2xT4",
                       nccl_env={"NCCL_P2P_DISABLE": "1"})
    nb = json.loads(json.dumps(notebook.link_notebook(spec)))  # as pushed, and as Kaggle opens it
    nb = nbformat.from_dict(nb)
    code = [c for c in nb.cells if c.cell_type == "code"]
    params = [c for c in code if "parameters" in c.metadata.get("tags", [])]
    assert len(params) == 1 and params[0] is code[0], "one parameters cell, the first code cell"
    source = params[0].source
    assert '"constellations": ["сказки", "pydoc"],' in source and "\\u" not in source
    for line in ('    "context": 256,', '    "limit_min": 700.0,', '    "limit_min": 90.0,', '    "nccl_env": {"NCCL_P2P_DISABLE": "1"},',
                 '    "resume_from": "lab-ckpt-run-1",'):
        assert source.count(line + "  #") == 1 or source.count(line + "\n") == 1, line
    assert "/home/me" not in json.dumps(nb) and "1024" not in source  # no place of this computer, no default of another run
    run_lines = source.split("session = {")[0].splitlines()
    for name, value in spec.run.to_dict().items():  # one per line, once
        assert sum(line.startswith(f'    "{name}": ') for line in run_lines) == (
            0 if name in notebook.HELD_BY_SESSION and not value else 1), name
    namespace: dict = {}
    exec(source, namespace)
    assert LinkSpec.from_dict({"run": namespace["run"], "session": namespace["session"]}) == spec
    assigned = {line.split(" =")[0] for c in code[1:] for line in c.source.splitlines() if " = " in line}
    assert not assigned & {"run", "session", "context", "limit_min", "steps_until"}, "no second cell of values"

    story = notebook.story_cells(nb)
    titles = [c.source.split("`")[1] for c in story if c.cell_type == "markdown" and c.source.startswith("## `")]
    assert titles == STORY == ["model", "data", "schedule", "step", "train", "saver"]
    assert _code_lines(story) <= 1200, f"the story is {_code_lines(story)} code lines"
    appendix = nb.cells[len(story):]
    assert appendix[0].cell_type == "markdown" and appendix[0].source.splitlines()[0] == notebook.APPENDIX_HEADING
    told = [c.source.split("`")[1] for c in appendix if c.cell_type == "markdown" and c.source.startswith("## `")]
    assert told == APPENDIX and {"launch", "preflight", "speed", "cpu", "signals", "session"} <= set(told)
    assert "class Trainer" in "".join(c.source for c in story) and "def launch(" not in "".join(c.source for c in story)


def test_module_names_do_not_clash_in_the_notebooks_namespace():
    notebook.check_no_clashes()


def test_the_notebook_needs_nothing_but_torch_numpy_sentencepiece_and_matplotlib():
    imported = set()
    for cell in nbformat.read(notebook.TRAIN_NOTEBOOK, as_version=4).cells:
        if cell.cell_type != "code":
            continue
        code = "\n".join(line for line in cell.source.splitlines() if not line.startswith("%%"))
        for node in ast.walk(ast.parse(code)):
            if isinstance(node, ast.Import):
                imported |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module != "__future__":
                imported.add(node.module.split(".")[0])
    assert "lab" not in imported
    assert imported - set(sys.stdlib_module_names) <= {"torch", "numpy", "sentencepiece", "matplotlib", "IPython"}


def _kaggle(tmp_path, data, layout):
    """A fake /kaggle with the data mounted in Kaggle's newer or older input layout."""
    root = tmp_path / "kaggle"
    where = root / "input" / ("datasets/lab/lab-data-pydoc" if layout == "new" else "lab-data-pydoc")
    shutil.copytree(data, where)
    (root / "working").mkdir(parents=True)
    return root


def _execute(tmp_path, name, root, monkeypatch, by_papermill=False, **params):
    """The link's notebook alone, as pushed, executed; `by_papermill`: the template with papermill
    writing the parameters, as a box's remote half runs it."""
    folder = tmp_path / name
    folder.mkdir()
    spec = _spec(**{**TINY_PARAMS, **params})
    if by_papermill:
        shutil.copy(notebook.TRAIN_NOTEBOOK, folder / "train.ipynb")
    else:
        nbformat.write(notebook.link_notebook(spec), str(folder / "train.ipynb"))
    monkeypatch.setenv("LAB_KAGGLE_ROOT", str(root))
    monkeypatch.chdir(folder)
    pm.execute_notebook(str(folder / "train.ipynb"), str(folder / "out.ipynb"), cwd=str(folder), kernel_name="python3",
                        parameters=notebook.parameterized(spec) if by_papermill else None, progress_bar=False)
    return nbformat.read(folder / "out.ipynb", as_version=4)


def _outputs(nb):
    return [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])]


def _text(nb):
    return "".join(o.get("text", "") for o in _outputs(nb)) + "".join(
        str(o.get("data", {}).get("text/plain", "")) for o in _outputs(nb))


def test_on_kaggle_it_stops_at_its_limit_with_a_checkpoint_and_the_next_session_continues(
        pydoc_data, tmp_path, monkeypatch):
    first_root = _kaggle(tmp_path / "s1", pydoc_data, layout="new")
    nb = _execute(tmp_path, "first", first_root, monkeypatch, steps_until=100_000, limit_min=0.25)
    text = _text(nb)
    assert "weights 41,984" in text
    assert any("image/png" in o.get("data", {}) for o in _outputs(nb)), "the loss plot is shown inline"
    working = first_root / "working"
    result = json.loads((working / "result.json").read_text())
    assert result["reason"] == "time limit" and not result["done"]
    saved = result["step"]
    assert (working / "checkpoints" / f"ckpt_{saved:08d}.pt").is_file()
    assert (working / "loss.png").stat().st_size > 10_000

    # The next session, on an older-layout machine, gets the data and the first output as inputs.
    second_root = _kaggle(tmp_path / "s2", pydoc_data, layout="old")
    shutil.copytree(working, second_root / "input" / "lab-ckpt-run")
    nb = _execute(tmp_path, "second", second_root, monkeypatch, steps_until=saved + 15, limit_min=5,
                  resume_from="lab-ckpt-run")
    assert f"at step {saved:,}" in _text(nb)
    rows = [json.loads(line) for line in (second_root / "working" / "metrics.jsonl").read_text().splitlines()]
    steps = [r["step"] for r in rows if "loss" in r]
    assert steps == list(range(1, saved + 16)), "one curve: the first session's rows, then the new ones"
    assert json.loads((second_root / "working" / "result.json").read_text())["done"]


def test_two_processes_under_torchrun_from_inside_the_notebook(pydoc_data, tmp_path, monkeypatch):
    root = _kaggle(tmp_path, pydoc_data, layout="new")
    temp = tmp_path / "tmp"  # the session's temporary files: the workers' script lies here while they run
    temp.mkdir()
    monkeypatch.setenv("TMPDIR", str(temp))
    nb = _execute(tmp_path, "ddp", root, monkeypatch, by_papermill=True, steps_until=6, nproc=2, batch_per_card=2,
                  constellations=["pydoc"])
    text = _text(nb)
    assert "launching 2 processes under torchrun" in text and "cpu x2" in text
    assert json.loads((root / "working" / "result.json").read_text())["step"] == 6
    assert not list(temp.glob("lab-kernel-*")), "a local session leaves no copy of the kernel behind"
    # The workers' file is the link's spec whole: the run as sent, the paths found, the limit's rest.
    sent, given = _spec(**{**TINY_PARAMS, "steps_until": 6, "nproc": 2, "batch_per_card": 2}), \
        LinkSpec.from_json((root / "working" / "worker-spec.json").read_text(encoding="utf-8"))
    assert given.run == sent.run and given.session.out_dir == str(root / "working")
    assert given.session.data_dir.endswith("lab-data-pydoc") and 0 < given.limit_min < sent.limit_min


def _when(condition, then, timeout_s=300):
    """Runs `then()` in a thread once `condition()` holds (checked every 50 ms)."""
    def wait():
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and not condition():
            time.sleep(0.05)
        then()
    thread = threading.Thread(target=wait, daemon=True)
    thread.start()
    return thread


def _rows_written(working, n, checkpoint=False):
    path = working / "metrics.jsonl"
    return lambda: (path.exists() and len(path.read_text().splitlines()) >= n
                    and (not checkpoint or list_checkpoints(working / "checkpoints")))


def _press_stop():
    """What Jupyter's stop button does: SIGINT to the kernel's process group."""
    kernel = next(pid for pid in descendants(os.getpid())
                  if b"ipykernel" in Path(f"/proc/{pid}/cmdline").read_bytes())
    os.killpg(os.getpgid(kernel), signal.SIGINT)


def test_the_stop_button_ends_a_two_process_run_with_result_metrics_plot_and_checkpoint(
        pydoc_data, tmp_path, monkeypatch):
    root = _kaggle(tmp_path, pydoc_data, layout="new")
    working = root / "working"
    stopper = _when(_rows_written(working, 3), _press_stop)
    nb = _execute(tmp_path, "stop", root, monkeypatch, steps_until=100_000, nproc=2, batch_per_card=2)
    stopper.join()
    result = json.loads((working / "result.json").read_text())
    assert result["reason"] == "SIGINT received" and not result["done"], result
    step = result["step"]
    assert result["checkpoint"].endswith(f"ckpt_{step:08d}.pt") and Path(result["checkpoint"]).is_file()
    assert max(r["step"] for r in read_metrics(working) if "loss" in r) == step
    assert (working / "loss.png").stat().st_size > 10_000
    assert f"stopped at step {step:,} (SIGINT received)" in _text(nb)


def test_a_crashed_rank_is_shown_and_the_other_ends_too_with_result_metrics_and_plot(
        pydoc_data, tmp_path, monkeypatch):
    root = _kaggle(tmp_path, pydoc_data, layout="new")
    working = root / "working"
    data = root / "input" / "datasets" / "lab" / "lab-data-pydoc"
    tokenizer = data / json.loads((data / "manifest.json").read_text())["tokenizer"]["file"]
    # Rank 0 reads the tokenizer at each evaluation (for its text sample): take it away mid-run.
    breaker = _when(_rows_written(working, 3, checkpoint=True), lambda: tokenizer.unlink())
    with pytest.raises(pm.PapermillExecutionError, match="TrainingFailed"):
        _execute(tmp_path, "crash", root, monkeypatch, steps_until=100_000, nproc=2, batch_per_card=2,
                 eval_every=10, checkpoint_every_min=0.0001)
    breaker.join()
    nb = nbformat.read(tmp_path / "crash" / "out.ipynb", as_version=4)
    text = _text(nb) + "".join("".join(o.get("traceback", [])) for o in _outputs(nb))
    assert "Traceback" in text and "tokenizer" in text, "the failed rank's traceback is shown"
    result = json.loads((working / "result.json").read_text())
    assert result["failed"] and result["reason"].startswith("failed: rank 0 failed: RuntimeError: NOT_FOUND"), result
    newest = list_checkpoints(working / "checkpoints")[-1]
    assert result["checkpoint"] == str(newest) and result["step"] == checkpoint_step(newest) >= 3
    assert (working / "loss.png").is_file() and read_metrics(working)


# --- lab run --machine local ---------------------------------------------------------------

RUN_FLAGS = ["-c", "pydoc", "--context", "32", "--width", "32", "--heads", "2", "--layers", "2",
             "--batch-per-card", "4", "--eval-every", "10", "--eval-batches", "2", "--lr", "3e-3",
             "--warmup-steps", "2", "-q"]


def test_lab_run_local_then_resume_continues_the_same_run(pydoc_data):
    # Cosine has no stable phase to grow from: more steps go on in the same run, re-warmed from its
    # last rate (a finished WSD run grows into a child from its pre-decay checkpoint: tests/test_grow.py).
    first = lab("run", "--machine", "local", *RUN_FLAGS, "--steps-until", "20", "--schedule", "cosine")
    run_id = first.stdout.split()[1].rstrip(":")
    folder = pydoc_data.parent.parent / "runs" / run_id
    assert (folder / "links" / "001-local.ipynb").is_file() and (folder / "loss.png").is_file()
    assert f"plot     {folder / 'loss.png'}" in first.stdout

    lab("run", "--machine", "local", "--resume", run_id, "--steps-until", "30", "-q")
    record = json.loads((folder / "run.json").read_text())
    assert [(l["from_step"], l["to_step"], l["status"]) for l in record["links"]] == [(0, 20, "done"), (20, 30, "done")]
    rows = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "loss" in r] == list(range(1, 31))

    listing = lab("runs").stdout
    assert run_id in listing and "30/30" in listing
    assert lab("plot", run_id, "--x", "tokens").stdout.strip().endswith("loss.png")


def test_lab_run_resume_with_a_conflicting_model_field_names_it(pydoc_data):
    first = lab("run", "--machine", "local", *RUN_FLAGS, "--steps-until", "5")
    run_id = first.stdout.split()[1].rstrip(":")
    proc = lab("run", "--machine", "local", "--resume", run_id, "--layers", "3", "--steps-until", "10", check=False)
    assert proc.returncode == 2
    assert "layers is locked when continuing: the checkpoint has layers=2" in proc.stderr


def test_ctrl_c_on_lab_run_saves_a_checkpoint_and_the_run_can_continue(pydoc_data):
    import signal
    import subprocess
    import sys
    import time
    from conftest import ROOT
    proc = subprocess.Popen([sys.executable, "-m", "lab.cli", "run", "--machine", "local", *RUN_FLAGS,
                             "--steps-until", "100000"], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    first = proc.stdout.readline()  # "run ID: FOLDER"
    folder = __import__("pathlib").Path(first.split(": ", 1)[1].strip())
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not (
            (folder / "metrics.jsonl").exists() and len((folder / "metrics.jsonl").read_text().splitlines()) > 3):
        time.sleep(0.1)
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0, out
    record = json.loads((folder / "run.json").read_text())
    assert record["links"][0]["status"] == "stopped" and record["links"][0]["reason"] == "SIGTERM received"
    assert record["links"][0]["checkpoint"]["step"] == record["links"][0]["to_step"] > 3


def test_a_run_here_speaks_to_a_person_on_the_terminal(pydoc_data):
    """The terminal of `lab run --machine local` (what ./scripts/demo shows): the loop's progress and the
    run's events, each once; the machine's own lines (the metrics echoed for a live curve, the kernel's
    start-up warnings) stay in the files."""
    proc = lab("run", "--machine", "local", *[f for f in RUN_FLAGS if f != "-q"], "--steps-until", "12",
               "--log-every", "1")
    text = proc.stdout + proc.stderr
    for machine_line in ("@lab-metrics", "[IPKernelApp]", "Kernel is running over TCP", "image ?"):
        assert machine_line not in text, machine_line
    lines = [line for line in text.splitlines() if line.strip()]
    assert not [line for line in set(lines) if lines.count(line) > 1], text
    assert "link 1 on this computer" in text and "step 12" in text, text
