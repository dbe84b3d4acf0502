"""Sampling: the KV cache gives the full-context path's tokens, seeds repeat, text streams whole."""
from __future__ import annotations

import itertools

import pytest
import torch

from lab.kernel.model import GPT, sample_next
from lab.models.sampling import Settings, TextStream, Utf8Guard, generate, prompt_ids, sample, token_ids


def full_context_tokens(model: GPT, idx: torch.Tensor, count: int, generator: torch.Generator,
                        temperature=0.8, top_k=50, top_p=1.0) -> torch.Tensor:
    """The path without a cache, nanoGPT's: every token recomputes the whole window, which past
    the context is the last `context` tokens (positions 0..n-1 again)."""
    out = []
    for _ in range(count):
        logits = model(idx[:, -model.context:])[:, -1]
        nxt = sample_next(logits, temperature, top_k, top_p, generator)
        out.append(nxt)
        idx = torch.cat([idx, nxt], dim=1)
    return torch.cat(out, dim=1)


def cached_tokens(model: GPT, idx: torch.Tensor, count: int, generator: torch.Generator, **kw) -> torch.Tensor:
    return torch.cat(list(itertools.islice(model.tokens(idx, generator=generator, **kw), count)), dim=1)


@pytest.mark.parametrize("prompt_len", [1, 7, 40])  # 40: a prompt longer than the context 16
def test_the_cache_gives_the_full_context_paths_tokens_also_past_the_context(prompt_len):
    torch.manual_seed(0)
    model = GPT(vocab=64, context=16, width=32, heads=4, layers=2).eval()
    with torch.no_grad():  # a flatter model than a fresh one samples widely: many tokens to agree on
        model.tok.weight.mul_(3)
    idx = torch.randint(0, 64, (2, prompt_len))
    count = 3 * model.context  # two and a half windows past the context
    with torch.no_grad():
        want = full_context_tokens(model, idx, count, torch.Generator().manual_seed(7), top_k=0)
    got = cached_tokens(model, idx, count, torch.Generator().manual_seed(7), top_k=0)
    assert torch.equal(got, want)
    assert len(set(want.flatten().tolist())) > 20  # the samples are not one token repeated


def test_the_trained_models_cached_samples_are_the_full_context_ones(loaded):
    model = loaded.model
    idx = torch.tensor([prompt_ids(loaded, "The for statement")])
    for kw in ({}, {"top_k": 5}, {"top_p": 0.9, "temperature": 1.2}, {"temperature": 0}):
        with torch.no_grad():
            want = full_context_tokens(model, idx, 100, torch.Generator().manual_seed(3), **kw)
        assert torch.equal(cached_tokens(model, idx, 100, torch.Generator().manual_seed(3), **kw), want), kw


def test_temperature_0_takes_the_likeliest_token_and_draws_nothing():
    logits = torch.tensor([[0.1, 2.0, -1.0, 2.0], [3.0, 0.0, 0.0, 0.0]])
    generator = torch.Generator().manual_seed(0)
    state = generator.get_state()
    assert sample_next(logits, 0, top_k=1, generator=generator).tolist() == [[1], [0]]  # the first of equals
    assert torch.equal(generator.get_state(), state)


def test_the_cache_feeds_one_position_per_new_token():
    model = GPT(vocab=32, context=16, width=16, heads=2, layers=1).eval()
    fed = []
    model.tok.register_forward_hook(lambda module, args, out: fed.append(args[0].size(1)))
    list(itertools.islice(model.tokens(torch.zeros(1, 5, dtype=torch.long)), 20))
    # The prompt once, then one position each until the context is full, then the window of 16.
    assert fed == [5] + [1] * 11 + [16] * 8


def test_generate_is_the_prompt_and_the_sampled_tokens():
    model = GPT(vocab=32, context=8, width=16, heads=2, layers=1).eval()
    idx = torch.randint(0, 32, (1, 3))
    out = model.generate(idx, 12, generator=torch.Generator().manual_seed(1))
    assert out.shape == (1, 15) and torch.equal(out[:, :3], idx)
    assert torch.equal(out[:, 3:], cached_tokens(model, idx, 12, torch.Generator().manual_seed(1), top_k=50))


def test_top_k_and_top_p_keep_only_the_likeliest_tokens():
    logits = torch.log(torch.tensor([[0.05, 0.5, 0.15, 0.3]]))
    gen = torch.Generator().manual_seed(0)

    def drawn(**kw):
        return {int(sample_next(logits, 1.0, generator=gen, **kw)) for _ in range(400)}
    assert drawn() == {0, 1, 2, 3}
    assert drawn(top_k=2) == {1, 3}
    assert drawn(top_p=0.7) == {1, 3}  # 0.5 + 0.3 reach 0.7: the rest is cut
    assert drawn(top_p=0.5) == {1}


