"""The calculator's answer: figures that carry their kind and source, and the problems."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from lab.config import Problem, RunConfig


@dataclass
class Figure:
    value: Any
    kind: str  # exact | measured | calibrated | estimate | unknown
    unit: str = ""
    note: str = ""
    note_ru: str = ""
    extra: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        d = {"value": self.value, "kind": self.kind}
        if self.unit:
            d["unit"] = self.unit
        if self.note:
            d["note"], d["note_ru"] = self.note, self.note_ru
        d.update(self.extra)
        return d


def unknown(why: str, why_ru: str, unit: str = "") -> Figure:
    return Figure(None, "unknown", unit, why, why_ru)


@dataclass
class Estimate:
    """The figures beside the form's fields, and what is wrong with the fields."""
    gpu: str
    gpu_auto: bool
    cards: int
    precision: str
    vocab: int
    vocab_source: str  # given | manifest | checkpoint | default
    weights: Figure
    tokens_per_step: Figure
    tokens_wanted: Figure
    tokens_available: Figure
    epochs: Figure
    tokens_planned: Figure
    tok_s: Figure
    run_hours: Figure
    memory_per_card_gb: Figure
    max_batch_per_card: Figure
    quota_hours: Figure
    problems: list[Problem] = field(default_factory=list)
    # kind "fitted": the recipe lab's fit, when one exists for the data; set by the caller that
    # combines the estimate with the recipe lab (lab.recipes.predict.predicted)
    predicted_val_loss: Figure | None = None
    config: RunConfig | None = None  # the fields as sized: a continued run's model fields are its checkpoint's
    manifest: dict | None = None  # the prepared data's manifest it was sized on, where there is one

    FIGURES = ("weights", "tokens_per_step", "tokens_wanted", "tokens_available", "epochs", "tokens_planned",
               "tok_s", "run_hours", "memory_per_card_gb", "max_batch_per_card", "quota_hours")

    @property
    def errors(self) -> list[Problem]:
        return [p for p in self.problems if p.severity == "error"]

    @property
    def hours_to_finish(self) -> float | None:
        """GPU quota the rest of the run needs on Kaggle (to `steps_until`, every session's start
        included): the calculator's quota figure, which the Auto rule compares with each
        account's quota. None when the fields do not say."""
        q = self.quota_hours
        return None if q.value is None else float(q.value)

    @property
    def warnings(self) -> list[Problem]:
        return [p for p in self.problems if p.severity != "error"]

    def to_dict(self) -> dict:
        d: dict[str, Any] = {"gpu": self.gpu, "gpu_auto": self.gpu_auto, "cards": self.cards,
                             "precision": self.precision, "vocab": self.vocab, "vocab_source": self.vocab_source}
        for name in self.FIGURES:
            d[name] = getattr(self, name).to_dict()
        if self.predicted_val_loss is not None:
            d["predicted_val_loss"] = self.predicted_val_loss.to_dict()
        d["errors"] = [_problem_dict(p) for p in self.errors]
        d["warnings"] = [_problem_dict(p) for p in self.warnings]
        return d


def _problem_dict(p: Problem) -> dict:
    return {"field": p.field, "severity": p.severity, "en": p.en, "ru": p.ru}


