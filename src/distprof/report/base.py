"""What every plot of the report shares: the :class:`Section` a plot becomes, the figure template, and
:func:`label`, the one way a string from a trace reaches plotly.

Every string that comes from a trace (kernel, op and phase names, roles, paths) goes through :func:`label`
before it reaches plotly: plotly.js renders a subset of HTML in titles, tick labels, legends and hovers,
so a name must arrive as text. plotly.js decodes ``&lt;``, ``&gt;``, ``&amp;`` and numeric entities back
to characters for display (not ``&quot;``), hence the numeric forms for quotes.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

import plotly.graph_objects as go

from distprof.report.termfit import cut_middle
from distprof.trace.ranks import role_of, runs, unranked_label
from distprof.util.safetext import visible

__all__ = [
    "LABEL_CHARS",
    "NAME_CHARS",
    "Section",
    "by_role",
    "fig",
    "height",
    "label",
    "rank_name",
    "role_labels",
    "short",
]

LABEL_CHARS = 70  # a kernel's templated name can be thousands of characters: the axis shows its start
# The most characters of one string from a trace the page holds (hovers included): a longer one is cut in the middle
# (termfit's cutter, head…tail). With each name stored once per figure, not per rank, the page grows with ranks,
# steps and distinct names, never with name length x ranks (docs/diagnosis.md: "The HTML report").
NAME_CHARS = 1000

_ENTITIES = str.maketrans({"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&#34;", "'": "&#39;"})

TEMPLATE = go.layout.Template(layout={
    "font": {"family": "system-ui, -apple-system, Segoe UI, Roboto, sans-serif", "size": 12, "color": "#222"},
    "plot_bgcolor": "white", "paper_bgcolor": "white", "hoverlabel": {"align": "left"},
    "xaxis": {"gridcolor": "#e5e5e5", "zerolinecolor": "#bbb", "automargin": True},
    "yaxis": {"gridcolor": "#e5e5e5", "zerolinecolor": "#bbb", "automargin": True},
    "colorway": ["#4C78A8", "#F58518", "#54A24B", "#E45756", "#72B7B2", "#EECA3B", "#B279A2", "#FF9DA6",
                 "#9D755D", "#79706E"],
    "margin": {"l": 60, "r": 20, "t": 50, "b": 50},
})


def label(s: Any) -> str:
    """``s`` as text for plotly (titles, ticks, legends, hovers): markup characters become entities; cut to
    :data:`NAME_CHARS` characters."""
    return cut_middle(visible(s), NAME_CHARS).translate(_ENTITIES)


def short(s: str) -> str:
    return s if len(s) <= LABEL_CHARS else s[:LABEL_CHARS - 1] + "…"


@dataclass
class Section:
    """One plot of the report: its element id (a :class:`~distprof.analysis.diagnose.Plot` id), a title and
    caption, and its figures; no figures and a ``note`` when it does not apply to these traces (a ``note``
    beside figures says why they show nothing)."""
    id: str
    title: str
    caption: str
    figures: list[go.Figure] = field(default_factory=list)
    note: str | None = None


def fig(title: str, height: int = 420, **layout: Any) -> go.Figure:
    return go.Figure(layout={"template": TEMPLATE, "title": {"text": title, "x": 0, "xanchor": "left"},
                             "height": height, **layout})


def rank_name(role: str | None, rank: int | None, path: str = "", bare: bool = False) -> str:
    """A rank's axis label, plain text (escaped by the caller): ``actor 3`` or ``rank 3`` (``3`` when ``bare``:
    a plot of one role), ``? (file name)`` for a file whose rank is unknown."""
    r = str(rank) if rank is not None else unranked_label(path)
    return r if bare else f"{role} {r}" if role else f"rank {r}"


class _HasRole(Protocol):
    @property
    def role(self) -> str | None: ...


_R = TypeVar("_R", bound=_HasRole)


def by_role(rows: Iterable[_R]) -> dict[str | None, list[_R]]:
    """Records (step rows, wait-matrix cells) grouped by their role, in first-seen order."""
    out: dict[str | None, list[_R]] = defaultdict(list)
    for r in rows:
        out[r.role].append(r)
    return out


def height(n: int, per: float = 16, lo: int = 320, hi: int = 900) -> int:
    return int(min(hi, max(lo, 120 + per * n)))


def role_labels(infos: Iterable[Any]) -> dict[str, str | None]:
    """File path -> the role its rank is reported under (``"actor (run 2)"`` when ranks of different runs share
    a folder), as ``steps`` and ``stragglers`` report it."""
    infos = list(infos)
    labels, _ = runs(infos)
    return {info.path: role_of(labels, info) for info in infos}
