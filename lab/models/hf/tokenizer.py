"""The kit's sentencepiece tokenizer as a Hugging Face `tokenizers` one (tokenizer.json), written
from the sentencepiece model alone: plain JSON, no `tokenizers` or transformers needed to write it.

The kit trains a byte-fallback BPE with no normalization, no dummy space in front and whitespace
kept as it is (`lab.corpus.tokenizer.train_tokenizer`). Its exact counterpart:

- normalizer: a space becomes "▁", nothing else changes (sentencepiece's identity rule);
- pre-tokenizer: sentencepiece's words, a run of "▁" with the text up to the next "▁"
  (whitespace-only pieces allowed, so a run of spaces stays whole);
- model: BPE over the vocabulary, a merge for every way a piece splits into two pieces,
  ranked by the piece's score as sentencepiece ranks them, with byte fallback;
- decoder: "▁" back to a space, byte pieces back to their UTF-8 text.

The EOS starts every text, as every training document followed one: the post-processor puts it
in front, so `tokenizer(text)` gives what `lab sample` feeds the model, and
`tokenizer(text, add_special_tokens=False)` gives the kit's `encode(text)`.

The decoder differs in one case no encoding gives: a run of byte pieces with a byte that makes
no character decodes, under `tokenizers` alone, to one U+FFFD per byte of the run, where
sentencepiece keeps the valid characters among them. The class that transformers loads
(tokenization_lab_gpt.py) decodes as sentencepiece does; tokenizer.json serves the tools that
read it alone.
"""
from __future__ import annotations

import sentencepiece as spm

from lab.config import UserError

SPACE = "\u2581"  # sentencepiece's "▁"


def _merges(sp: spm.SentencePieceProcessor) -> list[list[str]]:
    """Every split of a piece into two pieces, the likeliest piece's first: sentencepiece merges
    the pair whose piece scores highest, and `tokenizers` the pair listed first."""
    normal = {sp.id_to_piece(i): i for i in range(sp.get_piece_size())
              if not (sp.is_byte(i) or sp.is_control(i) or sp.is_unknown(i) or sp.is_unused(i))}
    found = []
    for piece, i in normal.items():
        for cut in range(1, len(piece)):
            if piece[:cut] in normal and piece[cut:] in normal:
                found.append((-sp.get_score(i), i, cut))
    found.sort()
    return [[sp.id_to_piece(i)[:cut], sp.id_to_piece(i)[cut:]] for _, i, cut in found]


def check_kind(sp: spm.SentencePieceProcessor) -> None:
    """The tokenizer is of the kind the kit trains, which tokenizer.json reproduces."""
    pieces = sp.encode(" a  b", out_type=str)
    if not sp.is_byte(3) or "".join(pieces) != f"{SPACE}a{SPACE}{SPACE}b" or sp.eos_id() < 0:
        raise UserError("this tokenizer is not the kit's kind (sentencepiece BPE with byte pieces, an EOS, no "
                        "dummy space, whitespace kept): tokenizer.json cannot reproduce it")


def tokenizer_json(sp: spm.SentencePieceProcessor) -> dict:
    """tokenizer.json's content for the sentencepiece model `sp`."""
    check_kind(sp)
    eos = sp.id_to_piece(sp.eos_id())
    special = [{"id": i, "content": sp.id_to_piece(i), "single_word": False, "lstrip": False, "rstrip": False,
                "normalized": False, "special": True}
               for i in range(sp.get_piece_size()) if sp.is_control(i) or sp.is_unknown(i)]
    return {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": special,
        "normalizer": {"type": "Replace", "pattern": {"String": " "}, "content": SPACE},
        "pre_tokenizer": {"type": "Split", "pattern": {"Regex": f"{SPACE}*[^{SPACE}]+|{SPACE}+"},
                          "behavior": "Isolated", "invert": False},
        "post_processor": {
            "type": "TemplateProcessing",
            "single": [{"SpecialToken": {"id": eos, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
            "pair": [{"SpecialToken": {"id": eos, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                     {"SpecialToken": {"id": eos, "type_id": 1}}, {"Sequence": {"id": "B", "type_id": 1}}],
            "special_tokens": {eos: {"id": eos, "ids": [sp.eos_id()], "tokens": [eos]}}},
        "decoder": {"type": "Sequence", "decoders": [
            {"type": "Replace", "pattern": {"String": SPACE}, "content": " "},
            {"type": "ByteFallback"}, {"type": "Fuse"}]},
        "model": {"type": "BPE", "dropout": None, "unk_token": sp.id_to_piece(sp.unk_id()),
                  "continuing_subword_prefix": None, "end_of_word_suffix": None, "fuse_unk": True,
                  "byte_fallback": True, "ignore_merges": False,
                  "vocab": {sp.id_to_piece(i): i for i in range(sp.get_piece_size())}, "merges": _merges(sp)}}


def tokenizer_config(sp: spm.SentencePieceProcessor, context: int) -> dict:
    """tokenizer_config.json: the class that reads tokenizer.json (shipped beside it,
    tokenization_lab_gpt.py) and the special tokens. Text is
    text: "</s>" written in a prompt is four characters, as the kit encodes it. The EOS is also
    the BOS (it starts every text); padding, on the left for `generate()`, is sentencepiece's
    BOS `<s>`, which no training text holds."""
    eos, unk = sp.id_to_piece(sp.eos_id()), sp.id_to_piece(sp.unk_id())
    return {"tokenizer_class": "LabGPTTokenizer",
            "auto_map": {"AutoTokenizer": [None, "tokenization_lab_gpt.LabGPTTokenizer"]},
            "bos_token": eos, "eos_token": eos,
            "pad_token": sp.id_to_piece(pad_id(sp)), "unk_token": unk, "split_special_tokens": True,
            "clean_up_tokenization_spaces": False, "model_max_length": context, "padding_side": "left",
            "model_input_names": ["input_ids", "attention_mask"]}


def pad_id(sp: spm.SentencePieceProcessor) -> int:
    return sp.bos_id() if sp.bos_id() >= 0 else sp.eos_id()
