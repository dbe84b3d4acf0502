"""The data cell: the lab's constellations with their sources, licence, prepared state and token
counts; declaring one from a folder or files on this computer (a path field, or files uploaded
into `$LAB_HOME/texts/<name>/`), editing and removing one, and Prepare with a progress bar.

`$LAB_HOME/constellations.ini` stays the one place constellations live: every change here is
written there, in place, its comments kept (`lab.corpus.constellations`), and a file edited by
hand shows here at the next Refresh.
"""
from __future__ import annotations

import re
import time

import ipywidgets as widgets

from lab.config import UserError
from lab.api import data as lab_data
from lab.ui.threads import in_background
from lab.ui.parts import button, html, note, table, tell
from lab.ui.text import Panel, count, error_text, esc, lang, on_language, tr

FIELDS = ("name", "sources", "files", "description", "licence", "source")


class DataPanel(Panel):
    """The constellations, the form that declares or edits one, and Prepare."""

    def __init__(self):
        self.refresh_button = button("lab-data-refresh", "refresh")
        self.refresh_button.on_click(lambda _: self.refresh())
        self.table = html("lab-constellations")
        self.rows = widgets.VBox()
        self.form = ConstellationForm(on_saved=self._changed)
        self.preparing = Preparing(on_prepared=self._changed)
        self.message = html("lab-data-message")
        self.box = widgets.VBox([self.refresh_button, self.table, self.rows, self.message, self.form.box,
                                 self.preparing.box])
        self.box.add_class("lab-data")
        self.known: list[lab_data.Constellation] = []
        self.asking: str | None = None  # the constellation whose removal waits for a yes
        on_language(self.render)
        self.refresh()

    def refresh(self) -> None:
        try:
            self.known, self.message.value = lab_data.constellations(), ""
        except UserError as e:
            self.known, self.message.value = [], note(error_text(e), "error")
        self.render()

    def _changed(self) -> None:
        self.refresh()
        tell("constellations")

    def render(self) -> None:
        self.refresh_button.description = tr("Refresh", "Обновить")
        head = [esc(tr(*h)) for h in (("constellation", "созвездие"), ("sources", "источники"), ("licence", "лицензия"),
                                       ("prepared", "подготовлено"))]
        lines = [[f"<b>{esc(c.name)}</b><div style='color:#666;font-size:85%'>{esc(c.description)}</div>",
                  "<br>".join(f"<code>{esc(s)}</code>" for s in c.sources), esc(c.licence or "—"),
                  _prepared(c.tokens) + _splits(c.splits)] for c in self.known]
        self.table.value = table(head, lines, "lab-constellations-table") if lines else \
            note(tr("No constellations: declare one below.", "Созвездий нет: объявите ниже."))
        self.rows.children = [self._actions(c.name) for c in self.known]
        self.form.relabel()
        self.preparing.relabel([c.name for c in self.known])

    def _actions(self, name: str) -> widgets.Widget:
        edit, remove = button(f"lab-edit-{name}", "pencil"), button(f"lab-remove-constellation-{name}", "trash")
        edit.description, remove.description = tr(f"Edit {name}", f"Изменить {name}"), tr("Remove", "Удалить")
        edit.on_click(lambda _: self.form.edit(next(c for c in self.known if c.name == name)))
        remove.on_click(lambda _: self._ask(name))
        parts: list[widgets.Widget] = [edit, remove]
        if self.asking == name:
            yes, no = button(f"lab-confirm-remove-constellation-{name}", style="warning"), button("lab-cancel-remove")
            yes.description, no.description = tr("Remove it", "Удалить его"), tr("Cancel", "Отмена")
            yes.on_click(lambda _: self._remove(name))
            no.on_click(lambda _: self._ask(None))
            question = html(value=note(tr(f"Remove {name} from constellations.ini? Its files and prepared data stay.",
                                          f"Убрать {name} из constellations.ini? Его файлы и подготовленные данные "
                                          "останутся."), "warning"))
            return widgets.VBox([widgets.HBox(parts), question, widgets.HBox([yes, no])])
        return widgets.HBox(parts, layout=widgets.Layout(align_items="center"))

    def _ask(self, name: str | None) -> None:
        self.asking = name
        self.render()

    def _remove(self, name: str) -> None:
        self.asking = None
        try:
            lab_data.remove(name)
        except UserError as e:
            self.message.value = note(error_text(e), "error")
            self.render()
            return
        self._changed()
        self.message.value = note(tr(f"Removed {name}.", f"{name} убран."), "ok")


