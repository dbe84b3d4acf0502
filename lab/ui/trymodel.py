""""Try the model": pick a run and one of its checkpoints, write a prompt, set the sampling,
press Generate, and the text streams into the cell as the model writes it (`lab.models`).

The model is loaded once per checkpoint and kept; generation runs in a background thread,
so the notebook stays responsive and Stop ends it between two tokens. Wrong settings are
said beside their field, a run without a checkpoint beside the run: never a traceback.
"""
from __future__ import annotations

import threading
import time
from pathlib import Path

import ipywidgets as widgets

from lab.config import Problem, UserError
from lab.ui.calc import ORANGE, RED
from lab.ui.text import Panel, esc, lang, on_language, tr

REDRAW_S = 0.1  # the streamed text is redrawn at most this often: a widget message per token is too many
SETTINGS = {  # field -> (label EN, RU), (help EN, RU)
    "tokens": (("New tokens", "Новых токенов"), ("At most; a sample also ends where the model ends its text.",
                                                  "Не больше; образец кончается и там, где модель закончила текст.")),
    "temperature": (("Temperature", "Температура"), ("Above 0. Lower: more predictable; higher: more varied.",
                                                     "Больше 0. Ниже — предсказуемее, выше — разнообразнее.")),
    "top_k": (("Top-k", "Top-k"), ("Choose among the k likeliest tokens; 0: among all.",
                                   "Выбирать из k самых вероятных токенов; 0 — из всех.")),
    "top_p": (("Top-p", "Top-p"), ("... and among the fewest whose probability reaches p; 1: no cut.",
                                   "… и из самых вероятных, чья сумма вероятностей достигает p; 1 — без отсечения.")),
    "seed": (("Seed", "Зерно (seed)"), ("The same seed gives the same text.", "То же зерно — тот же текст.")),
    "samples": (("Samples", "Образцов"), ("Each with the next seed.", "Каждый со следующим зерном.")),
}


def runs_with_checkpoints() -> list:
    """The lab's runs that have a checkpoint to sample from, newest first."""
    from lab.kernel.checkpoint import list_checkpoints
    from lab.runs import list_runs
    from lab.ui.parts import newest_first
    return [r for r in newest_first(list_runs()) if list_checkpoints(r.folder / "checkpoints")]


