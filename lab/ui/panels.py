"""The control notebook's panels around the form: setup, machines, monitor and runs."""
from __future__ import annotations

import threading
import time

import ipywidgets as widgets

from lab import __version__, sizing
from lab.ui import backend
from lab.config import UserError
from lab.home import lab_home
from lab.kernel.metrics import read_metrics
from lab.kernel.plots import figure_png, loss_figure
from lab.machines.live import curve_rows
from lab.ui.text import Panel, esc, hours, lang, language_switch, on_language, status_word, tr

LIVE = ("new", "starting", "running", "waiting")
LOG_LINES = 12  # the log tail shown: its newest lines, no scrolling needed
CELL = "padding:2px 8px;text-align:left;vertical-align:top"


def _table(head: list[str], rows: list[list[str]], cls: str) -> str:
    """An HTML table; cells are HTML already escaped by the caller."""
    th = "".join(f"<th style='{CELL};border-bottom:1px solid #ccc'>{h}</th>" for h in head)
    body = "".join("<tr>" + "".join(f"<td style='{CELL}'>{c}</td>" for c in r) + "</tr>" for r in rows)
    return f"<table class='{cls}' style='border-collapse:collapse;font-size:90%'><tr>{th}</tr>{body}</table>"


def newest_first(runs: list) -> list:
    return sorted(runs, key=lambda r: (r.created, r.id), reverse=True)


def _png(runs: dict[str, list[dict]], x: str, title: str | None = None) -> bytes:
    return figure_png(loss_figure(runs, x=x, title=title))


def _x_toggle() -> widgets.ToggleButtons:
    return widgets.ToggleButtons(options=[("", "step"), ("", "tokens")], value="step",
                                 style={"button_width": "80px"})


def _x_labels(toggle: widgets.ToggleButtons) -> None:
    value = toggle.value
    toggle.options = [(tr("steps", "шаги"), "step"), (tr("tokens", "токены"), "tokens")]
    toggle.value = value


# ---------------------------------------------------------------------------------------
# 1. Setup


class SetupPanel(Panel):
    """The lab home, the version, this computer's GPU, and the language switch."""

    def __init__(self):
        self.info = widgets.HTML()
        self.info.add_class("lab-setup")
        self.box = widgets.VBox([widgets.HBox([language_switch()]), self.info])
        on_language(self.render)
        self.render()

    def render(self) -> None:
        _, gpu = backend.local_gpu()
        rows = [[esc(tr("Version", "Версия")), f"lab {esc(__version__)}"],
                [esc(tr("Lab home", "Дом лабы")), f"<code>{esc(lab_home())}</code>"],
                [esc(tr("This computer's GPU", "Видеокарта этого компьютера")), esc(gpu)]]
        self.info.value = _table([esc(tr("The lab", "Лаба")), ""], rows, "lab-setup-table")


# ---------------------------------------------------------------------------------------
# 2. Machines


class MachinesPanel(Panel):
    """Each Kaggle account with its quota bar and running runs, and the local card."""

    def __init__(self):
        self.refresh_button = widgets.Button(icon="refresh", layout=widgets.Layout(width="auto"))
        self.refresh_button.on_click(lambda _: self.refresh())
        self.list = widgets.VBox()
        self.box = widgets.VBox([self.refresh_button, self.list])
        self.box.add_class("lab-machines")
        self.machines: list = []
        self.error: str | None = None
        on_language(self.render)
        self.refresh()

    def refresh(self) -> None:
        try:
            self.machines, self.error = backend.overview(refresh=True), None
        except UserError as e:
            self.machines, self.error = [], str(e)
        self.render()

    def render(self) -> None:
        self.refresh_button.description = tr("Refresh", "Обновить")
        rows = [self._row(m) for m in self.machines]
        if not any(m.kind == "kaggle" for m in self.machines):
            rows.append(widgets.HTML(f"<span style='color:#666'>{esc(tr('No Kaggle accounts. Add one: ', 'Аккаунтов Kaggle нет. Добавить: '))}"
                                     "<code>lab accounts add NAME --kaggle-json PATH</code></span>"))
        if self.error:
            rows.append(widgets.HTML(f"<span style='color:#d32f2f'>✖ {esc(self.error)}</span>"))
        self.list.children = rows

    def _row(self, m) -> widgets.Widget:
        busy = ", ".join(m.running) if m.running else tr("free", "свободна") if m.free else tr("busy", "занята")
        if m.kind == "local":
            name = f"<b>{esc(tr('This computer', 'Этот компьютер'))}</b> · {esc(backend.local_gpu()[1])}"
            quota = widgets.HTML(f"<span style='color:#666'>{esc(tr('no quota', 'без квоты'))}</span>")
        else:
            name = f"<b>{esc(m.name)}</b> · Kaggle {esc(m.gpu)}"
            if m.error:
                quota = widgets.HTML(f"<span style='color:#d32f2f'>✖ {esc(m.error)}</span>")
            else:
                left, total = m.quota_left_h or 0.0, m.quota_total_h or 0.0
                bar = widgets.FloatProgress(value=min(left, total), min=0.0, max=max(total, 1e-9),
                                            bar_style="success" if left > 0.3 * total else "warning" if left > 0 else "danger",
                                            layout=widgets.Layout(width="12em"))
                bar.add_class(f"lab-quota-{m.name}")
                reset = f" · {tr('resets', 'сброс')} {m.refresh[:16].replace('T', ' ')} UTC" if m.refresh else ""
                text = widgets.HTML(f"{esc(hours(left))} {esc(tr('of', 'из'))} {esc(hours(total))}{esc(reset)}")
                quota = widgets.HBox([bar, text])
        row = widgets.HBox([widgets.HTML(name, layout=widgets.Layout(width="22em")), quota,
                            widgets.HTML(f"&nbsp;· {esc(busy)}")], layout=widgets.Layout(align_items="center"))
        return row if m.kind == "local" else widgets.VBox([row, _probe_line(m.name)])


