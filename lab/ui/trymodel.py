""""Try the model": pick a run and one of its checkpoints, write a prompt, set the sampling,
press Generate, and the text streams into the cell as the model writes it (`lab.models`).
Export writes the checkpoint as `lab export` does, and shows the lines that load it in transformers.

The model is loaded once per checkpoint and kept; generation runs in a background thread,
so the notebook stays responsive and Stop ends it between two tokens. Wrong settings are
said beside their field, a run without a checkpoint beside the run: never a traceback.
"""
from __future__ import annotations

import threading
import time
from pathlib import Path

import ipywidgets as widgets

from lab.api import runs as lab_runs
from lab.config import Problem, UserError
from lab.ui.parts import ORANGE, RED, button, row
from lab.ui.text import Panel, error_text, esc, num, on_language, problem_text, tr

REDRAW_S = 0.1  # the streamed text is redrawn at most this often: a widget message per token is too many
SETTINGS = {  # field -> (label EN, RU), (help EN, RU)
    "tokens": (("New tokens", "Новых токенов"), ("At most; a sample also ends where the model ends its text.",
                                                  "Не больше; образец кончается и там, где модель закончила текст.")),
    "temperature": (("Temperature", "Температура"), ("Lower: more predictable; higher: more varied; 0: always the "
                                                     "likeliest token.", "Ниже — предсказуемее, выше — разнообразнее; "
                                                     "0 — всегда самый вероятный токен.")),
    "top_k": (("Top-k", "Top-k"), ("Choose among the k likeliest tokens; 0: among all.",
                                   "Выбирать из k самых вероятных токенов; 0 — из всех.")),
    "top_p": (("Top-p", "Top-p"), ("... and among the fewest whose probability reaches p; 1: no cut.",
                                   "… и из самых вероятных, чья сумма вероятностей достигает p; 1 — без отсечения.")),
    "seed": (("Seed", "Зерно (seed)"), ("The same seed gives the same text.", "То же зерно — тот же текст.")),
    "samples": (("Samples", "Образцов"), ("Each with the next seed.", "Каждый со следующим зерном.")),
}


def _step_label(step: int) -> str:
    return f"{tr('step', 'шаг')} {num(step)}"


