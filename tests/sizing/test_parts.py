"""A machine's parts, measured: the short microbenchmark (lab.trial.parts) sets the shape of the
speed model, a measured run the level; the calculator says which shape it used. The timings here
are made up (a machine whose step is its parts, at a level the microbenchmark misses): what is
tested is the arithmetic, not this computer's speed."""
from __future__ import annotations

import json
import math

import pytest

from conftest import lab_here
from lab import sizing
from lab.api import sizing as api_sizing
from lab.config import RunConfig
from lab.sizing import machine
from lab.sizing.priors import cpu_threads, prior
from lab.sizing.speedmodel import point_of, scatters
from lab.sizing.steptime import CACHE_BYTES, Curves, Size, rate_factor

# A made-up CPU: matrix products four times slower per FLOP at d 64 than at d 512 (as small products
# are on a CPU), a fixed cost per layer and per step that small models feel.
CURVE = [[64, 6e-10], [128, 2.5e-10], [256, 1.4e-10], [512, 1e-10]]
ATTENTION = [[128, 3e-10], [512, 2e-10]]  # a longer context's attention runs faster per FLOP
TRUTH = {"attention": 2e-10, "logits": 1e-8, "weights": 4e-9, "layer": 3e-3, "step": 5e-3,
         "activation": 6e-8, "spill": 4e-8}
LEVEL = 1.3  # a whole step of the lab's model runs this much slower than its parts' sum


def record(threads: int | None = None, curve=CURVE, **change) -> dict:
    """What lab.trial.parts.measure_parts would have measured on that CPU."""
    t = {**TRUTH, **change}
    elementwise = {}
    for key, (b, n, d) in {"small": (2, 64, 512), "large": (16, 512, 512)}.items():
        tensor = 4.0 * b * n * d
        per = t["activation"] + t["spill"] * tensor / (tensor + CACHE_BYTES)
        elementwise[key] = {"batch": b, "context": n, "width": d, "s_per_element": per}
    return {"format": 1, "device": "cpu", "precision": "fp32", "matmul": curve, "attention": ATTENTION,
            "elementwise": elementwise, "logits": t["logits"], "weights": t["weights"], "layer": t["layer"],
            "step": t["step"], "threads": threads or cpu_threads(), "spread": 0.02, "seconds": 5.0}


def true_step(size: Size) -> float:
    u = size.parts(Curves(tuple((float(w), s) for w, s in CURVE), tuple((float(n), s) for n, s in ATTENTION)))
    parts = (CURVE[-1][1], TRUTH["attention"], TRUTH["activation"], TRUTH["spill"], TRUTH["logits"],
             TRUTH["weights"], TRUTH["layer"], TRUTH["step"])
    return LEVEL * sum(c * x for c, x in zip(parts, u))


