"""The machines cell: every machine of the lab (this computer, each Kaggle account with its quota
bar and its probe, the lab's own boxes with their check), adding and removing an account, and
the runs' checkpoint datasets kept on each account.

The list is generic over the lab's machines: each row says what its machine is and offers what it
offers (`lab.api.machines.MachineRow`: an account's quota bar, Probe and Remove; a box's or a
cluster's check), so the panel never asks which kind a machine is. Adding an
account reads its kaggle.json from an upload (or a pasted token), stores it as `lab accounts
add` does and then empties the widgets that held it: no credential stays in widget state.
"""
from __future__ import annotations

import re

import ipywidgets as widgets

from lab.config import UserError
from lab.api import accounts, machines
from lab.ui import console
from lab.ui.threads import in_background
from lab.ui.parts import GREY, RED, button, html, note, table, tell
from lab.ui.parts import row as row_of
from lab.ui.text import Panel, clock, error_text, esc, fixed, hours, lang, on_language, said, status_word, tr

NAME_W = "22em"


class MachinesPanel(Panel):
    """The lab's machines, one row each, with what can be done to them; the account form under."""

    def __init__(self):
        self.refresh_button = button("lab-machines-refresh", "refresh")
        self.refresh_button.on_click(lambda _: self.refresh(tell_others=True))
        self.read = html("lab-machines-read")
        self.list = widgets.VBox()
        self.adding = AddAccount(on_added=self._added)
        self.storage = CheckpointDatasets()
        self.box = widgets.VBox([widgets.HBox([self.refresh_button, self.read], layout=widgets.Layout(
            align_items="center")), self.list, self.adding.box, self.storage.box])
        self.box.add_class("lab-machines")
        self.machines: list = []
        self.error: str | None = None
        self.probing: dict[str, list[str]] = {}  # account -> what its running probe said so far (its English lines)
        self.asking: dict[str, str] = {}  # machine -> the action waiting for its confirmation ("probe", "remove")
        self.results: dict = {}  # machine -> the last answer of an action: its HTML, drawn in the view's language
        self._asking_anew = False  # a background look at stale figures is on its way
        self._anew_failed = False  # it failed: no other look until Refresh (no loop against a dead service)
        on_language(self.render)
        self.refresh()

    def refresh(self, tell_others: bool = False) -> None:
        self._anew_failed = False
        try:
            self.machines, self.error = console.machines.machines(refresh=True), None
        except UserError as e:
            self.machines, self.error = [], error_text(e)
        self.render()
        if tell_others:
            tell("machines")  # the form's Auto picks over these figures too

    def render(self) -> None:
        """The rows as last read — the console's one view, which the form may have read since —
        with when that was; figures gone stale (a run started, five minutes) are asked again in
        the background and drawn when they come."""
        self.refresh_button.description = tr("Refresh", "Обновить")
        view = console.machines
        if view.kept() is not None and not self.error:
            self.machines = view.kept()
        if view.stale and not self._asking_anew and not self._anew_failed and self.machines:
            self._asking_anew = True
            in_background(view.machines, on_done=lambda _: self._asked_anew(), on_error=lambda e: self._asked_anew(e))
        when = tr(f"quota and sessions as read at {clock(view.read_at)}", f"квота и сессии — по данным на {clock(view.read_at)}")
        self.read.value = note(when + (tr(" · asking again…", " · спрашиваю заново…") if self._asking_anew else ""))
        found = machines.rows(self.machines)
        rows = [self._row(m) for m in found]
        if not any(m.account for m in found):
            rows.append(html(value=note(tr("No Kaggle accounts yet: add one below.",
                                           "Аккаунтов Kaggle пока нет: добавьте ниже."))))
        if self.error:
            rows.append(html(value=note(self.error, "error")))
        self.list.children = rows
        self.adding.relabel()
        self.storage.render()

    def _asked_anew(self, error: Exception | None = None) -> None:
        self._asking_anew = False
        if error is not None:
            self.error, self._anew_failed = error_text(error), True
        self.render()

    def _added(self) -> None:
        self.refresh(tell_others=True)

    # -- one machine ------------------------------------------------------------------------

    def _row(self, row: machines.MachineRow) -> widgets.Widget:
        m = row.state
        busy = ", ".join(m.running) if m.running else tr("probing", "идёт проба") if m.name in self.probing else \
            tr("free", "свободна") if m.free else \
            tr("cannot be used now", "сейчас недоступна") if m.error else tr("busy", "занята")  # the error says why
        if m.busy_until and not m.error:  # a busy spell: Kaggle asked the lab to wait until then
            busy = tr(f"Kaggle asks to wait until {m.busy_until[11:16]} UTC",
                      f"Kaggle просит подождать до {m.busy_until[11:16]} UTC")
        name, _, what = tr(*row.title).partition(" · ")
        title = f"<b>{esc(name)}</b> · {esc(what)}"
        if row.quota:
            state = self._quota(m)
        elif row.answers:
            state = html(value=note(m.error, "error") if m.error else note(tr("reachable", "на связи"), "ok"))
        else:
            state = html(value=f"<span style='color:{GREY}'>{esc(tr('no quota', 'без квоты'))}</span>")
        line = row_of([html(value=title, width=NAME_W), state, html(value=f"&nbsp;· {esc(busy)}"),
                       *self._actions(row)])
        hint = [html(f"lab-first-run-{m.name}", f"<span style='color:{GREY};font-size:90%;margin-left:2em'>"
                                                f"{esc(tr(*row.hint))}</span>")] if row.hint else []
        probed = [_probe_line(m.name)] if "probe" in row.actions else []
        return widgets.VBox([line] + probed + hint + self._pending(m))

    def _quota(self, m) -> widgets.Widget:
        if m.error:
            return html(value=note(m.error, "error"))
        left, total = m.quota_left_h or 0.0, m.quota_total_h or 0.0
        bar = widgets.FloatProgress(value=min(left, total), min=0.0, max=max(total, 1e-9),
                                    bar_style="success" if left > 0.3 * total else "warning" if left > 0 else "danger",
                                    layout=widgets.Layout(width="12em"))
        bar.add_class(f"lab-quota-{m.name}")
        reset = f" · {tr('resets', 'сброс')} {m.refresh[:16].replace('T', ' ')} UTC" if m.refresh else ""
        text = f"{hours(left)} {tr('of', 'из')} {hours(total)} {tr('for a new session', 'на новую сессию')}" \
               + _said_left(m) + reset
        return widgets.HBox([bar, html(value=esc(text))])

    def _actions(self, row: machines.MachineRow) -> list[widgets.Button]:
        """The row's buttons, as its machine offers them: Probe and Remove (an account), Check (a box, a cluster)."""
        words = {"probe": ("stethoscope", ("Probe", "Проба"), lambda n: self._ask(n, "probe")),
                 "remove": ("trash", ("Remove", "Удалить"), lambda n: self._ask(n, "remove")),
                 "check": ("check", ("Check", "Проверить"), self._check)}
        out = []
        for action in row.actions:
            icon, description, act = words[action]
            b = button(f"lab-do-{action}-{row.name}", icon)
            b.description = tr(*description)
            b.disabled = action == "probe" and row.name in self.probing
            b.on_click(lambda _, n=row.name, act=act: act(n))
            out.append(b)
        return out

    def _pending(self, m) -> list[widgets.Widget]:
        """Under the row: the question waiting for a yes, a probe's progress, the last answer."""
        out = []
        action = self.asking.get(m.name)
        if action:
            out.append(self._question(m.name, action))
        if m.name in self.probing:
            said = probe_words(self.probing[m.name][-1]) if self.probing[m.name] else ""
            out.append(html(f"lab-probing-{m.name}", note(tr("Probing… ", "Проба идёт… ") + said), margin="0 0 0 2em"))
        if m.name in self.results:
            out.append(html(f"lab-answer-{m.name}", self.results[m.name](), margin="0 0 0 2em"))
        return out

    def _question(self, name: str, action: str) -> widgets.Widget:
        if action == "probe":
            en, ru = accounts.probe_cost()
            text = tr(f"{en} Kaggle also keeps a private kernel lab-probe and a tiny dataset on the account.",
                      f"{ru} На аккаунте останутся приватное ядро lab-probe и крошечный датасет.")
            yes = tr("Probe, spend the quota", "Пробовать, потратить квоту")
        else:
            text = tr(f"Remove {name}? Its credentials are deleted from this computer; its runs stay.",
                      f"Удалить {name}? Его ключ удалится с этого компьютера; прогоны останутся.")
            yes = tr("Remove", "Удалить")
        ok, no = button(f"lab-confirm-{action}-{name}", style="warning"), button(f"lab-cancel-{action}-{name}")
        ok.description, no.description = yes, tr("Cancel", "Отмена")
        ok.on_click(lambda _: self._confirmed(name, action))
        no.on_click(lambda _: self._unask(name))
        buttons = widgets.HBox([ok, no], layout=widgets.Layout(margin="0 0 4px 2em"))
        return widgets.VBox([html(value=note(text, "warning"), margin="0 0 0 2em"), buttons])

    # -- actions ----------------------------------------------------------------------------

    def _ask(self, name: str, action: str) -> None:
        self.asking[name] = action
        self.results.pop(name, None)
        self.render()

    def _unask(self, name: str) -> None:
        self.asking.pop(name, None)
        self.render()

    def _confirmed(self, name: str, action: str) -> None:
        self.asking.pop(name, None)
        if action == "remove":
            try:
                accounts.remove(name)
                console.machines.forget()
            except UserError as e:
                self.results[name] = lambda e=e: note(error_text(e), "error")
                self.render()
                return
            self.refresh(tell_others=True)
            return
        self.probing[name] = []
        self.render()
        in_background(accounts.probe, name, lambda text: self._probe_said(name, text),
                              on_done=lambda record: self._probed(name, None),
                              on_error=lambda e: self._probed(name, e))

    def _probe_said(self, name: str, text: str) -> None:
        self.probing.setdefault(name, []).append(text.split(": ", 1)[-1])
        self.render()

    def _probed(self, name: str, error: Exception | None) -> None:
        self.probing.pop(name, None)
        self.results[name] = (lambda: note(error_text(error), "error")) if error else lambda: \
            note(tr("Probe done: its result is in the row.", "Проба готова: её итог — в строке."), "ok")
        self.refresh(tell_others=True)  # a probe that found the account cannot run bars it from Auto: the states anew

    def _checking(self, name: str, text: str) -> None:
        """A box's first check takes a while (a training burst): what it is doing, in its row."""
        self.results[name] = lambda: note(tr("Checking… ", "Проверка… ") + text.split(": ", 1)[-1])
        self.render()

    def _check(self, name: str) -> None:
        try:
            machines.check(name, say=lambda text: self._checking(name, text))
        except UserError as e:
            self.results[name] = lambda e=e: note(error_text(e), "error")
        else:
            self.results[name] = lambda: note(tr("It answers: ready for runs.", "Отвечает: готова к прогонам."), "ok")
        self.render()


