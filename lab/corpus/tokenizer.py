"""The tokenizer: a byte-fallback BPE (sentencepiece) trained on constellations, stored
content-addressed in `$LAB_HOME/tokenizers/`, and the rule for reusing one."""
from __future__ import annotations

import hashlib
import io
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator

import sentencepiece as spm

from lab import home
from lab.config import UserError
from lab.corpus.constellations import Constellation, Scan
from lab.corpus.folders import Progress, atomic_folder, bar as progress_bar, say

DEFAULT_VOCAB = 4000
MAX_VOCAB = 65535  # token ids are stored as uint16
MIN_VOCAB = 300
# A text too small for the vocabulary asked gets this share of the largest one it allows. Near
# that largest, BPE's last merges join pairs seen once: on 5, 15 and 30 KB of pydoc a vocabulary
# of 3/4 of the largest cut the text into exactly as many tokens as the largest (half of it: 3-10%
# more), so the last quarter is rows of embedding that no token uses.
FIT_SHARE = 0.75
EOS_ID = 2  # sentencepiece ids: 0 unk, 1 bos, 2 eos, then the 256 byte pieces

# Tokenizer training. sentencepiece stores num_threads in the model file, so it is fixed
# (not the machine's core count) to keep the model bytes the same everywhere.
TRAIN_THREADS = 4
TRAIN_SEED = 1337
MAX_LINE_CHARS = 4096  # longer lines are cut for training (4096 chars <= 16384 UTF-8 bytes)
MAX_SENTENCE_BYTES = 16384
MAX_TRAINING_SENTENCES = 5_000_000  # above this sentencepiece samples (seeded, so deterministic)
ENCODE_BATCH_CHARS = 8_000_000

# --- the tokenizer ------------------------------------------------------------------------

@dataclass
class TokenizerInfo:
    tok_id: str
    folder: Path
    sha256: str  # of tokenizer.model
    vocab: int
    trained_on: dict[str, str]  # constellation -> content sha256
    asked: int | None = None  # the vocab asked for, where the text allowed less (`fit`)

    @property
    def model_file(self) -> Path:
        return self.folder / "tokenizer.model"