class TryModel(Panel):
    def __init__(self, run_id: str | None = None):
        from lab.models.sampling import Settings
        defaults = Settings()
        self.run = widgets.Dropdown(layout=widgets.Layout(width="30em"))
        self.checkpoint = widgets.Dropdown(layout=widgets.Layout(width="14em"))
        self.run_message = widgets.HTML()
        self.prompt = widgets.Textarea(layout=widgets.Layout(width="46em", height="5em"))
        self.inputs = {"tokens": widgets.IntText(defaults.tokens), "temperature": widgets.FloatText(defaults.temperature),
                       "top_k": widgets.IntText(defaults.top_k), "top_p": widgets.FloatText(defaults.top_p),
                       "seed": widgets.IntText(defaults.seed), "samples": widgets.IntText(defaults.samples)}
        self.labels = {name: widgets.HTML(layout=widgets.Layout(width="10em")) for name in SETTINGS}
        self.messages = {name: widgets.HTML() for name in SETTINGS}
        self.refresh_button = widgets.Button(icon="refresh", layout=widgets.Layout(width="auto"))
        self.generate_button = widgets.Button(button_style="primary", icon="play")
        self.stop_button = widgets.Button(icon="stop", disabled=True)
        self.output = widgets.HTML()
        self.output.add_class("lab-try-output")
        for name, w in self.inputs.items():
            w.layout.width = "8em"
            w.add_class(f"lab-try-{name}")
        rows = [widgets.HBox([self.labels[n], self.inputs[n], self.messages[n]]) for n in SETTINGS]
        self.box = widgets.VBox([widgets.HBox([self.run, self.checkpoint, self.refresh_button]), self.run_message, self.prompt,
                                 *rows, widgets.HBox([self.generate_button, self.stop_button]), self.output])
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
        self._fill_runs(run_id)
        on_language(self._relabel)
        self._relabel()

    # --- choices -------------------------------------------------------------------------
    def _fill_runs(self, selected: str | None) -> None:
        ids = [r.id for r in runs_with_checkpoints()]
        self.run.options = ids or [(tr("— no run has a checkpoint yet —", "— ни у одного прогона пока нет чекпоинта —"), "")]
        self.run.value = selected if selected in ids else (ids[0] if ids else "")
        self._fill_checkpoints()

    def _fill_checkpoints(self) -> None:
        from lab.kernel.checkpoint import checkpoint_step, list_checkpoints
        from lab.runs import load_run
        paths = list(reversed(list_checkpoints(load_run(self.run.value).folder / "checkpoints"))) if self.run.value else []
        self.checkpoint.options = [(f"{tr('step', 'шаг')} {checkpoint_step(p):,}", str(p)) for p in paths] or [("—", "")]
        self.checkpoint.value = str(paths[0]) if paths else ""
        self.generate_button.disabled = not paths

    def _relabel(self) -> None:
        for name, ((en, ru), (help_en, help_ru)) in SETTINGS.items():
            self.labels[name].value = f"<b title='{esc(tr(help_en, help_ru))}'>{esc(tr(en, ru))}</b>"
        self.run.description, self.checkpoint.description = tr("Run", "Прогон"), tr("Checkpoint", "Чекпоинт")
        self.prompt.placeholder = tr("The beginning of a text (may be empty)", "Начало текста (можно пустое)")
        self.refresh_button.description = tr("Refresh", "Обновить")
        self.generate_button.description = tr("Generate", "Сгенерировать")
        self.stop_button.description = tr("Stop", "Стоп")
        if not self.run.value:
            self._fill_runs(None)  # the "no run" line in the new language
        self._show_problems(self.settings().problems())

    # --- settings ------------------------------------------------------------------------
    def settings(self):
        from lab.models.sampling import Settings
        return Settings(**{name: w.value for name, w in self.inputs.items()})

    def _show_problems(self, problems: list[Problem]) -> None:
        for name, message in self.messages.items():
            mine = [p for p in problems if p.field == name]
            message.value = "".join(f"<span style='color:{RED};font-size:90%'>✖ {esc(p.message(lang()))}</span>"
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
            self.run_message.value = f"<span style='color:{RED}'>✖ {esc(e)}</span>"
            return None
        self.run_message.value = (f"<span style='color:#666'>{esc(tr('step', 'шаг'))} {loaded.meta['step']:,} · "
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
        from lab.models.loading import load_model
        path = Path(checkpoint)
        if not path.is_file():  # a run that trains on keeps its newest two
            raise UserError(tr(f"checkpoint {path.name} is gone (the run saved newer ones): press Refresh",
                               f"чекпоинта {path.name} уже нет (прогон сохранил новые): нажмите «Обновить»"))
        key = (str(path), path.stat().st_mtime_ns)
        if key not in self._models:
            self._models = {key: load_model(path)}  # one model held at a time: memory
        return self._models[key]

    def _write(self, loaded, prompt: str, settings) -> None:
        from lab.models.sampling import generate
        drawn = 0.0
        try:
            for i in range(settings.samples):
                self.text += ("\n\n———\n\n" if i else "") + prompt
                for piece in generate(loaded, prompt, settings, index=i):
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

    def _draw(self, streaming: bool) -> None:
        cursor = "▍" if streaming else ""
        stopped = f"<div style='color:{ORANGE}'>{esc(tr('stopped', 'остановлено'))}</div>" \
            if self._stop.is_set() and not streaming else ""
        self.output.value = (f"<pre style='white-space:pre-wrap;font-size:95%;background:#f7f7f7;padding:6px'>"
                             f"{esc(self.text)}{cursor}</pre>{stopped}")