def _splits(splits: list) -> str:
    """Where each source's text went: its train and val share, so a person sees that no source is
    held out whole while the rest trains."""
    if not splits:
        return ""
    lines = "".join(f"<div class='lab-source-split'>{esc(s.words(lang()))}</div>" for s in splits)
    return f"<div style='color:#666;font-size:85%;margin-top:2px'>{lines}</div>"


def _prepared(tokens: int | None) -> str:
    if tokens is None:
        return f"<span style='color:#666'>{esc(tr('not prepared', 'не подготовлено'))}</span>"
    return esc(f"{count(tokens)} " + tr("train tokens", "токенов обучения"))


class ConstellationForm:
    """Declares a constellation, or edits the one picked: its name, sources (a path per line:
    a folder, a file, a glob, builtin:NAME), files uploaded instead, description, licence,
    where the text came from. Each field's trouble is said beside it."""

    def __init__(self, on_saved):
        self.on_saved = on_saved
        self.editing: str | None = None
        self.skipped: list[str] = []  # uploaded files that were no text files
        self.title = html()
        self.inputs = {"name": widgets.Text(layout=widgets.Layout(width="16em")),
                       "sources": widgets.Textarea(rows=3, layout=widgets.Layout(width="32em")),
                       "files": widgets.FileUpload(multiple=True, accept=".txt,.md,.markdown,.rst,.text,.org,.tex"),
                       "description": widgets.Text(layout=widgets.Layout(width="32em")),
                       "licence": widgets.Text(layout=widgets.Layout(width="20em")),
                       "source": widgets.Text(layout=widgets.Layout(width="32em"))}
        self.labels = {k: html(width="11em") for k in FIELDS}
        self.messages = {k: html(f"lab-data-message-{k}") for k in FIELDS}
        for k, w in self.inputs.items():
            w.add_class(f"lab-data-{k}")
        self.save, self.cancel = button("lab-data-save", "check", "primary"), button("lab-data-cancel")
        self.save.on_click(lambda _: self.submit())
        self.cancel.on_click(lambda _: self.edit(None))
        self.done = html("lab-data-done")
        rows = [widgets.VBox([widgets.HBox([self.labels[k], self.inputs[k]], layout=widgets.Layout(align_items="center")),
                              self.messages[k]]) for k in FIELDS]
        self.box = widgets.VBox([self.title, *rows, widgets.HBox([self.save, self.cancel]), self.done])
        self.box.add_class("lab-constellation-form")
        self.relabel()

    def relabel(self) -> None:
        title = tr(f"Edit {self.editing}", f"Изменить {self.editing}") if self.editing else \
            tr("Declare a constellation", "Объявить созвездие")
        self.title.value = f"<h4 style='margin:10px 0 4px'>{esc(title)}</h4>"
        words = {"name": ("Name", "Имя"), "sources": ("Sources", "Источники"), "files": ("or files", "или файлы"),
                 "description": ("Description", "Описание"), "licence": ("Licence", "Лицензия"),
                 "source": ("Where from", "Откуда текст")}
        for k, (en, ru) in words.items():
            self.labels[k].value = f"<b>{esc(tr(en, ru))}</b>"
        self.inputs["sources"].placeholder = tr("a folder, a file or a glob per line (texts/my-books/)",
                                                "папка, файл или шаблон — по одному в строке (texts/my-books/)")
        self.inputs["files"].description = tr("Upload", "Загрузить")
        self.inputs["source"].placeholder = "https://…"
        self.save.description = tr("Save", "Сохранить") if self.editing else tr("Declare", "Объявить")
        self.cancel.description = tr("Cancel", "Отмена")
        self.cancel.layout.display = None if self.editing else "none"
        self.inputs["name"].disabled = bool(self.editing)

    def edit(self, c: "lab_data.Constellation | None") -> None:
        """Fills the form with a constellation to edit (None: back to declaring a new one)."""
        self.editing = c.name if c else None
        values = {"name": "", "sources": "", "description": "", "licence": "", "source": ""}
        if c:
            values.update(name=c.name, sources="\n".join(c.sources), description=c.description,
                          licence=c.licence, source=c.source)
        for k, v in values.items():
            self.inputs[k].value = v
        for m in self.messages.values():
            m.value = ""
        self.relabel()

    def submit(self) -> None:
        for m in (*self.messages.values(), self.done):
            m.value = ""
        self.skipped = []
        v = {k: w.value for k, w in self.inputs.items() if k != "files"}
        name = v["name"].strip()
        if not name:
            self.messages["name"].value = note(tr("Give it a name.", "Дайте ему имя."), "error")
            return
        sources = [s for s in v["sources"].splitlines() if s.strip()]
        try:
            sources += self._uploaded(name)
        except UserError as e:
            self.messages["name"].value = note(error_text(e), "error")
            return
        if not sources:
            self.messages["sources"].value = note(tr("Give a folder or files, or upload files.",
                                                     "Укажите папку или файлы либо загрузите файлы."), "error")
            return
        self._write(name, sources, v)

    def _uploaded(self, name: str) -> list[str]:
        files = [(f["name"], bytes(f["content"])) for f in self.inputs["files"].value]
        if not files:
            return []
        self.inputs["files"].value = ()
        folder, skipped = lab_data.save_uploads(name, files)
        self.skipped = skipped
        if skipped:
            self.messages["files"].value = self._skipped_note()
        return [folder]

    def _skipped_note(self) -> str:
        return note(tr(f"Skipped, not text files: {', '.join(self.skipped)}",
                       f"Пропущены, не текстовые файлы: {', '.join(self.skipped)}"), "warning")

    def _write(self, name: str, sources: list[str], v: dict) -> None:
        change = lab_data.update if self.editing else lab_data.add
        try:
            change(name, sources, v["description"], v["licence"], v["source"])
        except UserError as e:
            self.messages[_field_of(str(e))].value = note(error_text(e), "error")
            return
        self.edit(None)
        if self.skipped:
            self.messages["files"].value = self._skipped_note()
        self.on_saved()  # the lists first (the table, Prepare's, the form's), then the word that it is done
        self.done.value = note(tr(f"{name} is in constellations.ini; prepare it below.",
                                  f"{name} записано в constellations.ini; подготовьте его ниже."), "ok")


