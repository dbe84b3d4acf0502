"""The speed model: a step's parts fitted to measurements with a known answer, its intervals,
the sources of measurements, and each run's prediction against what it then measured."""
from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest

from lab import sizing
from lab.cli import main as lab_main
from lab.config import RunConfig
from lab.sizing import calibration, runtime
from lab.sizing.nnls import nnls
from lab.sizing.steptime import PARTS, Point, Size, fit


@pytest.fixture(autouse=True)
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("LAB_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


PRIOR = (1 / 100e9, 1 / 100e9, 1e-9, 1e-9, 2e-9, 1e-8, 5e-4, 1e-3)
# The "real" machine: matrix work 1.5× slower than the prior says, attention 0.7×, its cache
# spilling 2×, per-step costs 3×.
TRUTH = tuple(c * f for c, f in zip(PRIOR, (1.5, 0.7, 1.2, 2.0, 1.0, 2.0, 0.5, 3.0)))
SIZES = [Size(128, 128, 4, 4000, 8), Size(128, 256, 4, 4000, 8), Size(128, 128, 8, 4000, 8),
         Size(512, 128, 4, 4000, 2), Size(128, 128, 4, 4000, 32), Size(64, 64, 2, 4000, 4),
         Size(256, 192, 6, 4000, 4), Size(1024, 512, 8, 4000, 6), Size(64, 512, 1, 4000, 2),
         Size(256, 64, 12, 8000, 4), Size(128, 384, 2, 1000, 16), Size(32, 32, 2, 4000, 1, grad_accum=4)]


def true_step(size: Size) -> float:
    return sum(c * x for c, x in zip(TRUTH, size.parts()))


def points(sizes, noise=0.05) -> list[Point]:
    return [Point(f"p{i}", s, true_step(s), noise) for i, s in enumerate(sizes)]


def test_nnls_finds_the_constrained_minimum():
    # min (x1 - 1)² + (x2 + 1)² + (x1 + x2)² over x ≥ 0: x2 = 0, then x1 = 1/2
    assert nnls([[1, 0], [0, 1], [1, 1]], [1, -1, 0]) == pytest.approx([0.5, 0.0])
    assert nnls([[2, 0], [0, 3]], [4, 9]) == pytest.approx([2.0, 3.0])  # unconstrained optimum inside


def test_one_measurement_rescales_the_prior_as_a_whole():
    a, b = SIZES[0], SIZES[7]
    f = fit(PRIOR, 0.3, [Point("a", a, 0.05)])
    assert f.step_s(a) == pytest.approx(0.05, rel=1e-6)
    prior_ratio = sum(c * x for c, x in zip(PRIOR, b.parts())) / sum(c * x for c, x in zip(PRIOR, a.parts()))
    assert f.step_s(b) / f.step_s(a) == pytest.approx(prior_ratio, rel=1e-6)  # today's rule, with the parts


def test_many_measurements_recover_known_parts():
    f = fit(PRIOR, 0.3, points(SIZES, noise=0.01))  # precise measurements outweigh the prior's shape
    for s in (Size(192, 160, 5, 4000, 6), Size(2048, 256, 4, 4000, 1), Size(64, 128, 16, 4000, 8)):
        assert f.step_s(s) == pytest.approx(true_step(s), rel=0.03)
    assert all(c >= 0 for c in f.seconds)


def test_two_measurements_are_met_and_tilt_the_shape_toward_the_truth():
    a, b, c = SIZES[5], SIZES[7], SIZES[0]  # tiny, the reference size, the demo's size between them
    two = fit(PRIOR, 0.3, points([a, b]))
    assert two.step_s(a) == pytest.approx(true_step(a), rel=0.03)
    assert two.step_s(b) == pytest.approx(true_step(b), rel=0.03)
    one = fit(PRIOR, 0.3, points([a]))
    assert abs(two.step_s(c) / true_step(c) - 1) < abs(one.step_s(c) / true_step(c) - 1)


def test_a_part_the_truth_lacks_is_fitted_at_zero_not_below():
    weights = PARTS.index("weights")
    truth = TRUTH[:weights] + (0.0,) + TRUTH[weights + 1:]
    pts = [Point(f"p{i}", s, sum(c * x for c, x in zip(truth, s.parts()))) for i, s in enumerate(SIZES)]
    f = fit(PRIOR, 1.0, pts)
    assert all(c >= 0 for c in f.seconds)
    assert f.seconds[weights] < 0.2 * TRUTH[weights]


def test_a_cpu_whose_cache_spills_is_slower_per_token_at_a_bigger_batch_and_the_fit_says_so():
    """Fixed costs alone would make every bigger batch faster per token; the spill part lets the
    fit follow a machine whose elementwise work slows once one layer's activations outgrow its
    cache (this CPU's fp32 lean step: 8% fewer tokens/s at batch 32 than at 16)."""
    cpu_like = (5e-12, 9e-12, 1.5e-8, 1.2e-7, 5e-9, 2e-9, 1e-3, 0.0)  # about this CPU's fp32
    prior = tuple(c * (0.5 if name == "spill" else 1.0) for c, name in zip(cpu_like, PARTS))
    def step(size, parts=cpu_like):
        return sum(c * x for c, x in zip(parts, size.parts()))
    at = {b: Size(128, 128, 4, 4000, b) for b in (2, 8, 16, 64)}
    assert at[64].tokens_per_step / step(at[64]) < 0.9 * at[16].tokens_per_step / step(at[16])
    one = fit(prior, 0.3, [Point("b8", at[8], step(at[8]), 0.01)])
    three = fit(prior, 0.3, [Point(f"b{b}", at[b], step(at[b]), 0.01) for b in (2, 8, 16)])
    assert at[64].tokens_per_step / one.step_s(at[64]) < at[16].tokens_per_step / one.step_s(at[16])
    err = {f: abs(f.step_s(at[64]) / step(at[64]) - 1) for f in (one, three)}
    assert err[three] < err[one] and err[three] < 0.1  # the measured batches tell more of the spill


def test_a_gpu_prior_has_no_spill_and_a_fit_keeps_it_none():
    from lab.sizing import priors
    spill = PARTS.index("spill")
    t4 = priors.prior(sizing.CARDS["T4"], "fp16")
    assert t4.parts[spill] == 0.0
    f = fit(t4.parts, 0.6, [Point("a", SIZES[0], 0.01), Point("b", SIZES[4], 0.05)])
    assert f.seconds[spill] == 0.0


def test_intervals_widen_away_from_the_measurements():
    a = SIZES[0]
    f = fit(PRIOR, 0.3, [Point("a", a, true_step(a))])
    near, far = f.spread(a), f.spread(SIZES[7])
    assert near == pytest.approx(math.sqrt(2) * 0.05, rel=0.2)  # the point's own noise, and a new run's
    assert far > 1.2 * near
    lo, hi = f.tok_s_interval(SIZES[7])
    assert lo < SIZES[7].tokens_per_step / f.step_s(SIZES[7]) < hi


def test_intervals_narrow_as_measurements_come_in():
    target = Size(192, 160, 5, 4000, 6)  # measured by none of them
    spreads = [fit(PRIOR, 0.3, points(SIZES[:n])).spread(target) for n in (1, 2, 4, 8)]
    assert spreads == sorted(spreads, reverse=True)
    own = [math.sqrt(s * s - 0.05 ** 2) for s in spreads]  # the fit's own part, beside a new run's noise
    assert own[-1] < 0.5 * own[0]


def write_run(home: Path, run_id: str, tok_s: float, gpu="cpu", precision="fp32", compiled=None, steps=60,
              threads=None, others_cpu=None, wobble=0.0, **cfg):
    """A run folder as `lab train` writes it; `wobble`: its sync windows' rates alternate ±that share."""
    folder = home / "runs" / run_id
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(RunConfig(gpu=gpu, precision=precision, **cfg).to_json())
    device = {"gpu": gpu, "device": "cpu" if gpu == "cpu" else "cuda", "precision": precision}
    (folder / "device.json").write_text(json.dumps({**device, **({"threads": threads} if threads else {})}))
    if compiled is not None:
        (folder / "result.json").write_text(json.dumps({"compile_s": 12.0 if compiled else None}))
    with open(folder / "metrics.jsonl", "w") as f:
        for i in range(1, steps + 1):
            rate = tok_s * (1 + wobble * (-1) ** i) if i > 20 else tok_s / 10
            row = {"step": i, "tok_s": rate, "elapsed_s": i * 0.1, "session": 1}
            f.write(json.dumps({**row, **({"others_cpu": others_cpu} if others_cpu is not None else {})}) + "\n")
    return folder


DEMO = dict(layers=4, width=128, heads=4, context=128, batch_per_card=8)


def test_a_calibrated_figure_says_from_which_measurements(home):
    write_run(home, "demo-run", 12_000, **DEMO)
    e = sizing.estimate(RunConfig(gpu="cpu", precision="fp32", layers=6, width=192, heads=6, context=256,
                                  batch_per_card=4), manifest={})
    assert e.tok_s.kind == "calibrated" and e.tok_s.extra["from"] == ["demo-run"] and "demo-run" in e.tok_s.note
    assert e.tok_s.extra["basis"] == "lab"
    lo, hi = e.tok_s.extra["interval"]
    assert lo < e.tok_s.value < hi
    lo_h, hi_h = e.run_hours.extra["interval"]
    assert lo_h < e.run_hours.value < hi_h
    assert sum(e.tok_s.extra["parts"].values()) == pytest.approx(1, abs=0.01)


def test_another_source_of_measurements_counts_as_the_lab_runs_do(home, monkeypatch, tmp_path):
    burst = write_run(tmp_path / "elsewhere", "ssh-check", 9_000, **DEMO)
    monkeypatch.setattr(sizing.speeds, "SOURCES", sizing.speeds.SOURCES + [lambda: [("check:box1", str(burst))]])
    e = sizing.estimate(RunConfig(gpu="cpu", precision="fp32", **DEMO), manifest={})
    assert (e.tok_s.value, e.tok_s.kind, e.tok_s.extra["from"]) == (9_000, "measured", ["check:box1"])


def test_compiled_runs_speak_for_compiled_runs(home):
    write_run(home, "eager", 70_000, gpu="2xT4", precision="fp16", compiled=False)
    write_run(home, "compiled", 100_000, gpu="2xT4", precision="fp16", compiled=True)
    assert sizing.estimate(RunConfig(gpu="2xT4"), manifest={}).tok_s.value == 100_000  # GPUs compile (auto)
    assert sizing.estimate(RunConfig(gpu="2xT4", torch_compile="off"), manifest={}).tok_s.value == 70_000


def test_the_cpu_compile_threshold_is_the_kernels():
    speed = pytest.importorskip("lab.kernel.speed")
    assert runtime.CPU_COMPILE_MIN_FLOPS == speed.COMPILE_MIN_FLOPS_CPU


def test_a_runs_prediction_is_kept_from_before_it_measured_itself(home, capsys):
    write_run(home, "demo-run", 12_000, **DEMO)
    folder = home / "runs" / "next"
    folder.mkdir(parents=True)
    cfg = RunConfig(gpu="cpu", precision="fp32", layers=6, width=192, heads=6, context=256, batch_per_card=4)
    first = calibration.record_prediction(folder, cfg)
    assert first["kind"] == "calibrated" and first["from"] == ["demo-run"]
    assert json.loads((folder / "predicted.json").read_text())["predictions"]["cpu"]["tok_s"] == first["tok_s"]
    write_run(home, "next", first["tok_s"] * 1.25, **{k: getattr(cfg, k) for k in DEMO})  # it measures itself
    assert calibration.record_prediction(folder, cfg) == first  # a later prediction would count its own rows
    c = calibration.check(folder)
    assert c.measured == pytest.approx(first["tok_s"] * 1.25)
    assert c.error == pytest.approx(1 / 1.25 - 1)
    assert c.text().endswith("-20%)")
    assert lab_main(["size", "--calibration"]) == 0
    line = capsys.readouterr().out.strip()
    assert line.startswith("calibration: 1 run(s)") and "20%" in line and "next" in line
    lo, hi = first["interval"]
    inside = lo <= first["tok_s"] * 1.25 <= hi
    assert f"coverage {int(inside)} of 1 within their 95% interval" in line


def test_lab_size_calibration_with_nothing_to_compare_says_so(capsys):
    assert lab_main(["size", "--calibration"]) == 0
    assert "no run has both a prediction and a measured speed" in capsys.readouterr().out


def test_lab_runs_shows_the_measured_speed_beside_the_prediction(home, capsys):
    from lab.runs import Settled, create_run
    cfg = RunConfig(gpu="cpu", precision="fp32", **DEMO)
    write_run(home, "earlier", 10_000, layers=2, width=64, heads=2, context=64, batch_per_card=4)
    run = create_run(Settled.whole(cfg))
    pred = calibration.record_prediction(run.folder, cfg)
    write_run(home, run.id, pred["tok_s"] / 2, **DEMO)
    assert lab_main(["runs"]) == 0
    out = capsys.readouterr().out
    assert f"(pred. {pred['tok_s']:,.0f}, +100%)" in out


def test_the_cpu_prior_is_the_one_measured_on_the_threads_a_run_takes_else_scaled_from_the_nearest(monkeypatch):
    from lab.sizing import priors
    cpu = sizing.CARDS["cpu"]
    most = max(priors.CPU_PARTS)
    for threads in priors.CPU_PARTS:
        monkeypatch.setenv("OMP_NUM_THREADS", str(threads))
        pri = priors.prior(cpu, "fp32")
        assert pri.parts == priors.CPU_PARTS[threads]["fp32"] and pri.threads == threads and "scaled" not in pri.note
    monkeypatch.setenv("OMP_NUM_THREADS", str(2 * most))
    more = priors.prior(cpu, "fp32")
    k = priors.CPU_PARALLEL_PARTS
    assert [a / b for a, b in zip(priors.CPU_PARTS[most]["fp32"][:k], more.parts[:k])] == pytest.approx([2.0] * k)
    assert more.parts[k:] == priors.CPU_PARTS[most]["fp32"][k:]  # launches and Python stay on one thread
    assert f"scaled from {most} thread(s)" in more.note and f"{2 * most} CPU thread(s)" in more.note


def test_a_run_records_its_threads_and_the_load_beside_it_and_the_calculator_reads_both(home):
    folder = write_run(home, "loaded", 10_000, threads=2, others_cpu=0.4, wobble=0.1, **DEMO)
    (m,) = sizing.measured_runs("cpu")
    assert (m.threads, m.others_cpu) == (2, 0.4) and m.spread == pytest.approx(0.1, rel=0.01)
    assert folder.name == m.run


def test_a_measurement_on_other_threads_informs_this_count_with_a_wider_interval(home, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    cfg = RunConfig(gpu="cpu", precision="fp32", layers=6, width=192, heads=6, context=256, batch_per_card=4)
    write_run(home, "two-threads", 10_000, threads=2, **DEMO)
    same = sizing.estimate(cfg, manifest={})
    shutil.rmtree(home / "runs" / "two-threads")
    write_run(home, "one-thread", 10_000, threads=1, **DEMO)  # the same speed, had it trained on one thread
    other = sizing.estimate(cfg, manifest={})
    assert same.tok_s.kind == other.tok_s.kind == "calibrated" and other.tok_s.extra["threads"] == 2
    width = lambda e: e.tok_s.extra["interval"][1] / e.tok_s.extra["interval"][0]  # noqa: E731
    assert width(other) > 1.3 * width(same)
    assert other.tok_s.value != same.tok_s.value  # converted through the two counts' priors


def test_a_measurement_under_load_widens_the_interval_and_the_figure_says_which_load_it_predicts(home):
    cfg = RunConfig(gpu="cpu", precision="fp32", layers=6, width=192, heads=6, context=256, batch_per_card=4)
    write_run(home, "quiet", 10_000, others_cpu=0.02, **DEMO)
    quiet = sizing.estimate(cfg, manifest={}).tok_s
    assert "machine to itself" in quiet.note and "машины без другой работы" in quiet.note_ru
    shutil.rmtree(home / "runs" / "quiet")
    write_run(home, "busy", 10_000, others_cpu=0.5, **DEMO)
    busy = sizing.estimate(cfg, manifest={}).tok_s
    assert "other work used ~50% of the cores" in busy.note and busy.extra["others_cpu"] == 0.5
    width = lambda f: f.extra["interval"][1] / f.extra["interval"][0]  # noqa: E731
    assert width(busy) > 2 * width(quiet)


def test_a_measured_size_is_as_sure_as_its_runs_agree(home):
    cfg = RunConfig(gpu="cpu", precision="fp32", **DEMO)
    write_run(home, "a", 10_000, **DEMO)
    write_run(home, "b", 10_400, **DEMO)
    steady = sizing.estimate(cfg, manifest={}).tok_s
    shutil.rmtree(home / "runs" / "b")
    write_run(home, "c", 14_000, **DEMO)
    apart = sizing.estimate(cfg, manifest={}).tok_s
    assert steady.kind == apart.kind == "measured"
    lo, hi = apart.extra["interval"]
    assert lo <= 10_000 and hi >= 14_000  # the next run may land where either of them did
    assert steady.extra["interval"][1] / steady.extra["interval"][0] < hi / lo


def test_a_cpu_run_compiles_only_when_long_enough_and_its_time_counts_it(monkeypatch):
    monkeypatch.setattr(runtime.shutil, "which", lambda name: "/usr/bin/g++")  # a C++ compiler is there
    def parts(steps):
        cfg = RunConfig(gpu="cpu", machine="local", steps_until=steps, limit_min=0, **DEMO)
        return sizing.estimate(cfg, manifest={}, runs=[]).run_hours.extra["parts"]
    flops_per_step = sizing.flops_per_token(4, 128, 4000, 128) * 8 * 128
    few = int(runtime.CPU_COMPILE_MIN_FLOPS / flops_per_step) - 10
    assert parts(few)["compiling"] == 0
    assert parts(few + 20)["compiling"] == pytest.approx(runtime.COMPILE_S["cpu"] / 3600, abs=1e-3)
    assert parts(few + 20)["session_starts"] == pytest.approx(runtime.LOCAL_START_S / 3600, abs=1e-3)


@pytest.mark.parametrize("threads,precision,saved", [(1, "fp32", "xeon-1core"), (1, "bf16", "xeon-1core"),
                                                     (2, "fp32", "epyc-2threads"), (2, "bf16", "epyc-2threads")])
def test_the_cpu_prior_is_what_bench_prior_fits_to_its_saved_step_times(threads, precision, saved):
    """The constants are a measurement: scripts/bench_prior.py's own fit of the step times it saved."""
    import importlib.util
    from lab.sizing.priors import CPU_PARTS
    scripts = Path(__file__).resolve().parents[2] / "scripts"
    spec = importlib.util.spec_from_file_location("bench_prior", scripts / "bench_prior.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    times = bench.load_times(str(scripts / "measured" / f"bench_prior-{saved}-{precision}.json"))
    assert set(times) <= set(bench.GRID) and len(times) >= 26  # the Xeon's files predate the grid's last 3 sizes
    assert CPU_PARTS[threads][precision] == pytest.approx(bench.fit_parts(times), rel=5e-3, abs=1e-15)


def test_a_kaggle_accounts_measured_sessions_are_its_start_and_output_copy(home):
    """What lab.kaggle.sessions recorded of an account's sessions enters its run time."""
    from lab.sizing.runtime import kaggle_session_costs
    assert kaggle_session_costs("alice").start_s == sizing.STARTUP_MIN * 60  # nothing measured yet
    folder = home / "accounts" / "alice"
    folder.mkdir(parents=True)
    rows = [{"boot_s": b, "data_checks_s": 30.0, "output_copy_s": 45.0} for b in (100.0, 140.0, 900.0)]
    (folder / "sessions.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    costs = kaggle_session_costs("alice")
    assert (costs.start_s, costs.end_s) == (140.0 + 30.0, 45.0)  # the medians
    assert "3 session(s) of alice" in costs.note
    assert kaggle_session_costs(None).start_s == sizing.STARTUP_MIN * 60  # Auto, before it picks


def test_one_of_the_labs_boxes_spends_no_kaggle_quota(home):
    from lab.sizing.estimate import on_kaggle
    (home / "machines" / "box-a").mkdir(parents=True)  # as `lab machines add` keeps a box
    assert on_kaggle("alice") and not on_kaggle("box-a") and not on_kaggle("local") and not on_kaggle("auto")
