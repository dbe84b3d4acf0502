"""Sampling: text from a trained model, streamed as it is generated.

A sample starts where every training document started, after the EOS token, then the
prompt; it ends at the model's own EOS or after `tokens` new tokens. Each new token costs
one position through the model's KV cache (`GPT.tokens`). The same seed gives the same text:
sample i of a call draws from a generator seeded with `seed + i`, so it does not depend on
how many samples were asked for. Text comes out as soon as it is whole: the byte pieces of a
character the vocabulary lacks (Cyrillic letters, emoji under a small English vocabulary)
wait for their last byte, so a stream never shows half a character. And only bytes that make
characters are drawn (`Utf8Guard`): the model learned from UTF-8 text, so a byte that could not
continue it (a stray continuation byte, a lead byte left unfinished) is noise of a model not yet
trained, which would print as "\ufffd"; the draw is among the tokens that can follow.
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
        if not self.temperature >= 0:
            out.append(Problem("temperature", f"temperature {self.temperature} must be 0 (greedy: the likeliest "
                               f"token) or above (0.8 is usual; lower is more predictable)",
                               f"температура {self.temperature} должна быть 0 (жадно: самый вероятный токен) или "
                               f"больше (обычно 0.8; ниже — предсказуемее)"))
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


# RFC 3629: a lead byte -> the ranges its continuation bytes must lie in, one per byte.
_ANY = (0x80, 0xBF)
_CONTINUATIONS = {**{b: (_ANY,) for b in range(0xC2, 0xE0)}, 0xE0: ((0xA0, 0xBF), _ANY),
                  **{b: (_ANY, _ANY) for b in (*range(0xE1, 0xED), 0xEE, 0xEF)}, 0xED: ((0x80, 0x9F), _ANY),
                  0xF0: ((0x90, 0xBF), _ANY, _ANY), **{b: (_ANY, _ANY, _ANY) for b in range(0xF1, 0xF4)},
                  0xF4: ((0x80, 0x8F), _ANY, _ANY)}


class Utf8Guard:
    """Which tokens may come next so that the text's bytes make characters (`banned`, for
    `GPT.tokens`), told each token drawn (`push`). Between characters a byte piece may be a
    character of its own (0x00-0x7F) or a lead byte; after a lead byte only the continuation
    bytes it needs, nothing else (no piece, no EOS), until the character is whole. The ids no
    training text holds (unk, bos) are never drawn. `pending`: continuation bytes still due."""

    def __init__(self, tokenizer, vocab: int, device: torch.device):
        sp = tokenizer
        byte_of = {i: int(sp.id_to_piece(i)[1:-1], 16) for i in range(sp.get_piece_size()) if sp.is_byte(i)}
        never = torch.zeros(vocab, dtype=torch.bool, device=device)
        never[[i for i in (sp.unk_id(), sp.bos_id()) if 0 <= i < vocab]] = True

        def allowing_only(lo: int, hi: int) -> torch.Tensor:
            mask = torch.ones(vocab, dtype=torch.bool, device=device)
            mask[[i for i, b in byte_of.items() if lo <= b <= hi and i < vocab]] = False
            return mask
        self.between = never.clone()
        self.between[[i for i, b in byte_of.items() if i < vocab and 0x80 <= b and b not in _CONTINUATIONS]] = True
        self.within = {r: allowing_only(*r) for r in {r for rs in _CONTINUATIONS.values() for r in rs}}
        self.byte_of, self.due = byte_of, ()

    @property
    def pending(self) -> int:
        return len(self.due)

    def banned(self) -> torch.Tensor:
        return self.within[self.due[0]] if self.due else self.between

    def push(self, token: int) -> None:
        byte = self.byte_of.get(token)
        self.due = self.due[1:] if self.due else _CONTINUATIONS.get(byte, ()) if byte is not None else ()


def prompt_ids(loaded: Loaded, prompt: str) -> list[int]:
    """EOS, then the prompt's tokens: every document the model learned from followed an EOS."""
    return [loaded.eos_id] + loaded.tokenizer.encode(prompt)


def token_ids(loaded: Loaded, prompt: str, settings: Settings, index: int = 0) -> Iterator[int]:
    """The token ids sampled after `prompt` (sample `index` of a call), up to the model's EOS,
    every byte of them part of a whole character (`Utf8Guard`): a sample that reaches its
    `tokens` inside a character draws its last bytes too (at most three)."""
    settings.check()
    idx = torch.tensor([prompt_ids(loaded, prompt)], device=loaded.device)
    generator = torch.Generator(device=loaded.device).manual_seed(settings.seed + index)
    guard = Utf8Guard(loaded.tokenizer, loaded.model.tok.num_embeddings, loaded.device)
    tokens = loaded.model.tokens(idx, settings.temperature, settings.top_k, settings.top_p, generator,
                                 banned=guard.banned)
    drawn = 0
    while drawn < settings.tokens or guard.pending:
        with loaded.autocast():  # around each step only: the caller's code between tokens runs as it was
            token = int(next(tokens))
        if token == loaded.eos_id:
            return
        guard.push(token)
        drawn += 1
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