def _training_sentences(texts: Iterable[str]) -> Iterator[str]:
    """sentencepiece trains on lines and skips any over max_sentence_length, so lines are
    cut (at a space where there is one) rather than lost. Newlines are never inside a
    piece; they come out as the byte piece <0x0A>."""
    for text in texts:
        for line in text.split("\n"):
            while len(line) > MAX_LINE_CHARS:
                cut = line.rfind(" ", MAX_LINE_CHARS // 2, MAX_LINE_CHARS) + 1 or MAX_LINE_CHARS
                yield line[:cut]
                line = line[cut:]
            if line:
                yield line


def train_tokenizer(texts: Iterable[str], vocab: int = DEFAULT_VOCAB) -> bytes:
    """Trains a sentencepiece BPE model on the texts; returns the model file's bytes.

    The settings give back any text exactly, decode(encode(text)) == text: no
    normalization, whitespace kept as it is (runs of spaces become pieces), no dummy
    space in front, and characters outside the vocabulary fall back to their UTF-8 bytes.
    The same texts give the same bytes (fixed seed and thread count)."""
    check_vocab(vocab)
    spm.set_random_generator_seed(TRAIN_SEED)
    model = io.BytesIO()
    try:
        spm.SentencePieceTrainer.train(
            sentence_iterator=_training_sentences(texts), model_writer=model,
            vocab_size=vocab, model_type="bpe", byte_fallback=True,
            normalization_rule_name="identity", remove_extra_whitespaces=False, add_dummy_prefix=False,
            allow_whitespace_only_pieces=True, split_digits=True, character_coverage=0.9995,
            unk_id=0, bos_id=1, eos_id=EOS_ID, pad_id=-1,
            max_sentence_length=MAX_SENTENCE_BYTES, input_sentence_size=MAX_TRAINING_SENTENCES,
            shuffle_input_sentence=True, num_threads=TRAIN_THREADS, minloglevel=2)
    except RuntimeError as e:
        raise _vocab_error(str(e), vocab) from None
    return model.getvalue()


class VocabTooLarge(UserError):
    """The text allows fewer pieces than the vocab asked; `allowed` is the most it allows."""

    def __init__(self, vocab: int, allowed: int):
        super().__init__(f"vocab {vocab} is too large for this text: it allows at most {allowed}; "
                         f"choose --vocab {allowed} or less, or add text",
                         ru=f"словарь {vocab} слишком велик для этого текста: он допускает не больше {allowed}; "
                            f"возьмите словарь поменьше или добавьте текста")
        self.allowed = allowed


class VocabTooSmall(UserError):
    """The vocab asked has no room for every character of the text; `required` ids are needed."""

    def __init__(self, vocab: int, required: int):
        super().__init__(f"vocab {vocab} is too small for this text: its characters, the 256 byte pieces and "
                         f"3 special ids need {required}; choose a larger --vocab",
                         ru=f"словарь {vocab} мал для этого текста: его символам, 256 байтовым кусочкам и 3 "
                            f"служебным номерам нужно {required}; возьмите словарь побольше")
        self.required = required


def _vocab_error(message: str, vocab: int) -> Exception:
    high = re.search(r"Vocabulary size too high \((\d+)\).*?<= (\d+)", message)
    if high:
        return VocabTooLarge(vocab, int(high.group(2)))
    low = re.search(r"Vocabulary size is smaller than required_chars\. (\d+) vs (\d+)", message)
    if low:
        return VocabTooSmall(vocab, int(low.group(2)))
    return RuntimeError(f"sentencepiece could not train the tokenizer: {message}")


def fitted_vocab(allowed: int) -> int:
    """The vocab a text gets that allows at most `allowed` (see FIT_SHARE)."""
    return max(MIN_VOCAB, int(allowed * FIT_SHARE))


def check_vocab(vocab: int) -> None:
    if not isinstance(vocab, int) or isinstance(vocab, bool):
        raise UserError(f"vocab must be a whole number (got {vocab!r})")
    if vocab > MAX_VOCAB:
        raise UserError(f"vocab {vocab} is above {MAX_VOCAB}: tokens are stored as uint16; choose a smaller vocab")
    if vocab < MIN_VOCAB:
        raise UserError(f"vocab {vocab} is too small: 259 ids go to unk, bos, eos and the 256 byte pieces; "
                        f"choose at least {MIN_VOCAB} (the lab uses {DEFAULT_VOCAB})",
                        ru=f"словарь {vocab} слишком мал: 259 номеров заняты unk, bos, eos и 256 байтовыми "
                           f"кусочками; нужно хотя бы {MIN_VOCAB} (в лаборатории {DEFAULT_VOCAB})")


def list_tokenizers() -> list[TokenizerInfo]:
    """The tokenizers in `$LAB_HOME/tokenizers/`, skipping unfinished or damaged ones."""
    out = []
    root = home.tokenizers_dir()
    for meta_file in sorted(root.glob("*/tokenizer.json")) if root.is_dir() else []:
        folder = meta_file.parent
        if folder.name.startswith("."):
            continue
        try:
            meta = json.loads(meta_file.read_text(encoding="utf-8"))
            info = TokenizerInfo(meta["tok_id"], folder, meta["sha256"], int(meta["vocab"]), dict(meta["trained_on"]),
                                 meta.get("asked_vocab"))
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if info.model_file.is_file():
            out.append(info)
    return out


def _answers(t: TokenizerInfo, content: dict[str, str], vocab: int, fit: bool) -> bool:
    """Whether `t` is the tokenizer of this vocab: its own, or with `fit` the one a text too small
    for it was fitted to (that one only for exactly the text it was fitted to)."""
    return t.vocab == vocab or (fit and t.asked == vocab and t.trained_on == content)


def reusable_tokenizer(content: dict[str, str], vocab: int, fit: bool = False) -> TokenizerInfo | None:
    """The reuse rule: a tokenizer of the same vocab whose training constellations are
    all in the selection with the same content hashes; the one trained on the most.
    Keeping the tokenizer when constellations are added keeps a checkpoint's embeddings
    meaningful on the larger data. A fitted tokenizer (`asked`) counts only with `fit`, for its own text."""
    fits = [t for t in list_tokenizers() if _answers(t, content, vocab, fit) and t.trained_on
            and all(content.get(n) == h for n, h in t.trained_on.items())]
    fits.sort(key=lambda t: (-len(t.trained_on), t.tok_id))
    return fits[0] if fits else None


def _store_tokenizer(model: bytes, content: dict[str, str], vocab: int, asked: int | None = None) -> TokenizerInfo:
    sha = hashlib.sha256(model).hexdigest()
    tok_id = f"{'+'.join(sorted(content))}-{vocab}-{sha[:8]}"
    root = home.tokenizers_dir()
    meta = {"tok_id": tok_id, "sha256": sha, "vocab": vocab, "trained_on": dict(sorted(content.items()))}
    if asked is not None:
        meta["asked_vocab"] = asked
    if not (root / tok_id / "tokenizer.json").is_file():
        with atomic_folder(root, tok_id) as tmp:
            (tmp / "tokenizer.model").write_bytes(model)
            (tmp / "tokenizer.json").write_text(json.dumps(meta, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    return TokenizerInfo(tok_id, root / tok_id, sha, vocab, meta["trained_on"], asked)


def tokenizer_for(chosen: dict[str, Constellation], scans: dict[str, Scan], vocab: int, tokenizer: str,
                  progress: Progress, fit: bool = False) -> TokenizerInfo:
    """The tokenizer for a selection: pinned by id, reused by the reuse rule ("auto"), or
    trained on the selection ("new", or "auto" when nothing can be reused). `fit`: a text too
    small for `vocab` gets the vocab it fits (`fitted_vocab`), and the notice says so."""
    content = {n: s.sha256 for n, s in scans.items()}
    if tokenizer not in ("auto", "new"):
        return _pinned_tokenizer(tokenizer)
    found = reusable_tokenizer(content, vocab, fit) if tokenizer == "auto" else _own_tokenizer(content, vocab, fit)
    if found:
        say(progress, f"tokenizer: reusing {found.tok_id} (trained on {', '.join(found.trained_on)})")
        return found
    total = sum(s.bytes for s in scans.values())

    def texts() -> Iterator[str]:
        with progress_bar(progress, "reading for the tokenizer", total) as bar:
            for c in chosen.values():
                for doc in c.documents():
                    bar.update(len(doc.text.encode("utf-8")))
                    yield doc.text
    say(progress, f"tokenizer: training a BPE tokenizer, vocab {vocab}, on {', '.join(chosen)}")
    try:
        return _store_tokenizer(train_tokenizer(texts(), vocab), content, vocab)
    except VocabTooLarge as e:
        if not fit or e.allowed < MIN_VOCAB:
            raise
        allowed = e.allowed
    fitted = fitted_vocab(allowed)
    say(progress, f"tokenizer: vocab {vocab} is too large for {total:,} bytes of text (at most {allowed}): "
                  f"training vocab {fitted} on {', '.join(chosen)}")
    try:
        model = train_tokenizer(texts(), fitted)
    except VocabTooSmall as e:  # a text of many characters and little else
        if e.required > allowed:
            raise
        fitted = e.required
        model = train_tokenizer(texts(), fitted)
    return _store_tokenizer(model, content, fitted, asked=vocab)


def _own_tokenizer(content: dict[str, str], vocab: int, fit: bool = False) -> TokenizerInfo | None:
    """A tokenizer trained on exactly this selection, if one was trained before."""
    return next((t for t in list_tokenizers() if _answers(t, content, vocab, fit) and t.trained_on == content), None)


def _pinned_tokenizer(tok_id: str) -> TokenizerInfo:
    tokenizers = list_tokenizers()
    for t in tokenizers:
        if t.tok_id == tok_id:
            return t
    raise UserError(f"no tokenizer {tok_id!r} in {home.tokenizers_dir()}; there are: "
                    f"{', '.join(t.tok_id for t in tokenizers) or '(none)'}; or use 'auto' or 'new'")


def load_tokenizer(path: str | os.PathLike) -> spm.SentencePieceProcessor:
    """A sentencepiece processor from a data folder, a tokenizer folder or a .model file."""
    path = Path(path)
    model = path / "tokenizer.model" if path.is_dir() else path
    if not model.is_file():
        raise UserError(f"no tokenizer at {model}: prepare the data first (lab prepare -c NAME)")
    return spm.SentencePieceProcessor(model_file=str(model))