def _field_of(message: str) -> str:
    """Which field an error of declaring a constellation is about: its name, else its sources."""
    return "name" if "already exists" in message or "constellation name" in message else "sources"


AUTO_VOCAB = "auto"
VOCAB_CHOICES = (AUTO_VOCAB, "1000", "2000", "4000", "8000", "16000")


def vocab_value(text: str) -> int | None:
    """The vocabulary field's size: None for auto (the kit picks one that fits the text), else a
    whole number the tokenizer can have; a UserError (in both languages) for anything else."""
    text = (text or "").strip().lower().replace(" ", "")
    if text in ("", AUTO_VOCAB, "авто"):
        return None
    if not text.isdigit():
        raise UserError(f"vocabulary {text!r}: give a whole number (e.g. 4000) or auto",
                        ru=f"словарь {text!r}: укажите целое число (например, 4000) или auto")
    vocab = int(text)
    lab_data.check_vocab(vocab)
    return vocab


class Preparing:
    """Prepare: the constellations picked, tokenized into one data folder (`lab prepare`) with the
    vocabulary asked (auto: the kit's pick), with a bar that moves stage by stage (reading, the
    tokenizer, the shards)."""

    def __init__(self, on_prepared):
        self.on_prepared = on_prepared
        self.title = html()
        self.pick = widgets.SelectMultiple(rows=3, layout=widgets.Layout(width="22em"))
        self.pick.add_class("lab-prepare-pick")
        self.vocab = widgets.Combobox(value=AUTO_VOCAB, options=list(VOCAB_CHOICES), ensure_option=False,
                                      layout=widgets.Layout(width="16em"), style={"description_width": "initial"})
        self.vocab.add_class("lab-prepare-vocab")
        self.go = button("lab-prepare", "cogs", "primary")
        self.go.on_click(lambda _: self.start())
        self.bar = widgets.FloatProgress(value=0.0, min=0.0, max=1.0, layout=widgets.Layout(width="24em"))
        self.bar.add_class("lab-prepare-bar")
        self.stage = html("lab-prepare-stage")
        self.vocab_help = html("lab-prepare-vocab-help")
        self.bar.layout.display = "none"
        self.box = widgets.VBox([self.title, widgets.HBox([self.pick, widgets.VBox([self.vocab, self.go])],
                                                          layout=widgets.Layout(align_items="center")),
                                 self.vocab_help, self.bar, self.stage])

    def relabel(self, names: list[str]) -> None:
        self.title.value = f"<h4 style='margin:10px 0 4px'>{esc(tr('Prepare', 'Подготовить'))}</h4>"
        chosen = tuple(n for n in self.pick.value if n in names)
        self.pick.options = names
        self.pick.value = chosen
        self.go.description = tr("Prepare", "Подготовить")
        self.vocab.description = tr("Vocabulary", "Словарь")
        self.vocab_help.value = note(tr(
            "Tokens the tokenizer knows. auto: the kit picks one that fits the text; a small text holds a small "
            "vocabulary only.", "Сколько токенов знает токенизатор. auto — кит подберёт размер под текст; в маленьком "
            "тексте помещается только маленький словарь."))

    def start(self) -> None:
        names = list(self.pick.value)
        if not names:
            self.stage.value = note(tr("Pick the constellations to prepare.", "Выберите созвездия для подготовки."),
                                    "error")
            return
        try:
            vocab = vocab_value(self.vocab.value)
        except UserError as e:
            self.stage.value = note(error_text(e), "error")
            return
        self.go.disabled, self.bar.value, self.bar.layout.display = True, 0.0, None
        self._last = ("", 0.0)
        self.stage.value = note(tr("Starting…", "Начинаю…"))
        in_background(lab_data.prepare, names, self._progress, vocab, on_done=self._done, on_error=self._failed)

    def _progress(self, stage: str, done: int, total: int | None) -> None:
        now = time.monotonic()
        if stage == self._last[0] and now - self._last[1] < 0.2 and done != total:
            return  # a document at a time would flood the browser: five redraws a second
        self._last = (stage, now)
        self.bar.value = max(self.bar.value, _overall(stage, done, total))
        self.stage.value = note(_stage_words(stage))

    def _done(self, folder) -> None:
        self.go.disabled, self.bar.value = False, 1.0
        self.on_prepared()  # the lists that show token counts first, then the word that it is done
        said = note(tr(f"Prepared: {folder}", f"Подготовлено: {folder}"), "ok")
        chose = lab_data.prepared_note(folder)
        self.stage.value = said + (f"<div>{note(tr(*chose))}</div>" if chose else "")

    def _failed(self, e: Exception) -> None:
        self.go.disabled = False
        self.bar.layout.display = "none"
        fits = _TOO_LARGE.search(str(e))
        if fits:  # the panel's own words: its field, not the command's flag, and the size that fits in it
            asked, most = fits.groups()
            self.vocab.value = most
            self.stage.value = note(tr(
                f"A vocabulary of {asked} is too large for this text: it holds at most {most}. The field now says "
                f"{most}: press Prepare again (or add text).",
                f"Словарь {asked} слишком велик для этого текста: в нём помещается не больше {most}. В поле теперь "
                f"{most}: нажмите «Подготовить» ещё раз (или добавьте текста)."), "error")
            return
        self.stage.value = note(error_text(e), "error")


