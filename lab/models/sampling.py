"""Sampling: text from a trained model, streamed as it is generated.

A sample starts where every training document started, after the EOS token, then the
prompt; it ends at the model's own EOS or after `tokens` new tokens. Each new token costs
one position through the model's KV cache (`GPT.tokens`). The same seed gives the same text:
sample i of a call draws from a generator seeded with `seed + i`, so it does not depend on
how many samples were asked for. Text comes out as soon as it is whole: the byte pieces of a
character the vocabulary lacks (Cyrillic letters, emoji under a small English vocabulary)
wait for their last byte, so a stream never shows half a character.
"""
from __future__ import annotations

import codecs
from dataclasses import dataclass
from typing import Iterator

import torch

from lab.config import ConfigError, Problem
from lab.models.loading import Loaded


@dataclass
class Settings:
    tokens: int = 200
    temperature: float = 0.8
    top_k: int = 50
    top_p: float = 1.0
    seed: int = 1337
    samples: int = 1

    def problems(self) -> list[Problem]:
        """What is wrong with the settings, in both languages (the CLI's and the widget's words)."""
        out = []
        if not self.temperature > 0:
            out.append(Problem("temperature", f"temperature {self.temperature} must be above 0 (0.8 is usual; lower "
                               f"is more predictable)", f"температура {self.temperature} должна быть больше 0 "
                               f"(обычно 0.8; ниже — предсказуемее)"))
        if self.tokens < 1:
            out.append(Problem("tokens", f"tokens {self.tokens}: ask for at least 1 new token",
                               f"токенов {self.tokens}: нужен хотя бы 1 новый токен"))
        if self.top_k < 0:
            out.append(Problem("top_k", f"top-k {self.top_k} must be 0 (all tokens) or more",
                               f"top-k {self.top_k}: должно быть 0 (все токены) или больше"))
        if not 0 < self.top_p <= 1:
            out.append(Problem("top_p", f"top-p {self.top_p} must be in (0, 1] (1: no cut)",
                               f"top-p {self.top_p}: должно быть в (0, 1] (1 — без отсечения)"))
        if self.samples < 1:
            out.append(Problem("samples", f"samples {self.samples}: ask for at least 1",
                               f"образцов {self.samples}: нужен хотя бы 1"))
        return out

    def check(self) -> "Settings":
        if self.problems():
            raise ConfigError(self.problems())
        return self


class TextStream:
    """Token ids in, text out as soon as it is whole, exactly as the tokenizer decodes the ids
    all at once. A piece gives its text at once; a byte piece (`<0xD0>`) gives its byte to the
    run of bytes it continues, whose characters come out as each one completes. A run that
    holds bytes which make no character waits for its end, and the tokenizer decodes it
    (into U+FFFD where it must)."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.run: list[int] = []  # the byte pieces not yet given out
        self.broken = False  # the run holds bytes that make no character
        self.decoder = codecs.getincrementaldecoder("utf-8")()

    def push(self, token: int) -> str:
        sp = self.tokenizer
        if not sp.is_byte(token):
            return self.flush() + ("" if sp.is_control(token) else sp.decode([token]))
        self.run.append(token)
        if self.broken:
            return ""
        try:
            text = self.decoder.decode(bytes([int(sp.id_to_piece(token)[1:-1], 16)]))
        except UnicodeDecodeError:
            self.broken = True
            return ""
        if text:
            del self.run[:len(text.encode("utf-8"))]
        return text

    def flush(self) -> str:
        """What the run still holds, decoded (at a piece that is no byte, or the end)."""
        text = self.tokenizer.decode(self.run) if self.run else ""
        self.run, self.broken = [], False
        self.decoder.reset()
        return text


def prompt_ids(loaded: Loaded, prompt: str) -> list[int]:
    """EOS, then the prompt's tokens: every document the model learned from followed an EOS."""
    return [loaded.eos_id] + loaded.tokenizer.encode(prompt)


def token_ids(loaded: Loaded, prompt: str, settings: Settings, index: int = 0) -> Iterator[int]:
    """The token ids sampled after `prompt` (sample `index` of a call), up to the model's EOS."""
    settings.check()
    idx = torch.tensor([prompt_ids(loaded, prompt)], device=loaded.device)
    generator = torch.Generator(device=loaded.device).manual_seed(settings.seed + index)
    tokens = loaded.model.tokens(idx, settings.temperature, settings.top_k, settings.top_p, generator)
    for _ in range(settings.tokens):
        with loaded.autocast():  # around each step only: the caller's code between tokens runs as it was
            token = int(next(tokens))
        if token == loaded.eos_id:
            return
        yield token


def generate(loaded: Loaded, prompt: str, settings: Settings, index: int = 0) -> Iterator[str]:
    """The text sampled after `prompt`, in pieces as it is generated."""
    text = TextStream(loaded.tokenizer)
    for token in token_ids(loaded, prompt, settings, index):
        piece = text.push(token)
        if piece:
            yield piece
    rest = text.flush()
    if rest:
        yield rest


def sample(loaded: Loaded, prompt: str, settings: Settings, index: int = 0) -> str:
    """The whole text of one sample after `prompt`."""
    return "".join(generate(loaded, prompt, settings, index))
