"""What a run's own sessions measured, link by link: the speed each trained at on its machine. After a link,
the next plan there (Auto's reason, the quota it counts) uses that speed rather than the calculator's guess.
A Kaggle session far slower than the run's others (without its cards, a slow host) is flagged: it burns an
hour of quota for what the others train in minutes."""
from __future__ import annotations

import statistics
from dataclasses import dataclass

from lab.kernel.metrics import read_metrics
from lab.runs import Link, Run
from lab.sizing.runtime import kaggle_session_costs

SLOW = 0.4  # a session below this share of the run's typical speed on Kaggle is flagged
WARMUP_ROWS = 3  # a session's first logged steps include its compile and start: not its pace
MIN_ROWS = 3


def link_speed(rows: list[dict], link: Link) -> float | None:
    """The median tokens/s the link's session logged after its first few steps (None: too few)."""
    end = link.to_step if link.to_step is not None else float("inf")
    mine = [r["tok_s"] for r in rows if isinstance(r.get("tok_s"), (int, float)) and r.get("tok_s") > 0
            and "loss" in r and link.from_step < r.get("step", 0) <= end][WARMUP_ROWS:]
    return float(statistics.median(mine)) if len(mine) >= MIN_ROWS else None


def _speeds(run: Run) -> list[tuple[Link, float]]:
    rows = read_metrics(run.folder)
    return [(link, s) for link in run.links if link.to_step is not None and (s := link_speed(rows, link))]


def measured_on(run: Run) -> dict[str, float]:
    return {link.machine: s for link, s in _speeds(run)}


def hours_on(run: Run, machine: str, tok_s: float, kaggle: bool) -> float | None:
    """The rest of the run on `machine` at `tok_s`, with its session's start (as a Kaggle account measured it)."""
    rows = [r for r in read_metrics(run.folder) if isinstance(r.get("tokens"), (int, float)) and r.get("step")]
    per_step = rows[-1]["tokens"] / rows[-1]["step"] if rows else None
    if not per_step:
        return None
    left = max(0, run.cfg.steps_until - run.step) * per_step / tok_s
    start = kaggle_session_costs(machine).start_s if kaggle else 0.0
    return (left + start) / 3600


@dataclass(frozen=True)
class Slow:
    link: int
    machine: str
    tok_s: float
    typical: float

    def words(self, ru: bool = False) -> str:
        if ru:
            return (f"звено {self.link} на {self.machine} шло со скоростью {_n(self.tok_s, True)} ток/с, намного "
                    f"медленнее других сессий прогона ({_n(self.typical, True)}): оно тратит квоту зря")
        return (f"link {self.link} on {self.machine} trained at {_n(self.tok_s)} tok/s, far slower than the run's "
                f"other sessions ({_n(self.typical)}): it spends quota for little")


def slow_links(run: Run) -> list[Slow]:
    """The run's Kaggle links that trained below `SLOW` of the median of its other Kaggle links."""
    found = [(link, s) for link, s in _speeds(run) if link.kind == "kaggle"]
    out = []
    for link, speed in found:
        others = [s for other, s in found if other.n != link.n]
        if others and speed < SLOW * statistics.median(others):
            out.append(Slow(link.n, link.machine, speed, statistics.median(others)))
    return out


def _n(x: float, ru: bool = False) -> str:
    text = f"{x:,.0f}"
    return text.replace(",", "\u00a0") if ru else text