@pytest.fixture(autouse=True)
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("LAB_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


A = dict(layers=4, width=128, heads=4, context=128, batch_per_card=8)  # the size a person measures first
OTHERS = [dict(layers=6, width=192, heads=6, context=256, batch_per_card=4),
          dict(layers=3, width=256, heads=8, context=128, batch_per_card=8),
          dict(layers=8, width=128, heads=4, context=128, batch_per_card=8),
          dict(layers=2, width=192, heads=6, context=64, batch_per_card=16)]


def size_of(fields: dict) -> Size:
    return Size(fields["context"], fields["width"], fields["layers"], 4000, fields["batch_per_card"])


def run_of(name: str, fields: dict, tok_s: float) -> sizing.Measured:
    return sizing.Measured(name, "cpu", "fp32", fields["context"], fields["width"], fields["heads"], fields["layers"],
                           4000, fields["batch_per_card"], tok_s, threads=cpu_threads())


def predicted(fields: dict, runs: list) -> float:
    return sizing.estimate(RunConfig(gpu="cpu", precision="fp32", machine="local", **fields), manifest={},
                           runs=runs).tok_s.value


def test_a_rate_curve_is_made_monotone_and_read_by_width_or_context():
    noisy = [(64, 4e-10), (128, 1.5e-10), (256, 2.5e-10), (512, 1e-10)]  # 256 timed in a busy second
    curve = machine.monotone(noisy)
    costs = [s for _, s in curve]
    assert costs == sorted(costs, reverse=True) and costs[1] == costs[2] == pytest.approx(math.sqrt(1.5e-10 * 2.5e-10))
    assert rate_factor(curve, 512) == 1.0 and rate_factor(curve, 1024) == 1.0  # flat past the widest
    assert rate_factor(curve, 64) == pytest.approx(4.0) and rate_factor(curve, 32) == pytest.approx(4.0)
    t = math.log(90 / 64) / math.log(2)  # log-log between the widths measured
    assert rate_factor(curve, 90) == pytest.approx(4.0 ** (1 - t) * (costs[1] / 1e-10) ** t)
    assert rate_factor((), 64) == 1.0


def test_a_records_elementwise_work_splits_into_its_cost_in_cache_and_past_it():
    shape = machine.shape_of(record(), "this computer", "этом компьютере")
    assert shape.parts == pytest.approx((1e-10, 2e-10, 6e-8, 4e-8, 1e-8, 4e-9, 3e-3, 5e-3), rel=1e-6)


def test_the_parts_set_the_shape_and_one_run_the_level(home):
    machine.save_local(record())
    run = run_of("A", A, size_of(A).tokens_per_step / true_step(size_of(A)))
    for fields in OTHERS:
        truth = size_of(fields).tokens_per_step / true_step(size_of(fields))
        assert predicted(fields, [run]) == pytest.approx(truth, rel=0.02)
    e = sizing.estimate(RunConfig(gpu="cpu", precision="fp32", machine="local", **OTHERS[0]), manifest={}, runs=[run])
    assert e.tok_s.kind == "calibrated" and e.tok_s.extra["shape"] == "measured parts"
    assert "its shape from the parts measured on this computer" in e.tok_s.note and "части, измеренные" in e.tok_s.note_ru


def test_without_its_parts_the_prior_of_another_processor_misses_the_shape(home):
    run = run_of("A", A, size_of(A).tokens_per_step / true_step(size_of(A)))
    misses = [abs(predicted(f, [run]) / (size_of(f).tokens_per_step / true_step(size_of(f))) - 1) for f in OTHERS]
    assert max(misses) > 0.15  # what the measured parts above bring within 2%
    e = sizing.estimate(RunConfig(gpu="cpu", precision="fp32", machine="local", **A), manifest={}, runs=[])
    assert e.tok_s.extra["shape"] == "prior" and "not measured" in e.tok_s.extra["shape_note"]


def test_another_processors_parts_or_another_thread_count_are_not_used(home, monkeypatch):
    path = machine.save_local(record())
    assert machine.local_shape("fp32", cpu_threads()) is not None
    assert machine.local_shape("fp32", cpu_threads() + 1) is None and machine.local_shape("bf16", cpu_threads()) is None
    path.write_text(json.dumps({**json.loads(path.read_text()), "processor": "another CPU"}))
    assert machine.local_shape("fp32", cpu_threads()) is None


def test_a_kaggle_probe_and_a_box_check_give_their_cards_parts(home):
    card = {**record(), "device": "cuda", "precision": "fp16", "threads": None}
    probe = home / "accounts" / "alice" / "probe.json"
    probe.parent.mkdir(parents=True)
    probe.write_text(json.dumps({"gpu": "2xT4", "at": "2026-12-01T10:00:00+00:00",
                                 "facts": {"worker": {"world": 2, "all_reduce": {"bus_gb_s": 5.0}, "parts": card}}}))
    shape = machine.card_shape("2xT4", "fp16")
    assert shape.where == "probe of alice" and shape.parts[3] == 0.0  # a GPU's elementwise work is not cached
    assert shape.parts[5] == pytest.approx(4e-9 + 0.2 * 4 / 5e9)  # the optimizer, and the all-reduce left exposed
    pri = prior(sizing.card_for("2xT4"), "fp16")
    assert pri.shape == shape and pri.curves == shape.curves
    ref = Size(1024, 512, 8, 4000, 6, 1, 2)
    assert ref.tokens_per_step / sum(c * x for c, x in zip(pri.parts, ref.parts(pri.curves))) == pytest.approx(102_000)
    box = home / "machines" / "gpubox" / "check.json"
    box.parent.mkdir(parents=True)
    box.write_text(json.dumps({"gpu": "2xT4", "at": "2026-12-02T10:00:00+00:00",
                               "hosts": [{"host": "gpubox", "worker": {"world": 1, "parts": card}}]}))
    assert machine.card_shape("2xT4", "fp16").where == "check of gpubox"  # the newest measurement
    e = sizing.estimate(RunConfig(gpu="2xT4", layers=12), manifest={}, runs=[])
    assert "its shape from the parts measured on check of gpubox" in e.tok_s.note


def test_runs_of_one_size_that_disagree_weigh_less():
    steady = [run_of("b1", A, 10_000), run_of("b2", A, 10_100)]
    jumpy = [run_of("a1", A, 15_000), run_of("a2", A, 20_000)]
    apart = scatters(steady + jumpy[:1])
    assert apart[(steady[0].size_key(), steady[0].threads)] == pytest.approx(15_000 / 10_100 - 1)
    quiet = point_of(steady[0], scatter=scatters(steady)[(steady[0].size_key(), steady[0].threads)])
    loud = point_of(jumpy[0], scatter=scatters(jumpy)[(jumpy[0].size_key(), jumpy[0].threads)])
    assert loud.noise > 0.1 > quiet.noise


def test_lab_size_measures_this_computers_parts_once_and_says_so(home, monkeypatch):
    calls = []

    def measure(precision, threads=None):  # the microbenchmark's result, without its 10 s of torch
        calls.append((precision, threads))
        return machine.save_local(record(threads))
    monkeypatch.setattr(api_sizing, "measure_parts", measure)
    monkeypatch.setattr(api_sizing, "load_per_core", lambda: 3.0)  # busy: it waits for a quiet moment
    monkeypatch.setenv("LAB_MEASURE_PARTS", "1")
    args = ("size", "--gpu", "cpu", "--precision", "fp32", "--machine", "local", "--layers", "2", "--width", "64",
            "--heads", "2", "--context", "64")
    code, out, err = lab_here(*args)
    assert code == 0 and "this computer is busy (load 3.0 per core)" in err and not calls
    monkeypatch.setattr(api_sizing, "load_per_core", lambda: 0.1)
    code, out, err = lab_here(*args)
    assert code == 0 and "measuring this computer's parts once" in err
    assert "speed: " in out and "the parts measured on this computer" in out
    code, out, err = lab_here(*args)
    assert len(calls) == 1 and "measuring" not in err  # kept under the lab home
    monkeypatch.setenv("LAB_MEASURE_PARTS", "0")
    machine.local_file("fp32", cpu_threads()).unlink()
    code, out, err = lab_here(*args)
    assert len(calls) == 1 and "the lab's rough guess" in out  # off: the prior, said as such
    lab_here(*args, "--measure-parts")
    assert len(calls) == 2  # asked for, it measures even so


def test_the_microbenchmark_gives_a_record_the_calculator_reads(monkeypatch):
    from lab.trial import parts, worker
    import torch
    monkeypatch.setattr(parts, "WIDTHS", {"cpu": (16, 32)})
    monkeypatch.setattr(parts, "TOKENS", {"cpu": 64})
    monkeypatch.setattr(parts, "CONTEXTS", {"cpu": (8, 16)})
    monkeypatch.setattr(parts, "ELEMENTWISE", {"cpu": {"small": (1, 8, 16), "large": (2, 32, 64)}})
    monkeypatch.setattr(parts, "MIN_S", {"cpu": 0.0})
    monkeypatch.setattr(parts, "WEIGHTS", {"cpu": 1 << 14})
    got = worker.card_parts(torch.device("cpu"), "fp32")  # what a probe's rank 0 adds to its result on a GPU
    assert got["format"] == 1 and got["device"] == "cpu" and got["precision"] == "fp32"
    assert [w for w, _ in got["matmul"]] == [16, 32] and all(s > 0 for _, s in got["matmul"])
    assert [n for n, _ in got["attention"]] == [8, 16] and all(s > 0 for _, s in got["attention"])
    assert got["logits"] > 0 and got["weights"] > 0 and got["layer"] >= 0
    shape = machine.shape_of(replace_threads(got), "this computer", "этом компьютере")
    assert len(shape.parts) == len(sizing.PARTS) and all(p >= 0 for p in shape.parts)
    def broken(*args):
        raise RuntimeError("no kernel for this")
    monkeypatch.setattr(parts, "attention_rates", broken)  # a measurement that fails is recorded, not raised
    assert worker.card_parts(torch.device("cpu"), "fp32") == {"error": "RuntimeError: no kernel for this"}


def replace_threads(rec: dict) -> dict:
    return {**rec, "threads": rec.get("threads") or 1}


def test_parts_measured_on_a_busy_machine_are_not_used_and_the_figure_says_so(home):
    busy = machine.shape_of({**record(), "load": 3.0, "cpus": 2}, "this computer", "этом компьютере")
    quiet = machine.shape_of({**record(), "load": 0.4, "cpus": 2}, "this computer", "этом компьютере")
    jumpy = machine.shape_of({**record(), "spread": 0.6}, "this computer", "этом компьютере")
    assert busy.unsteady and jumpy.unsteady and not quiet.unsteady
    assert "busy then (load 1.5 per core)" in busy.note and "занята" in busy.note_ru and "moved by 60%" in jumpy.note
    machine.save_local({**record(), "load": 3.0, "cpus": 2})
    assert machine.local_shape("fp32", cpu_threads()) is None  # two threads beside a busy core wait on each other
    e = sizing.estimate(RunConfig(gpu="cpu", precision="fp32", machine="local", **A), manifest={}, runs=[])
    assert e.tok_s.extra["shape"] == "prior" and "own parts, measured on" in e.tok_s.note
    assert "are not used: the machine was busy then" in e.tok_s.note


def test_the_form_measures_this_computers_parts_in_the_background_then_uses_them(home, monkeypatch):
    import threading
    from lab import ui
    release = threading.Event()

    def measure(precision, threads=None):  # as the microbenchmark would, once let go
        release.wait(10)
        return machine.save_local({**record(threads), "precision": precision})
    monkeypatch.setattr(api_sizing, "measure_parts", measure)
    monkeypatch.setattr(api_sizing, "load_per_core", lambda: 3.0)
    monkeypatch.setenv("LAB_MEASURE_PARTS", "1")
    ui.set_language("en")
    try:
        form = ui.NewRunForm(gpu="cpu", machine="local", layers=2, width=64, heads=2, context=64)
        assert "busy now: its parts will be measured when it is quiet" in form.calc.value  # not beside other work
        monkeypatch.setattr(api_sizing, "load_per_core", lambda: 0.1)
        form.set(layers=2)
        assert "measuring this computer&#x27;s parts once" in form.calc.value
        assert "the lab&#x27;s rough guess" in form.calc.value  # meanwhile the prior, said as such
        release.set()
        api_sizing._background[str(machine.local_file(form.estimate.precision, cpu_threads()))].join(10)
        form.set(layers=3)  # the next change of a field
        assert "measuring" not in form.calc.value and "the parts measured on this computer" in form.calc.value
    finally:
        release.set()
        ui.set_language("ru")
