"""The lab kit's tokenizer for Hugging Face transformers (`AutoTokenizer`, `trust_remote_code=True`).

Shipped beside tokenizer.json in a `lab export`. Encoding is tokenizer.json's, through the fast
`tokenizers` library: the kit's token ids exactly. Decoding is sentencepiece's, as the kit decodes:
"▁" is a space, a run of byte pieces is UTF-8, and a byte that makes no character becomes one
U+FFFD alone. (tokenizers' own ByteFallback turns the whole run into U+FFFD when one byte in it is
wrong, the valid characters around it too.) It imports transformers only, never `lab`.
"""
import re

from transformers import PreTrainedTokenizerFast

BYTE = re.compile(r"<0x([0-9A-Fa-f]{2})>")


def utf8_text(data: bytes) -> str:
    """The bytes as text, each character that is valid UTF-8 kept, each byte that starts none
    replaced by U+FFFD: sentencepiece's rule."""
    out, i = [], 0
    while i < len(data):
        for width in (1, 2, 3, 4):
            try:
                out.append(data[i:i + width].decode("utf-8"))
            except UnicodeDecodeError:
                continue
            i += width
            break
        else:
            out.append("\ufffd")
            i += 1
    return "".join(out)


class LabGPTTokenizer(PreTrainedTokenizerFast):
    def _decode(self, token_ids, skip_special_tokens=False, **kwargs):
        ids = [token_ids] if isinstance(token_ids, int) else list(token_ids)
        if skip_special_tokens:
            special = set(self.all_special_ids)
            ids = [i for i in ids if i not in special]
        text, run = [], bytearray()
        for piece in self.convert_ids_to_tokens(ids):
            byte = BYTE.fullmatch(piece or "")
            if byte:
                run.append(int(byte.group(1), 16))
                continue
            if run:
                text.append(utf8_text(bytes(run)))
                run.clear()
            text.append((piece or "").replace("\u2581", " "))
        return "".join(text) + utf8_text(bytes(run))