def _probe_line(account: str) -> widgets.HTML:
    """The account's last probe (`lab probe NAME`): its verdict and figures, and how old it is."""
    from lab.probe.record import age, read_probe, summary
    record = read_probe(account)
    ru = lang() == "ru"
    text = f"{tr('probe', 'проба')}: {summary(record, ru=ru)}"
    if record is not None:
        text += f" · {age(record, ru=ru)} {tr('ago', 'назад')}"
    color = "#666" if record is None or record.get("can_run", True) is True else "#d32f2f"
    line = widgets.HTML(f"<span style='color:{color};font-size:90%;margin-left:2em'>{esc(text)}</span>")
    line.add_class(f"lab-probe-{account}")
    return line


# ---------------------------------------------------------------------------------------
# 5. Start


class StartPanel(Panel):
    """The form's Start button and the line that says where the run went (the same widgets
    as beside the calculator: two views of one button)."""

    def __init__(self, form):
        self.form = form
        self.box = widgets.VBox([form.start_button, form.where])


# ---------------------------------------------------------------------------------------
# 6. Monitor


_monitors: list["Monitor"] = []


class Monitor(Panel):
    """Status of each link, the log tail and the loss plot of one run, refreshed while it runs."""

    def __init__(self, form=None, run_id: str | None = None, every_s: float = 3.0):
        for old in _monitors:  # a re-run cell replaces its monitor
            old.close()
        _monitors[:] = [self]
        self._stop = threading.Event()
        self._lock = threading.RLock()
        self.every_s = every_s
        self.run_id = run_id
        self.status: dict = {}
        self._plotted: tuple | None = None
        self._filling = False
        self.picker = widgets.Dropdown(layout=widgets.Layout(width="30em"))
        self.refresh_button = widgets.Button(icon="refresh", layout=widgets.Layout(width="auto"))
        self.x = _x_toggle()
        self.auto = widgets.Checkbox(value=True, indent=False, layout=widgets.Layout(width="auto"))
        self.state, self.links, self.log = widgets.HTML(), widgets.HTML(), widgets.HTML()
        self.plot = widgets.Image(format="png", layout=widgets.Layout(max_width="900px"))
        self.plot.add_class("lab-monitor-plot")
        self.state.add_class("lab-monitor-status")
        self.plot.layout.display = "none"
        self.box = widgets.VBox([widgets.HBox([self.picker, self.refresh_button, self.x, self.auto]),
                                 self.state, self.links, self.plot, self.log])
        self.box.add_class("lab-monitor")
        self.refresh_button.on_click(lambda _: self.refresh())
        self.picker.observe(self._picked, names="value")
        self.x.observe(lambda _: self.refresh(), names="value")
        self._fill_picker(run_id)
        if form is not None:
            form.on_started(self.follow)
            if form.run_id and not run_id:
                self.follow(form.run_id)
        on_language(self._relabel)
        self._relabel()
        threading.Thread(target=self._tick, daemon=True).start()

    def close(self) -> None:
        self._stop.set()

    def _relabel(self) -> None:
        if self._stop.is_set():
            return  # a closed monitor (its cell was run again)
        self.refresh_button.description = tr("Refresh", "Обновить")
        self.auto.description = tr("auto refresh", "обновлять сам")
        _x_labels(self.x)
        self.refresh()

    def _fill_picker(self, selected: str | None) -> None:
        from lab.runs import list_runs
        ids = [r.id for r in newest_first(list_runs())]
        if selected and selected not in ids:
            ids.insert(0, selected)
        self._filling = True
        self.picker.options = [(tr("— no runs yet —", "— прогонов пока нет —"), "")] if not ids else ids
        self.picker.value = selected or (ids[0] if ids else "")
        self._filling = False
        self.run_id = self.picker.value or None

    def _picked(self, change) -> None:
        if not self._filling:
            self.run_id = change["new"] or None
            self._plotted = None
            self.refresh()

    def follow(self, run_id: str) -> None:
        """Shows this run from now on (the form calls it when Start has registered a run)."""
        self._fill_picker(run_id)
        self._plotted = None
        self.refresh()

    def _tick(self) -> None:
        while not self._stop.wait(self.every_s):
            if self.auto.value and self.run_id and self.status.get("status", "new") in LIVE:
                try:
                    self.refresh()
                except Exception:  # noqa: BLE001 - a half-written file: the next tick reads it whole
                    pass

    def refresh(self) -> None:
        with self._lock:
            self._refresh()

    def _refresh(self) -> None:
        if not self.run_id:
            self.state.value = f"<i>{esc(tr('Press Start in the form or pick a run.', 'Нажмите «Старт» в форме или выберите прогон.'))}</i>"
            return
        try:
            self.status = backend.status(self.run_id)
        except UserError as e:
            self.state.value = f"<span style='color:#d32f2f'>✖ {esc(e)}</span>"
            return
        from lab.runs import load_run
        run = load_run(self.run_id)
        message = tr(self.status.get("message") or "", self.status.get("message_ru") or self.status.get("message") or "")
        live = self.status.get("live") or {}
        if live.get("note_en"):  # Kaggle keeps this session's log until it ends: no curve moves meanwhile
            message = f"{message} {tr(live['note_en'], live['note_ru'])}".strip()
        self.state.value = (f"<b>{esc(self.run_id)}</b>: <span class='lab-run-status'>"
                            f"{esc(status_word(self.status['status']))}</span> · {esc(tr('step', 'шаг'))} "
                            f"{run.step:,} / {run.cfg.steps_until:,}"
                            + (f"<div class='lab-run-message'>{esc(message)}</div>" if message else ""))
        rows = [[esc(link["n"]), esc(tr("this computer", "этот компьютер") if link["machine"] == "local" else link["machine"]),
                 esc(status_word(link["status"])), esc(f"{link['from_step']} → {link['to_step'] if link['to_step'] is not None else '…'}"),
                 esc((link.get("started") or "")[:19].replace("T", " ")), esc(link.get("reason") or "")]
                for link in self.status.get("links", [])]
        self.links.value = _table([esc(tr(*h)) for h in (("link", "звено"), ("machine", "машина"),
                                   ("status", "статус"), ("steps", "шаги"), ("started", "начато"), ("why", "почему"))],
                                  rows, "lab-monitor-links") if rows else ""
        tail = "\n".join((self.status.get("log_tail") or "").splitlines()[-LOG_LINES:])
        self.log.value = (f"<pre class='lab-log' style='overflow-x:auto;white-space:pre-wrap;font-size:80%;background:#f7f7f7;"
                          f"padding:4px'>{esc(tail)}</pre>") if tail else ""
        self._draw(run)

    def _draw(self, run) -> None:
        metrics = run.folder / "metrics.jsonl"
        try:
            st = metrics.stat()
        except OSError:
            st = None
        live = self.status.get("live") or {}  # a session elsewhere: the rows its log showed so far
        if st is None and not live.get("rows"):
            return
        key = (st and st.st_mtime_ns, st and st.st_size, live.get("last_step"), self.x.value, self.run_id)
        if key == self._plotted:
            return
        rows = curve_rows(run, live or None)
        if sum("loss" in r for r in rows) < 2:  # one point draws an empty frame
            return
        self.plot.value = _png({run.id: rows}, self.x.value, title=run.id)
        self.plot.layout.display = None
        self._plotted = key

    def wait(self, minutes: float) -> None:
        """Blocks until the run ends or `minutes` pass, then shows the final state and plot as
        plain outputs too (a headless run's notebook keeps them)."""
        deadline = time.monotonic() + minutes * 60
        while self.run_id and time.monotonic() < deadline:
            self.refresh()
            if self.status.get("status") not in LIVE:
                break
            time.sleep(1.0)
        self.refresh()
        from IPython.display import HTML, Image, display
        display(HTML(self.state.value + self.links.value))
        if self.plot.value:
            display(Image(data=bytes(self.plot.value)))