def test_samples_repeat_by_seed_and_sample_i_is_seed_plus_i(loaded):
    s = Settings(tokens=40, seed=11)
    first = sample(loaded, "The ", s)
    assert sample(loaded, "The ", s) == first
    assert sample(loaded, "The ", Settings(tokens=40, seed=12)) != first
    assert sample(loaded, "The ", s, index=1) == sample(loaded, "The ", Settings(tokens=40, seed=12))


RUSSIAN = "Ёжик в тумане: «Лошадка!» — крикнул он 🦔🌫️\n"


def test_a_russian_prompt_round_trips_through_the_tokenizer_and_the_stream(loaded):
    sp = loaded.tokenizer
    ids = sp.encode(RUSSIAN)
    assert any(sp.is_byte(i) for i in ids)  # an English vocabulary: ё, «» and emoji go through bytes
    stream = TextStream(sp)
    pieces = [stream.push(i) for i in ids] + [stream.flush()]
    assert "".join(pieces) == RUSSIAN
    assert not any("\ufffd" in p for p in pieces)  # never half a character
    assert sum(len(p.encode()) for p in pieces if p) == len(RUSSIAN.encode())


@pytest.mark.parametrize("prompt", ["", RUSSIAN])
def test_an_unprompted_sample_streams_whole_characters_only(loaded, prompt):
    # This tiny English model, barely trained, draws byte pieces most of the time after an EOS
    # or a Russian prompt: unguarded, over a third of its text was U+FFFD.
    s = Settings(tokens=120, seed=5)
    ids = list(token_ids(loaded, prompt, s))
    streamed = list(generate(loaded, prompt, s))
    assert sum(loaded.tokenizer.is_byte(i) for i in ids) > 30
    assert "".join(streamed) == loaded.tokenizer.decode(ids) == sample(loaded, prompt, s)
    assert not any("\ufffd" in p for p in streamed)
    assert len(streamed) > 10  # streamed in pieces, not at the end


def test_a_sample_that_reaches_its_length_inside_a_character_finishes_it(loaded):
    s = Settings(tokens=200, seed=2)
    ids = list(token_ids(loaded, "", s))
    byte = {i: int(loaded.tokenizer.id_to_piece(i)[1:-1], 16) for i in ids if loaded.tokenizer.is_byte(i)}
    k = next(k for k, i in enumerate(ids) if byte.get(i, 0) >= 0xE0)  # a lead byte of three or four
    short = list(token_ids(loaded, "", Settings(tokens=k + 1, seed=2)))
    assert short == ids[:len(short)] and len(short) == k + 1 + (3 if byte[ids[k]] >= 0xF0 else 2)
    assert "\ufffd" not in loaded.tokenizer.decode(short)


def test_the_guard_lets_only_the_bytes_a_character_needs_follow_its_lead_byte(loaded):
    sp = loaded.tokenizer
    byte = {int(sp.id_to_piece(i)[1:-1], 16): i for i in range(sp.get_piece_size()) if sp.is_byte(i)}
    guard = Utf8Guard(sp, loaded.model.tok.num_embeddings, torch.device("cpu"))

    def allowed() -> set[int]:
        return set(torch.nonzero(~guard.banned()).flatten().tolist())
    between = allowed()
    assert byte[0x41] in between and byte[0xD0] in between and sp.encode("the")[0] in between
    assert not {byte[0x80], byte[0xBF], byte[0xC0], byte[0xFF], sp.unk_id(), sp.bos_id()} & between
    guard.push(byte[0xE0])  # U+0800..U+0FFF: the next byte lies in A0..BF, then one in 80..BF
    assert allowed() == {byte[b] for b in range(0xA0, 0xC0)} and guard.pending == 2
    guard.push(byte[0xA0])
    assert allowed() == {byte[b] for b in range(0x80, 0xC0)}
    guard.push(byte[0x80])
    assert allowed() == between and guard.pending == 0


def test_bytes_that_make_no_character_come_out_as_the_replacement_character(loaded):
    sp = loaded.tokenizer
    byte = {sp.id_to_piece(i): i for i in range(sp.get_piece_size()) if sp.is_byte(i)}
    stream = TextStream(sp)
    ids = [byte["<0xD0>"], byte["<0x41>"], byte["<0xD1>"], byte["<0x91>"]]  # a lead byte without its tail, A, ё
    assert "".join(stream.push(i) for i in ids) + stream.flush() == sp.decode(ids) == "\ufffdAё"


@pytest.mark.parametrize("field,value", [("temperature", -0.1), ("temperature", -1), ("tokens", 0), ("top_p", 0),
                                         ("top_p", 1.5), ("top_k", -1), ("samples", 0)])
def test_bad_settings_are_refused_in_both_languages(field, value):
    problems = Settings(**{field: value}).problems()
    assert [p.field for p in problems] == [field]
    assert problems[0].en and problems[0].ru != problems[0].en
