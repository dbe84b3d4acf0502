"""What a link on a Kaggle account holds, typed: kept as plain JSON in `Link.detail` beside the lifecycle's
record (lab.machines.lifecycle.Away); only `lab.machines.kaggle` reads it."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from lab.machines.handoff import from_known
from lab.machines.lifecycle import LinkRecord
from lab.runs import Link


@dataclass
class KernelPush:
    """The link's kernel: what was sent, whether the push is under way or done, or why Kaggle refused it."""
    slug: str = ""
    attempt: int = 1
    tried: list = field(default_factory=list)  # earlier pushes' kernels that never showed (deleted if they do)
    sources: list = field(default_factory=list)
    nccl_env: dict = field(default_factory=dict)
    pushing: bool = False  # its answer not known: before any new push the lab reads the kernel back
    pushed_at: str | None = None
    version: int | None = None
    url: str = ""
    adopted: bool = False  # found on Kaggle rather than answered
    refused: str | None = None
    dropped_sources: list = field(default_factory=list)  # the sources Kaggle ran it without

    @property
    def sent(self) -> bool:
        """A push was sent, or maybe sent: a session may run."""
        return bool(self.pushed_at or self.pushing)

    @property
    def name(self) -> str:
        return self.slug.split("/")[-1]

    @property
    def page(self) -> str | None:
        return self.url or (f"https://www.kaggle.com/code/{self.slug}" if self.slug else None)


@dataclass
class KaggleLinkRecord(LinkRecord):
    """A Kaggle link's own keys; `image`: Kaggle's docker image the session ran, read back from its kernel."""
    account: str = ""
    session_timeout_s: int = 0
    margin_min: float = 0.0
    data: dict | None = None
    ckpt: dict | None = None
    kernel: KernelPush = field(default_factory=KernelPush)
    kaggle_status: str | None = None
    failure: str = ""
    status_at: str | None = None
    ran: bool = False
    running_at: str | None = None
    image: str | None = None
    measured: dict | None = None

    @classmethod
    def of(cls, link: Link) -> "KaggleLinkRecord":
        record = super().of(link)
        record.kernel = from_known(KernelPush, link.detail.get("kernel"))
        return record

    def update_kernel(self, run_id: str, n: int, **changes: Any) -> KernelPush:
        kernel = dataclasses.replace(self.kernel, **changes)
        type(self).update(run_id, n, kernel=dataclasses.asdict(kernel))  # kept as the plain JSON the registry holds
        self.kernel = kernel
        return kernel