# lab.corpus.tokenizer's words for a vocabulary the text cannot fill.
_TOO_LARGE = re.compile(r"vocab (\d+) is too large for this text: it allows at most (\d+)")


# `lab prepare`'s stages in their order, each a third of the bar: reading the sources (their size is
# not known ahead), reading them for the tokenizer (when one is trained), writing the shards.
_STAGE_ORDER = ("reading for the tokenizer", "tokenizing ")


def _overall(stage: str, done: int, total: int | None) -> float:
    """Where the whole prepare is, 0 to 1, from one stage's bytes: the bar never goes back."""
    at = next((i + 1 for i, s in enumerate(_STAGE_ORDER) if stage.startswith(s)), 0)
    part = min(1.0, done / total) if total else 0.0
    return (at + part) / 3 if stage.startswith(("reading", "tokenizing")) else 0.0


_STAGES_RU = (("reading for the tokenizer", "читаю текст для токенизатора"), ("reading ", "читаю "),
              ("tokenizing ", "разбиваю на токены "), (" into shards", " в шарды"),
              ("tokenizer: training a BPE tokenizer", "токенизатор: учу BPE-токенизатор"),
              ("tokenizer: reusing", "токенизатор: беру готовый"), ("training vocab", "учу словарь"), ("already prepared", "уже подготовлено"),
              ("prepared", "подготовлено"), ("trained on", "обучен на"), ("is too large for", "слишком велик для"),
              ("bytes of text", "байт текста"), ("at most", "не больше"), ("takes", "берёт"), ("vocab", "словарь"),
              (" on ", " на "))


def _stage_words(stage: str) -> str:
    """A stage of `lab prepare` in the view's language."""
    if lang() == "en":
        return stage
    for en, ru in _STAGES_RU:
        stage = stage.replace(en, ru)
    return stage