# `lab probe`'s progress lines (lab.probe.account: "NAME: " is cut off before), said in Russian.
_PROBE_RU = ((re.compile(r"^The probe uses about "), lambda m, text: accounts.probe_cost()[1]
              if text == accounts.probe_cost()[0] else None),
             (re.compile(r"^uploaded the probe's input (\S+); waiting until Kaggle has it ready$"),
              lambda m, text: f"вход пробы {m[1]} загружен; жду, пока Kaggle его подготовит"),
             (re.compile(r"^pushed (\S+) version (\S+); waiting for it to end$"),
              lambda m, text: f"отправлена {m[1]}, версия {m[2]}; жду, пока она кончится"),
             (re.compile(r"^(\S+) ([A-Z_]+)(?:: (.*))?$"),
              lambda m, text: f"{m[1]}: {_SESSION_RU.get(m[2], m[2])}" + (f" ({m[3]})" if m[3] else "")))
_SESSION_RU = {"QUEUED": "в очереди Kaggle", "RUNNING": "идёт", "COMPLETE": "закончилась",
               "ERROR": "кончилась ошибкой", "CANCEL_ACKNOWLEDGED": "отменена"}


def probe_words(text: str) -> str:
    """A progress line of a running probe in the view's language."""
    if lang() == "en":
        return text
    for pattern, words in _PROBE_RU:
        m = pattern.search(text)
        ru = words(m, text) if m else None
        if ru:
            return ru
    return said(text, None)