# ---------------------------------------------------------------------------------------
# 7. Runs


def lineage_rows(run) -> list[dict]:
    """A run's metrics preceded by its ancestors' up to the step it was forked at: one curve."""
    from lab.runs import lineage, load_run
    chain = [load_run(r) for r in lineage(run)]
    rows: list[dict] = []
    for i, r in enumerate(chain):
        m = read_metrics(r.folder)
        if i + 1 < len(chain):
            cut = (chain[i + 1].parent or {}).get("step")
            m = [x for x in m if cut is None or x.get("step", 0) <= cut]
        rows += m
    return rows


class RunsPanel(Panel):
    """The lab's runs with lineage; an overlay of chosen runs; the "when to grow" verdict."""

    def __init__(self):
        self.table = widgets.HTML()
        self.table.add_class("lab-runs-table")
        self.choose = widgets.SelectMultiple(rows=5, layout=widgets.Layout(width="30em"))
        self.x = _x_toggle()
        self.ancestors = widgets.Checkbox(value=True, indent=False, layout=widgets.Layout(width="auto"))
        self.refresh_button = widgets.Button(icon="refresh", layout=widgets.Layout(width="auto"))
        self.plot = widgets.Image(format="png", layout=widgets.Layout(max_width="900px"))
        self.plot.add_class("lab-runs-plot")
        self.plot.layout.display = "none"
        self.verdict = widgets.HTML()
        self.verdict.add_class("lab-grow")
        self.box = widgets.VBox([self.refresh_button, self.table,
                                 widgets.HBox([self.choose, widgets.VBox([self.x, self.ancestors])]),
                                 self.plot, self.verdict])
        self.box.add_class("lab-runs")
        self.refresh_button.on_click(lambda _: self.refresh())
        for w in (self.choose, self.x, self.ancestors):
            w.observe(lambda _: self.draw(), names="value")
        on_language(self._relabel)
        self._relabel()

    def _relabel(self) -> None:
        self.refresh_button.description = tr("Refresh", "Обновить")
        self.ancestors.description = tr("with ancestors", "с предками")
        _x_labels(self.x)
        self.refresh()

    def refresh(self) -> None:
        from lab.models.bpb import last_val, val_bpb
        from lab.runs import lineage, list_runs
        self.runs = {r.id: r for r in newest_first(list_runs())}
        rows = []
        for r in self.runs.values():
            m = read_metrics(r.folder)
            loss = next((x["loss"] for x in reversed(m) if "loss" in x), None)
            val = last_val(m)
            bpb = val_bpb(val, r.cfg)  # bits per byte: runs of any tokenizer on one scale
            c = r.cfg
            rows.append([f"<code>{esc(r.id)}</code>", esc(status_word(r.status)), esc(f"{r.step:,} / {c.steps_until:,}"),
                         esc(f"{c.layers}×{c.width}, n {c.context}"), "-" if loss is None else f"{loss:.3f}",
                         "-" if val is None else f"{val['val_loss']:.3f}", "-" if bpb is None else f"{bpb:.3f}",
                         esc(", ".join(link.machine for link in r.links) or "-"), esc(" ← ".join(reversed(lineage(r)[:-1])) or "-")])
        head = [tr(*h) for h in (("run", "прогон"), ("status", "статус"), ("step", "шаг"), ("size", "размер"),
                                 ("loss", "loss"), ("val", "val"), ("val bits/byte", "val бит/байт"),
                                 ("machines", "машины"), ("from", "от кого"))]
        self.table.value = _table([esc(h) for h in head], rows, "lab-runs") if rows else \
            f"<i>{esc(tr('No runs yet.', 'Прогонов пока нет.'))}</i>"
        chosen = tuple(i for i in self.choose.value if i in self.runs) or tuple(list(self.runs)[:1])
        self.choose.options = list(self.runs)
        self.choose.value = chosen
        self.draw()

    def draw(self) -> None:
        chosen = [self.runs[i] for i in self.choose.value if i in self.runs]
        series = {r.id: lineage_rows(r) if self.ancestors.value else read_metrics(r.folder) for r in chosen}
        series = {k: v for k, v in series.items() if any("loss" in x for x in v)}
        if series:
            self.plot.value = _png(series, self.x.value, title=tr("comparison", "сравнение") if len(series) > 1 else None)
            self.plot.layout.display = None
        else:
            self.plot.layout.display = "none"
        self.verdict.value = self._verdict(chosen[0]) if chosen else ""

    def _verdict(self, run) -> str:
        cfg = run.cfg
        v = sizing.when_to_grow(lineage_rows(run), sizing.find_manifest(cfg), cfg)
        head = tr("Grow", "Пора расти") if v.grow else tr("Not yet", "Расти рано")
        return (f"<div><b>{esc(tr('When to grow', 'Когда расти'))} — {esc(run.id)}: {esc(head)}.</b> "
                f"{esc(v.reason(lang()))}</div>")