class TryModel(Panel):
    def __init__(self, run_id: str | None = None):
        from lab.api import models  # torch: only once a model is tried (the cell shows without it)
        defaults = models.Settings()
        self.run = widgets.Dropdown(layout=widgets.Layout(width="30em"))
        self.checkpoint = widgets.Dropdown(layout=widgets.Layout(width="14em"))
        self.run_message = widgets.HTML()
        self.prompt = widgets.Textarea(layout=widgets.Layout(width="46em", height="5em"))
        self.inputs = {"tokens": widgets.IntText(defaults.tokens), "temperature": widgets.FloatText(defaults.temperature),
                       "top_k": widgets.IntText(defaults.top_k), "top_p": widgets.FloatText(defaults.top_p),
                       "seed": widgets.IntText(defaults.seed), "samples": widgets.IntText(defaults.samples)}
        self.labels = {name: widgets.HTML(layout=widgets.Layout(width="10em")) for name in SETTINGS}
        self.messages = {name: widgets.HTML() for name in SETTINGS}
        self.refresh_button = button("lab-try-refresh", "refresh")
        self.generate_button = button("lab-try-generate", "play", "primary")
        self.stop_button = button("lab-try-stop", "stop")
        self.stop_button.disabled = True
        self.export_button = button("lab-try-export", "download")
        self.export_message = widgets.HTML()
        self.output = widgets.HTML()
        self.output.add_class("lab-try-output")
        for name, w in self.inputs.items():
            w.layout.width = "8em"
            w.add_class(f"lab-try-{name}")
        rows = [widgets.HBox([self.labels[n], self.inputs[n], self.messages[n]]) for n in SETTINGS]
        self.box = widgets.VBox([row([self.run, self.checkpoint, self.refresh_button]), self.run_message, self.prompt,
                                 *rows, row([self.generate_button, self.stop_button, self.export_button]),
                                 self.export_message, self.output])
        self.box.add_class("lab-try-model")
        self._models: dict[tuple, object] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.text = ""
        self.run.observe(lambda _: self._fill_checkpoints(), names="value")
        for w in self.inputs.values():
            w.observe(lambda _: self._show_problems(self.settings().problems()), names="value")
        self.refresh_button.on_click(lambda _: self._fill_runs(self.run.value))
        self.generate_button.on_click(lambda _: self.generate())
        self.stop_button.on_click(lambda _: self._stop.set())
        self.export_button.on_click(lambda _: self.export())
        self._fill_runs(run_id)
        on_language(self._relabel)
        self._relabel()

    # --- choices -------------------------------------------------------------------------
    def _fill_runs(self, selected: str | None) -> None:
        ids = lab_runs.with_checkpoints()
        self.run.options = ids or [(tr("— no run has a checkpoint yet —", "— ни у одного прогона пока нет чекпоинта —"), "")]
        self.run.value = selected if selected in ids else (ids[0] if ids else "")
        self._fill_checkpoints()

    def _fill_checkpoints(self) -> None:
        kept = lab_runs.run_checkpoints(self.run.value) if self.run.value else []
        self._steps = {str(path): step for step, path in kept}
        self.checkpoint.options = [(_step_label(step), path) for path, step in self._steps.items()] or [("—", "")]
        self.checkpoint.value = next(iter(self._steps), "")
        paths = list(self._steps)
        self.generate_button.disabled = self.export_button.disabled = not paths

    def _relabel(self) -> None:
        for name, ((en, ru), (help_en, help_ru)) in SETTINGS.items():
            self.labels[name].value = f"<b title='{esc(tr(help_en, help_ru))}'>{esc(tr(en, ru))}</b>"
        self.run.description, self.checkpoint.description = tr("Run", "Прогон"), tr("Checkpoint", "Чекпоинт")
        self.prompt.placeholder = tr("The beginning of a text (may be empty)", "Начало текста (можно пустое)")
        self.refresh_button.description = tr("Refresh", "Обновить")
        self.generate_button.description = tr("Generate", "Сгенерировать")
        self.stop_button.description = tr("Stop", "Стоп")
        self.export_button.description = tr("Export", "Экспорт")
        self.export_button.tooltip = tr("Write this checkpoint as lab export does: safetensors, a model card, a "
                                        "folder Hugging Face transformers loads", "Записать этот чекпоинт, как "
                                        "lab export: safetensors, карточка модели, папка для Hugging Face transformers")
        if not self.run.value:
            self._fill_runs(None)  # the "no run" line in the new language
        else:  # the same checkpoints, "step 1,500" / "шаг 1 500" in the new language, the one picked kept
            picked = self.checkpoint.value
            self.checkpoint.options = [(_step_label(self._steps[p]), p) if p in self._steps else (label, p)
                                       for label, p in self.checkpoint.options]
            self.checkpoint.value = picked
        self._show_problems(self.settings().problems())

    # --- settings ------------------------------------------------------------------------
    def settings(self):
        from lab.api import models  # torch: only once a model is tried (the cell shows without it)
        return models.Settings(**{name: w.value for name, w in self.inputs.items()})

    def _show_problems(self, problems: list[Problem]) -> None:
        for name, message in self.messages.items():
            mine = [p for p in problems if p.field == name]
            message.value = "".join(f"<span style='color:{RED};font-size:90%'>✖ {esc(problem_text(p))}</span>"
                                    for p in mine)
            self.inputs[name].layout.border = f"2px solid {RED}" if mine else None

    # --- generating ----------------------------------------------------------------------
    def generate(self, wait: bool = False) -> str | None:
        """Presses Generate; `wait` returns the text when it is done (headless use)."""
        problems = self.settings().problems()
        self._show_problems(problems)
        if problems or self._thread is not None and self._thread.is_alive():
            return None
        try:
            loaded = self._model(self.checkpoint.value)
        except UserError as e:
            self.run_message.value = f"<span style='color:{RED}'>✖ {esc(error_text(e))}</span>"
            return None
        self.run_message.value = (f"<span style='color:#666'>{esc(tr('step', 'шаг'))} {num(loaded.meta['step'])} · "
                                  f"{esc(loaded.device.type)} {esc(loaded.precision)}</span>")
        self._stop.clear()
        self.text = ""
        self.generate_button.disabled, self.stop_button.disabled = True, False
        self._thread = threading.Thread(target=self._write, args=(loaded, self.prompt.value, self.settings()),
                                        daemon=True)
        self._thread.start()
        if wait:
            self._thread.join()
            return self.text
        return None

    def _model(self, checkpoint: str):
        if not checkpoint:
            raise UserError(tr("pick a run with a checkpoint", "выберите прогон с чекпоинтом"))
        from lab.api import models  # torch: only once a model is tried (the cell shows without it)
        path = Path(checkpoint)
        if not path.is_file():  # a run that trains on keeps its newest two
            raise UserError(tr(f"checkpoint {path.name} is gone (the run saved newer ones): press Refresh",
                               f"чекпоинта {path.name} уже нет (прогон сохранил новые): нажмите «Обновить»"))
        key = (str(path), path.stat().st_mtime_ns)
        if key not in self._models:
            self._models = {key: models.load(path)}  # one model held at a time: memory
        return self._models[key]

    def _write(self, loaded, prompt: str, settings) -> None:
        from lab.api import models  # torch: only once a model is tried (the cell shows without it)
        drawn = 0.0
        try:
            for i in range(settings.samples):
                self.text += ("\n\n———\n\n" if i else "") + prompt
                for piece in models.sample(loaded, prompt, settings, index=i):
                    self.text += piece
                    if time.monotonic() - drawn >= REDRAW_S:
                        self._draw(streaming=True)
                        drawn = time.monotonic()
                    if self._stop.is_set():
                        return
        except Exception as e:  # noqa: BLE001 - said beside the run, as the panels do: no traceback in the cell
            self.run_message.value = f"<span style='color:{RED}'>✖ {esc(e if isinstance(e, UserError) else repr(e))}</span>"
        finally:
            self._draw(streaming=False)
            self.generate_button.disabled, self.stop_button.disabled = False, True

    # --- exporting -----------------------------------------------------------------------
    def export(self, wait: bool = False) -> None:
        """Presses Export: the checkpoint into $LAB_HOME/exports/RUN-stepN, in a background
        thread (a large model takes a while to write); `wait` returns when it is written."""
        if not self.checkpoint.value or self.export_button.disabled:
            return
        self.export_button.disabled = True
        self.export_message.value = f"<span style='color:#666'>{esc(tr('exporting…', 'экспорт…'))}</span>"
        thread = threading.Thread(target=self._export, args=(self.checkpoint.value,), daemon=True)
        thread.start()
        if wait:
            thread.join()

    def _export(self, checkpoint: str) -> None:
        from lab.api import models  # torch: only once a model is exported (the cell shows without it)
        try:
            out = models.export(checkpoint)
        except UserError as e:
            self.export_message.value = f"<span style='color:{RED}'>✖ {esc(tr(str(e), e.ru or str(e)))}</span>"
        else:
            self.export_message.value = (
                f"<div>{esc(tr('exported to', 'записано в'))} <code>{esc(out)}</code> · "
                f"{esc(tr('in Hugging Face transformers', 'в Hugging Face transformers'))} ({esc(models.INSTALL)}):</div>"
                f"<pre style='font-size:90%'>{esc(models.LOAD_LINES.format(out=out))}</pre>")
        finally:
            self.export_button.disabled = False

    def _draw(self, streaming: bool) -> None:
        cursor = "▍" if streaming else ""
        stopped = f"<div style='color:{ORANGE}'>{esc(tr('stopped', 'остановлено'))}</div>" \
            if self._stop.is_set() and not streaming else ""
        self.output.value = (f"<pre style='white-space:pre-wrap;font-size:95%;background:#f7f7f7;padding:6px'>"
                             f"{esc(self.text)}{cursor}</pre>{stopped}")