def _said_left(m) -> str:
    """What `kaggle quota` says is left (the total less what is used), and how far past the total the
    account's sessions ran where they did."""
    if m.quota_used_h is None or m.quota_total_h is None:
        return ""
    over = m.quota_used_h - m.quota_total_h
    if over > 0:
        return tr(f" · used {hours(m.quota_used_h)}: {hours(over)} past the total",
                  f" · израсходовано {hours(m.quota_used_h)}: на {hours(over)} больше всей квоты")
    said_left = m.quota_total_h - m.quota_used_h
    return tr(f" · kaggle quota: {hours(said_left)} left", f" · kaggle quota: осталось {hours(said_left)}")


def _probe_line(account: str) -> widgets.HTML:
    """The account's last probe (`lab probe NAME`): its verdict and figures, and how old it is."""
    probed = accounts.probe_record(account)
    record, ru = probed.record, lang() == "ru"
    if record is None:  # "the account was not probed", as a sentence with its own subject (Russian genders)
        text = tr("probe: not yet — press Probe", "пробы ещё не было — нажмите «Проба»")
    else:
        text = f"{tr('probe', 'проба')}: {probed.summary_ru if ru else probed.summary} · {probed.age_ru if ru else probed.age} " \
               f"{tr('ago', 'назад')}"
    color = GREY if record is None or record.get("can_run", True) is True else RED
    line = html(f"lab-probe-{account}", f"<span style='color:{color};font-size:90%;margin-left:2em'>{esc(text)}</span>")
    return line


