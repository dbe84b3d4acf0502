"""The names the lab gives its things on Kaggle: slugs, titles and the licence of a dataset.

Only the licence names Kaggle documents are sent (kaggle-cli docs/datasets_metadata.md; the
list is lab.kaggle.datasets.DATASET_LICENCES): terms it does not list, MIT among them, go as
"other", and the upload says which name was sent.
"""
from __future__ import annotations

import hashlib
import re
from pathlib import Path

from lab.corpus.manifests import read_manifest


def _slug(prefix: str, text: str) -> str:
    """A Kaggle slug (a-z, 0-9, '-', at most 50 characters); long names keep a hash of the whole."""
    body = re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")
    slug = f"{prefix}-{body}"
    if len(slug) > 50:
        digest = hashlib.sha256(text.encode()).hexdigest()[:8]
        slug = f"{slug[:41].rstrip('-')}-{digest}"
    return slug


def data_slug(data_id: str) -> str:  # the prepared data of a run
    return _slug("lab-data", data_id)


def ckpt_slug(run_id: str) -> str:  # the hand-off checkpoint of a run
    return _slug("lab-ckpt", run_id)


def kernel_slug(run_id: str, n: int, attempt: int = 1) -> str:
    """One kernel per link; a push after one whose answer was not known gets a name of its own."""
    return _slug("lab", f"{run_id}-l{n}" + (f"-{attempt}" if attempt > 1 else ""))


def title_of(slug: str) -> str:
    """A dataset's title: its slug (6-50 characters), because Kaggle wants titles unique per owner and a
    longer title cut at 50 would lose the hash that keeps a long name unique."""
    return slug.rsplit("/", 1)[-1]


# (a pattern in a constellation's `licence`, Kaggle's documented name), first match wins.
LICENCE_PATTERNS = (
    (r"\bcc0\b", "CC0-1.0"), (r"public domain", "PDDL"),
    (r"cc[- ]by[- ]nc[- ]nd[- ]4", "CC-BY-NC-ND-4.0"), (r"cc[- ]by[- ]nc[- ]sa[- ]4", "CC-BY-NC-SA-4.0"),
    (r"cc[- ]by[- ]nc[- ]4", "CC-BY-NC-4.0"), (r"cc[- ]by[- ]nd[- ]4", "CC-BY-ND-4.0"),
    (r"cc[- ]by[- ]sa[- ]4", "CC-BY-SA-4.0"), (r"cc[- ]by[- ]sa[- ]3", "CC-BY-SA-3.0"),
    (r"cc[- ]by[- ]4", "CC-BY-4.0"), (r"cc[- ]by[- ]3", "CC-BY-3.0"), (r"\bagpl", "AGPL-3.0"),
    (r"\blgpl", "LGPL-3.0"), (r"\bgpl[- ]?(v)?2", "GPL-2.0"), (r"\bgpl", "GPL-3.0"), (r"\bgfdl|\bfdl", "FDL-1.3"),
    (r"\bodbl", "ODbL-1.0"), (r"apache", "apache-2.0"))


def kaggle_licence(licences: list[str]) -> str:
    """The documented licence name every one of these texts' terms maps to (the first named wins), else "other"."""
    names = {next((name for pattern, name in LICENCE_PATTERNS if re.search(pattern, text.lower())), "other")
             for text in licences}
    return names.pop() if len(names) == 1 else "other"


def data_licences(data_dir: Path) -> list[str]:
    constellations = (read_manifest(Path(data_dir)).get("constellations") or {}).values()
    return [str(c.get("licence") or "") for c in constellations]


def licence_note(licences: list[str], sent: str) -> str:
    own = "; ".join(sorted({t.strip() for t in licences if t.strip()}))
    if sent != "other" or not own:
        return f"licence {sent}"
    return f"licence sent as \"other\": Kaggle documents no name for {own}"
