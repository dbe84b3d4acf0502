"""The held-out split read back from a constellation's sources by the split rule's own parts
(`choose_val`, `tail_start`): what each side must hold, to compare with the shards."""
from __future__ import annotations

from lab import corpus
from lab.corpus import shards


def split_parts(name: str) -> tuple[list[str], list[str]]:
    """(the train texts, the val texts) that preparing constellation `name` writes, in order: a
    document whole on one side, or its head in train and its tail in val."""
    c = corpus.get_constellations([name])[name]
    s = corpus.scan(c)
    split = corpus.choose_val(s.doc_hashes, s.doc_bytes, s.doc_sources)
    train, val = [], []
    for i, doc in enumerate(c.documents()):
        data = doc.text.encode("utf-8")
        cut = shards.tail_start(data, split.fraction) if i in split.tails else 0
        if cut:
            train.append(data[:cut].decode())
            val.append(data[cut:].decode())
        else:
            (val if i in split.whole else train).append(doc.text)
    return train, val