# ---------------------------------------------------------------------------------------
# Adding an account


class AddAccount:
    """The lab's name for the account, and its kaggle.json uploaded (or an API token pasted with
    its Kaggle username); each field's trouble beside it."""

    def __init__(self, on_added):
        self.on_added = on_added
        self.filename = "kaggle.json"
        self.title = html()
        self.name = widgets.Text(layout=widgets.Layout(width="14em"))
        self.name.add_class("lab-account-name")
        self.upload = widgets.FileUpload(accept=".json,application/json", multiple=False)
        self.upload.add_class("lab-account-upload")
        self.token = widgets.Password(layout=widgets.Layout(width="18em"))
        self.token.add_class("lab-account-token")
        self.username = widgets.Text(layout=widgets.Layout(width="12em"))
        self.username.add_class("lab-account-username")
        self.add = button("lab-account-add", "plus", "primary")
        self.add.on_click(lambda _: self.submit())
        self.messages = {k: html(f"lab-account-message-{k}") for k in ("name", "file", "token", "done")}
        self.labels = {k: html(width="11em") for k in ("name", "file", "token")}
        row = lambda k, *w: widgets.VBox([widgets.HBox([self.labels[k], *w], layout=widgets.Layout(  # noqa: E731
            align_items="center")), self.messages[k]])
        self.box = widgets.VBox([self.title, row("name", self.name), row("file", self.upload),
                                 row("token", self.token, self.username), widgets.HBox([self.add]),
                                 self.messages["done"]])
        self.box.add_class("lab-add-account")
        self._said_added = None  # the words of the account added last
        self.relabel()

    def relabel(self) -> None:
        self.title.value = f"<h4 style='margin:10px 0 4px'>{esc(tr('Add a Kaggle account', 'Добавить аккаунт Kaggle'))}</h4>"
        self.labels["name"].value = esc(tr("Name in the lab", "Имя в лабе"))
        self.labels["file"].value = esc(tr("kaggle.json", "kaggle.json"))
        self.labels["token"].value = esc(tr("or an API token", "или API-токен"))
        self.name.placeholder = tr("e.g. alice", "например, alice")
        self.username.placeholder = tr("Kaggle username", "имя на Kaggle")
        self.upload.description = tr("Upload", "Загрузить")
        self.add.description = tr("Add", "Добавить")
        if self._said_added is not None and self.messages["done"].value:
            self.messages["done"].value = self._said_added()

    def _consume(self) -> tuple[bytes | None, str | None, str]:
        """What was given, taken out of the widgets at once: they hold no credential after."""
        files = self.upload.value
        data = bytes(files[0]["content"]) if files else None
        self.filename = files[0]["name"] if files else "kaggle.json"
        token = self.token.value or None
        username = self.username.value
        self.upload.value = ()
        self.token.value = ""
        return data, token, username

    def submit(self) -> None:
        for m in self.messages.values():
            m.value = ""
        self._said_added = None
        name = self.name.value.strip()
        if not name:
            self.messages["name"].value = note(tr("Give the account a name in the lab.", "Дайте аккаунту имя в лабе."),
                                               "error")
            return
        try:
            accounts.check_name(name)
        except UserError as e:
            self.messages["name"].value = note(error_text(e), "error")
            return  # the upload waits for a name that fits
        data, token, username = self._consume()
        if (data is None) == (token is None):
            where = "file" if data is None else "token"
            self.messages[where].value = note(tr("Upload its kaggle.json, or paste an API token (one of the two).",
                                                 "Загрузите его kaggle.json или вставьте API-токен (что-то одно)."),
                                              "error")
            return
        self.add.disabled = True
        try:
            self._store(name, data, token, username)
        finally:
            self.add.disabled = False

    def _store(self, name: str, data: bytes | None, token: str | None, username: str) -> None:
        try:
            got = accounts.add(name, kaggle_json=data, token=token, username=username, filename=self.filename)
        except UserError as e:
            self.messages["file" if data is not None else "token"].value = note(error_text(e), "error")
            return
        console.machines.forget()
        self.name.value, self.username.value = "", ""
        self._said_added = lambda: _added_words(got)  # said anew in the other language after a switch
        self.on_added()  # its row first, then the word that it is added
        self.messages["done"].value = self._said_added()


def _added_words(got) -> str:
    """That the account is added (`lab.api.accounts.Added`), with its quota, in the view's language."""
    stored = " " + tr(f"Stored {got.stored_as}.", f"Сохранён {got.stored_as_ru}.")
    if got.unchecked is not None:
        text = tr(f"Added {got.name} (Kaggle user {got.username}), but Kaggle could not be asked: ",
                  f"Аккаунт {got.name} (пользователь Kaggle {got.username}) добавлен, но спросить Kaggle не удалось: ")
        return note(text + error_text(got.unchecked) + stored, "warning")
    left, total = hours(got.quota_left_h), hours(got.quota_total_h)
    return note(tr(f"Added {got.name} (Kaggle user {got.username}): {left} of {total} of GPU quota left.",
                   f"Аккаунт {got.name} (пользователь Kaggle {got.username}) добавлен: квоты GPU осталось {left} "
                   f"из {total}.") + stored, "ok")


# ---------------------------------------------------------------------------------------
# The runs' checkpoint datasets on each account


class CheckpointDatasets:
    """The checkpoint datasets of the lab's runs kept on each account, with their size; those of
    finished runs can be removed (a run still going on needs its hand-off)."""

    def __init__(self):
        self.title, self.table, self.message = html(), html("lab-ckpt-datasets"), html("lab-ckpt-message")
        self.show = button("lab-ckpt-show", "database")
        self.show.on_click(lambda _: self.load())
        self.rows: list[dict] | None = None
        self.removes = widgets.VBox()
        self.box = widgets.VBox([self.title, self.show, self.table, self.removes, self.message])

    def load(self) -> None:
        self.message.value = note(tr("Asking Kaggle…", "Спрашиваю Kaggle…"))
        in_background(_dataset_rows, on_done=self._loaded,
                              on_error=lambda e: setattr(self.message, "value", note(error_text(e), "error")))

    def _loaded(self, rows: list[dict]) -> None:
        self.rows, self.message.value = rows, ""
        self.render()

    def render(self) -> None:
        self.title.value = (f"<h4 style='margin:10px 0 4px'>{esc(tr('Checkpoints kept on Kaggle', 'Чекпоинты на Kaggle'))}"
                            "</h4>")
        self.show.description = tr("Show, with sizes", "Показать с размерами")
        if self.rows is None:
            return
        found = [r for r in self.rows if "error" not in r]
        lines = [[esc(r["account"]), f"<code>{esc(r['slug'])}</code>", esc(_megabytes(r["bytes"])),
                  esc(r["run"] or "—"), esc(status_word(r["status"]))] for r in found]
        lines += [[esc(r["account"]), note(error_text(r["error"]), "error"), "", "", ""] for r in self.rows if "error" in r]
        head = [esc(tr(*h)) for h in (("account", "аккаунт"), ("dataset", "датасет"), ("size", "размер"),
                                       ("run", "прогон"), ("run's status", "статус прогона"))]
        self.table.value = table(head, lines, "lab-ckpt-table") if lines else \
            note(tr("No checkpoint datasets on the lab's accounts.", "Чекпоинтов на аккаунтах лабы нет."))
        self.removes.children = [self._remove_button(r) for r in found if r["finished"]]

    def _remove_button(self, r: dict) -> widgets.Button:
        b = button(f"lab-ckpt-remove-{r['slug'].split('/')[-1]}", "trash")
        b.description = tr(f"Remove {r['slug']} ({_megabytes(r['bytes'])})", f"Удалить {r['slug']} ({_megabytes(r['bytes'])})")
        b.on_click(lambda _: self._remove(r))
        return b

    def _remove(self, r: dict) -> None:
        try:
            accounts.remove_checkpoint_datasets(r["account"], [r["slug"]])
        except UserError as e:
            self.message.value = note(error_text(e), "error")
            return
        self.message.value = note(tr(f"Removed {r['slug']}.", f"{r['slug']} удалён."), "ok")
        self.load()


def _megabytes(n: int) -> str:
    return f"{fixed(n / 1e6, 1)} {tr('MB', 'МБ')}"


def _dataset_rows() -> list[dict]:
    """One row per checkpoint dataset ({"account", "slug", "bytes", "run", "status", "finished"}),
    and {"account", "error"} for an account that could not be asked."""
    out: list[dict] = []
    for held in accounts.checkpoint_datasets():
        out += [{"account": held.account, "error": held.error}] if held.error else \
            [{"account": held.account, **d} for d in held.datasets]
    return out
