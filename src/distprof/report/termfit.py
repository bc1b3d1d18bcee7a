"""Output that fits the terminal: tables and prose laid out for the width they are printed at.

The one place the width rules live (``report/terminal.py`` draws every verb's tables with :class:`FitTable`; the CLI's
consoles are :class:`FitConsole`):

- A figure is never cut. A column of figures is as wide as its widest cell; when a row's figures cannot all
  stand beside its keys (role, step, rank), the table goes on in a second part that repeats the keys.
- A name (kernel, op, phase, file) takes the width that is left. On a terminal a name that does not fit is cut
  in the middle with ``…`` where text was taken out (a trailing argument list first: ``(…)``), never next to a
  digit, so a cut cannot pass for a number, and two names that would then read the same keep the part where they
  differ. In a file or a pipe names are whole, folded inside their column.
- Prose columns wrap at words; a ``line`` column (steps' phases), or a prose column that would be too narrow,
  goes on its own line under its row.
- A column with no data on this job (``-`` or empty on every row, or a value the table calls empty, such as
  ``0%``) is left out and named in a note under the table; a role column holding one role is named once, in the
  title; a key repeated from the row above is left blank.
- Titles, notes and messages wrap at words, never between a figure and its unit (``80.31 ms`` stays whole).

On a terminal no line is wider than the terminal from 80 columns up (narrower terminals get the same rules, as
far as the keys and one figure fit). In a file or a pipe the CLI lays tables out for 200 columns and prints each
message on one line.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from rich.cells import cell_len, get_character_cell_size
from rich.console import Console, ConsoleOptions, RenderResult
from rich.text import Text

__all__ = ["Col", "FitConsole", "FitTable", "cut_middle", "distinct_cuts", "fit_name", "say", "wrap"]

GAP = 2                                  # spaces between columns
NAME_MIN, NAME_GOOD = 24, 40             # a name column is cut no narrower than this (or its longest name)
NAME_WHOLE = 100                         # a whole name (file or pipe) longer than this folds onto more lines
TEXT_MIN, TEXT_GOOD = 16, 32             # a prose column narrower than TEXT_MIN goes under its row instead
BLANK = ("", "-")                        # cells that hold no data
KINDS = ("key", "num", "fixed", "name", "text", "line")
ELLIPSIS = "…"
_SEP = frozenset(" _:<>,()[]{}./-*&#=;|+")
_FOLD = frozenset("._/:,-")
_UNIT = re.compile(r"(?:us|µs|ns|ms|s|%|x|B|kB|KB|MB|GB|TB|GiB|MiB)(?![\w/])")


@dataclass(frozen=True)
class Col:
    """A table column. ``kind``: ``key`` (left, whole, blank when it repeats the row above), ``num`` (right,
    whole), ``fixed`` (left, whole), ``name`` (cut in the middle on a terminal, folded elsewhere), ``text``
    (wraps; goes under its row when too narrow), ``line`` (always its own line under the row).
    ``empty``: the cell values that count as no data; ``once``: a key named once in the title when every row
    has the same value."""

    name: str
    kind: str = "num"
    empty: tuple[str, ...] = BLANK
    once: bool = False

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"column {self.name!r}: kind {self.kind!r} is not one of {', '.join(KINDS)}")


# ---- cutting names -------------------------------------------------------------------------------------------
def _head(s: str, n: int, start: int = 0) -> int:
    """The end index of the longest slice ``s[start:end]`` at most ``n`` cells wide."""
    w = 0
    for i in range(start, len(s)):
        w += get_character_cell_size(s[i])
        if w > n:
            return i
    return len(s)


def _tail(s: str, n: int) -> int:
    """The start index of the longest suffix of ``s`` at most ``n`` cells wide."""
    w = 0
    for i in range(len(s) - 1, -1, -1):
        w += get_character_cell_size(s[i])
        if w > n:
            return i + 1
    return 0


def _snap_end(s: str, a: int, lo: int) -> int | None:
    """Move a cut's left end back (to ``lo`` at most) so that no digit precedes ``…``, onto a word boundary
    when one is near; None when every place down to ``lo`` follows a digit."""
    for i in range(a, max(lo, a - 10) - 1, -1):
        if i > 0 and not s[i - 1].isdigit() and (s[i - 1] in _SEP or (i < len(s) and s[i] in _SEP)):
            return i
    for i in range(a, lo - 1, -1):
        if i == 0 or not s[i - 1].isdigit():
            return i
    return None


def _snap_start(s: str, b: int, hi: int) -> int | None:
    """Move a cut's right end forward (to ``hi`` at most) so that no digit follows ``…``, onto a word boundary
    when one is near; None when every place up to ``hi`` is a digit."""
    for i in range(b, min(hi, b + 10) + 1):
        if i >= len(s):
            return len(s)
        if not s[i].isdigit() and (s[i] in _SEP or (i > 0 and s[i - 1] in _SEP)):
            return i
    for i in range(b, hi + 1):
        if i >= len(s) or not s[i].isdigit():
            return i
    return None


def _drop_args(s: str) -> str:
    """``f<T>(int, float)`` -> ``f<T>(…)``: the argument list that ends the name (for torch's kernels it repeats
    the template arguments)."""
    if not s.endswith(")"):
        return s
    depth = 0
    for i in range(len(s) - 1, -1, -1):
        depth += s[i] == ")"
        depth -= s[i] == "("
        if depth == 0:
            return s if i == 0 or i >= len(s) - 2 else s[:i] + f"({ELLIPSIS})"
    return s


def cut_middle(s: str, width: int, keep: int | None = None) -> str:
    """``s`` in at most ``width`` cells: whole when it fits; else its closing argument list as ``(…)``, then
    the middle taken out (``head…tail``), the cut on a word boundary when one is near and never beside a digit
    (so a cut cannot pass for a number). ``keep``: an index whose neighbourhood must stay visible (where the
    name differs from another), shown as ``head…middle…tail``."""
    if cell_len(s) <= width:
        return s
    if width < 8 or keep is None or keep <= 0 or keep >= len(s):
        short = _drop_args(s) if width >= 8 else s
        if cell_len(short) <= width:
            return short
        s = short
        body = width - 1
        a = _snap_end(s, _head(s, body - body // 3 if width >= 8 else body), 0) or 0
        b = _snap_start(s, max(_tail(s, body - cell_len(s[:a])), a + 1), len(s))
        return s[:a] + ELLIPSIS + s[len(s) if b is None else b:]
    body = width - 2
    a = _snap_end(s, _head(s, body * 2 // 5), 0) or 0
    w0 = _snap_start(s, max(a + 1, keep - 8), keep)
    if keep <= a + 4 or w0 is None:  # the head already shows it, or no clean place to start the middle
        return cut_middle(s, width)
    budget = body - cell_len(s[:a])
    w1 = _head(s, budget - min(budget // 3, 16), w0)
    if w1 >= len(s):  # the rest fits: no third part
        w0 = _snap_start(s, _tail(s, body + 1 - cell_len(s[:a])), len(s))
        return s[:a] + ELLIPSIS + s[len(s) if w0 is None else w0:]
    mid_end = _snap_end(s, w1, w0 + 1)
    if mid_end is None:
        return cut_middle(s, width)
    b = _snap_start(s, max(mid_end + 1, _tail(s, body - cell_len(s[:a]) - cell_len(s[w0:mid_end]))), len(s))
    return s[:a] + ELLIPSIS + s[w0:mid_end] + ELLIPSIS + s[len(s) if b is None else b:]


def _common_prefix(a: str, b: str) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def distinct_cuts(names: Sequence[str], width: int) -> list[str]:
    """Each name cut to ``width`` (:func:`cut_middle`); two different names that would read the same keep the
    part where they differ."""
    cuts = [cut_middle(n, width) for n in names]
    for _ in range(3):
        groups: dict[str, list[int]] = {}
        for i, c in enumerate(cuts):
            groups.setdefault(c, []).append(i)
        clashes = [idx for idx in groups.values() if len({names[i] for i in idx}) > 1]
        for idx in clashes:
            for i in idx:
                others = {cuts[j] for j in range(len(names)) if names[j] != names[i]}
                for k in sorted({_common_prefix(names[i], names[j]) for j in idx if names[j] != names[i]},
                                reverse=True):  # where it parts from its nearest twin first
                    cuts[i] = cut_middle(names[i], width, keep=k)
                    if cuts[i] not in others:
                        break
        if not clashes:
            break
    return cuts


def fit_name(console: Console, s: str, width: int) -> str:
    """A name for prose: cut to ``width`` on a terminal, whole in a file or pipe."""
    return cut_middle(s, width) if console.is_terminal else s


# ---- wrapping prose ------------------------------------------------------------------------------------------
def _words(plain: str) -> list[tuple[int, int]]:
    """(start, end) of each word with its trailing spaces. A figure and its unit are one word (``80.31 ms``),
    and so is the word before a figure unless it ends a clause (``train/data 80.31 ms``): lines break between
    entries, not inside one."""
    words: list[tuple[int, int]] = []
    figure: list[bool] = []
    for m in re.finditer(r"\S+\s*", plain):
        s, e = m.span()
        if words:
            prev = plain[words[-1][0]:words[-1][1]]
            if prev.endswith(" ") and not prev.endswith("  ") and re.fullmatch(r"[(+-]?[\d,.]*\d", prev.rstrip()) \
                    and _UNIT.match(plain, s):
                words[-1] = (words[-1][0], e)
                figure[-1] = True
                continue
        words.append((s, e))
        figure.append(False)
    out: list[tuple[int, int]] = []
    for k, (s, e) in enumerate(words):
        if figure[k] and out and k and not figure[k - 1]:
            prev = plain[out[-1][0]:out[-1][1]]
            if prev.endswith(" ") and not prev.endswith("  ") and prev.rstrip()[-1:] not in ",;:.":
                out[-1] = (out[-1][0], e)
                continue
        out.append((s, e))
    return out


def wrap(text: Text | str, width: int, hang: int = 0, sep: str | None = None) -> list[Text]:
    """``text`` as lines of at most ``width`` cells, broken at spaces (never between a figure and its unit); a
    word wider than a line is folded. Continuation lines are indented like the first line plus ``hang``.
    ``sep``: the text is a list (``a 1 ms, b 2 ms``): break after a separator, inside an entry only when it is
    wider than a line."""
    text = Text(text) if isinstance(text, str) else text
    if "\n" in text.plain:
        return [line for part in text.split("\n", allow_blank=True) for line in wrap(part, width, hang, sep)]
    plain = text.plain
    lead = len(plain) - len(plain.lstrip(" "))
    cont = lead + hang
    if width - cont < 20:
        cont = min(cont, max(0, width - 20))
    width = max(width, 1)
    spans: list[tuple[int, int]] = []  # each line's (start, end) in plain, without its indent

    def room() -> int:  # the width of the line being filled (the last of spans)
        return width - (lead if len(spans) <= 1 else cont)

    queue = _pieces(plain, sep)
    while queue:
        s, e, entry = queue.pop(0)
        word_end = s + len(plain[s:e].rstrip())
        if spans and cell_len(plain[spans[-1][0]:word_end]) <= room():
            spans[-1] = (spans[-1][0], word_end)
            continue
        if " " in plain[s:word_end] and cell_len(plain[s:word_end]) > width - cont:
            # a joined word wider than a line: break it where it was joined rather than inside a word
            if entry:  # an entry of a list: its words
                queue[:0] = [(s + a, s + b, False) for a, b in _words(plain[s:e])]
            else:
                cut = plain.index(" ", s)
                cut = len(plain[:cut]) + len(plain[cut:e]) - len(plain[cut:e].lstrip(" "))
                queue[:0] = [(s, cut, False), (cut, e, False)]
            continue
        _fold(plain, s, word_end, spans, width, lead, cont)  # the word starts a line
    if not spans:
        return [text.copy()]
    lines = []
    for k, (s, e) in enumerate(spans):
        piece = text[s:e]
        piece.rstrip()
        lines.append(Text(" " * (lead if k == 0 else cont)) + piece)
    return lines


def _pieces(plain: str, sep: str | None) -> list[tuple[int, int, bool]]:
    """What :func:`wrap` lays out, in order: (start, end, is a list entry) of each entry of a list (``sep``),
    else of each word."""
    if sep:
        cuts = [0, *(m.end() for m in re.finditer(re.escape(sep), plain)), len(plain)]
        return [(a + len(plain[a:b]) - len(plain[a:b].lstrip()), b, True)
                for a, b in itertools.pairwise(cuts) if plain[a:b].strip()]
    return [(s, e, False) for s, e in _words(plain)]


def _fold(plain: str, pos: int, word_end: int, spans: list[tuple[int, int]], width: int, lead: int,
          cont: int) -> None:
    """The word ``plain[pos:word_end]`` on new lines (appended to ``spans``), folded when it is wider than a
    line."""
    while True:
        avail = width - (lead if not spans else cont)
        if avail <= 0 or cell_len(plain[pos:word_end]) <= avail:
            break
        cut = max(pos + 1, _head(plain, avail, pos))
        soft = max((k + 1 for k in range(pos + (cut - pos) // 2, cut - 1) if plain[k] in _FOLD), default=cut)
        cut = soft if soft < cut else cut  # after a '.', '/' or '_' in the second half of the line when there is one
        spans.append((pos, cut))
        pos = cut
    spans.append((pos, word_end))


def say(console: Console, text: Text | str, hang: int = 0) -> None:
    """A message: on a terminal wrapped at words to its width (continuation lines indented like the first plus
    ``hang``), elsewhere one line."""
    text = Text(text) if isinstance(text, str) else text
    if not console.is_terminal:
        Console.print(console, text, soft_wrap=True)
        return
    for line in wrap(text, console.width, hang):
        Console.print(console, line, soft_wrap=True)


class FitConsole(Console):
    """rich's Console, with one change: ``print(..., soft_wrap=True)`` (a message on one line, for files, pipes
    and grep) wraps at words on a terminal instead of running past its edge."""

    def print(self, *objects: Any, soft_wrap: bool | None = None, **kwargs: Any) -> None:
        if soft_wrap and self.is_terminal:
            if objects and all(isinstance(o, (str, Text)) for o in objects):
                style = kwargs.pop("style", None)
                text = Text(" ").join(
                    self.render_str(o, markup=kwargs.get("markup"), highlight=kwargs.get("highlight"))
                    if isinstance(o, str) else o for o in objects)
                if style:
                    text.stylize(style)
                for line in wrap(text, self.width):
                    super().print(line, soft_wrap=True, end=kwargs.get("end", "\n"))
                return
            soft_wrap = False
        super().print(*objects, soft_wrap=soft_wrap, **kwargs)


# ---- tables --------------------------------------------------------------------------------------------------
def _cell(v: Any) -> Text:
    """A cell as plain text (a string is never read as markup)."""
    return v.copy() if isinstance(v, Text) else Text("" if v is None else str(v))


@dataclass
class _Row:
    cells: list[Text]
    style: str | None
    section: bool


class FitTable:
    """A table that lays itself out for the width it is printed at (the rules are in this module's docstring).
    Build it like a rich Table (``add_row``, ``add_section``) and print it with ``console.print(table)``."""

    def __init__(self, title: Text | str | None, columns: Iterable[Col], notes: Iterable[Text | str] = ()) -> None:
        self.title = _cell(title) if title is not None else None
        self.columns = list(columns)
        self.notes = [_cell(n) for n in notes]
        self.rows: list[_Row] = []
        self._section = False

    def add_row(self, *cells: Any, style: str | None = None) -> None:
        row = [_cell(c) for c in cells[:len(self.columns)]]
        row += [Text("") for _ in range(len(self.columns) - len(row))]
        self.rows.append(_Row(row, style, self._section and bool(self.rows)))
        self._section = False

    def add_section(self) -> None:
        self._section = True

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        yield from self.lines(options.max_width, whole_names=not console.is_terminal)

    # -- layout
    def lines(self, width: int, whole_names: bool = False) -> list[Text]:
        """The table as lines of at most ``width`` cells (when its keys and one figure fit)."""
        cols, rows = self.columns, self.rows
        title = self.title.copy() if self.title is not None else None
        shown = list(range(len(cols)))
        dropped: dict[str, list[str]] = {}
        for i, c in enumerate(cols):
            values = {r.cells[i].plain.strip() for r in rows}
            if rows and values <= set(c.empty):
                shown.remove(i)
                if c.kind != "key" and not c.once:
                    data = sorted(values - set(BLANK))
                    why = "no data" if not data else " or ".join(data) + " on every row"
                    dropped.setdefault(why, []).append(c.name)
            elif c.once and len(values - set(BLANK)) == 1 and title is not None:
                shown.remove(i)
                title.append(f", {c.name} {next(iter(values - set(BLANK)))}")
        cells = self._sparse_keys(shown)
        out: list[Text] = []
        if title is not None:
            out += [Text.assemble(line, style="bold") for line in wrap(title, width)]
        parts, under, widths = self._fit(shown, cells, width, whole_names)
        for n, part in enumerate(parts):
            if n:
                out.append(Text("(continued)", style="bold"))
            out += self._draw(part, under if n == 0 else [], widths[n], cells, width, whole_names)
        notes = list(self.notes)
        if dropped:
            notes.append(Text("Not shown: " + "; ".join(f"{', '.join(names)} ({why})" for why, names in dropped.items())
                              + "."))
        for note in notes:
            out += [Text.assemble(line, style="dim") for line in wrap(note, width)]
        out.append(Text(""))
        return out

    def _sparse_keys(self, shown: list[int]) -> list[list[Text]]:
        """Each row's cells, a key left blank when it and the keys before it repeat the row above."""
        keys = [i for i in shown if self.columns[i].kind == "key"]
        out, prev = [], None
        for r in self.rows:
            row = [c.copy() for c in r.cells]
            if prev is not None:
                for i in keys:
                    if r.cells[i].plain != prev.cells[i].plain:
                        break
                    row[i] = Text("")
            out.append(row)
            prev = r
        return out

    def _fit(self, shown: list[int], cells: list[list[Text]], width: int, whole_names: bool = False):
        """Which columns go in which part, which go under the row, and each column's width."""
        cols = self.columns
        under = [i for i in shown if cols[i].kind == "line"]
        table = [i for i in shown if cols[i].kind != "line"]
        want, floor, good = self._widths(table, cells, whole_names)
        flex = [i for i in table if cols[i].kind in ("name", "text")]
        fixed = [i for i in table if i not in flex]

        def squeeze(ids: list[int]) -> dict[int, int]:
            return _squeeze(ids, want, (([i for i in ids if i in flex], good), ([i for i in ids if i in fixed], floor),
                                        ([i for i in ids if i in flex], floor)), width)

        w = squeeze(table)
        for i in reversed(flex):  # prose too narrow to read goes under its row
            if _total(w, table) <= width:
                break
            if cols[i].kind == "text":
                table.remove(i)
                under.insert(0, i)
                w = squeeze(table)
        if _total(w, table) <= width or len(table) < 2:
            return [table], under, [w]
        parts = self._split(table, floor, width)
        return parts, under, [squeeze(p) for p in parts]

    def _widths(self, table: list[int], cells: list[list[Text]], whole_names: bool
                ) -> tuple[dict[int, int], dict[int, int], dict[int, int]]:
        """Per column: the width it wants (its widest cell or its heading), the least it may have, and the
        width a name or prose column is still good at."""
        cols = self.columns
        cw = {i: max((cell_len(row[i].plain) for row in cells), default=0) for i in table}
        want, floor, good = {}, {}, {}
        for i in table:
            c = cols[i]
            head, word = cell_len(c.name), max((cell_len(w) for w in c.name.split()), default=0)
            want[i] = max(min(cw[i], NAME_WHOLE) if c.kind == "name" and whole_names else cw[i], head)
            if c.kind == "name" and whole_names:  # a pipe or file keeps names whole: prose wraps instead
                floor[i] = good[i] = want[i]
            elif c.kind == "name":
                floor[i] = max(min(cw[i], NAME_MIN), word)
                good[i] = max(min(cw[i], NAME_GOOD), floor[i])
            elif c.kind == "text":
                floor[i] = max(min(cw[i], TEXT_MIN), word)
                good[i] = max(min(cw[i], TEXT_GOOD), floor[i])
            else:
                floor[i] = good[i] = max(cw[i], word)
        return want, floor, good

    def _split(self, table: list[int], floor: dict[int, int], width: int) -> list[list[int]]:
        """A table too wide in parts, each repeating the keys: as few parts as the greedy split needs, the
        columns spread evenly over them where they fit."""
        keys = [i for i in table if self.columns[i].kind == "key"] or table[:1]
        parts: list[list[int]] = []
        cur: list[int] = []
        for i in (i for i in table if i not in keys):
            if cur and _total(floor, keys + cur + [i]) > width:
                parts.append(keys + cur)
                cur = []
            cur.append(i)
        parts.append(keys + cur)
        values = [i for i in table if i not in keys]
        if not values:  # keys alone too wide: one part, its cells cut to fit (no part to spread values over)
            return parts
        per = -(-len(values) // len(parts))  # as many columns in each part as the greedy split needs parts
        even = [keys + values[k:k + per] for k in range(0, len(values), per)]
        if len(even) == len(parts) and all(_total(floor, p) <= width for p in even):
            parts = even
        return parts

    def _draw(self, ids: list[int], under: list[int], w: dict[int, int], cells: list[list[Text]], width: int,
              whole_names: bool) -> list[Text]:
        cols = self.columns
        out = self._heading(ids, w)
        cut = {i: distinct_cuts([row[i].plain for row in cells], w[i])
               for i in ids if cols[i].kind == "name" and not whole_names}
        keys = [i for i in ids if cols[i].kind == "key"]
        indent = sum(w[i] + GAP for i in keys) if keys and ids[:len(keys)] == keys else 2
        indent = indent if indent <= width // 2 else 2
        for r, row in enumerate(cells):
            if self.rows[r].section:
                out.append(Text(""))
            out += self._row(r, row, ids, w, cut)
            for i in under:
                if row[i].plain.strip() in cols[i].empty:
                    continue
                line = Text.assemble(" " * indent, (f"{cols[i].name}: ", "dim"), row[i])
                out += wrap(line, width, hang=2, sep=", " if cols[i].kind == "line" else None)
        return out

    def _row(self, r: int, row: list[Text], ids: list[int], w: dict[int, int], cut: dict[int, list[str]]
             ) -> list[Text]:
        """Row ``r`` as lines: names cut (``cut``) or wrapped, prose wrapped, each column padded to its width."""
        cols = self.columns
        stack = []
        for i in ids:
            c = row[i]
            if cols[i].kind == "name":
                stack.append([Text(cut[i][r], style=c.style)] if i in cut else wrap(c, w[i]))
            elif cols[i].kind == "text":
                stack.append(wrap(c, w[i]))
            else:
                stack.append([c])
        return [_join([self._pad(s[k] if k < len(s) else Text(""), i, w) for i, s in zip(ids, stack, strict=False)],
                      style=self.rows[r].style) for k in range(max(len(s) for s in stack) if stack else 0)]

    def _heading(self, ids: list[int], w: dict[int, int]) -> list[Text]:
        """The column headings, wrapped to their widths and aligned at the bottom, and the rule under them."""
        heads = [wrap(Text(self.columns[i].name), w[i]) for i in ids]
        depth = max((len(h) for h in heads), default=1)
        out = [_join([self._pad(h[k - depth + len(h)] if k >= depth - len(h) else Text(""), i, w)
                      for i, h in zip(ids, heads, strict=False)], style="bold") for k in range(depth)]
        out.append(Text("─" * (sum(w[i] for i in ids) + GAP * max(0, len(ids) - 1)), style="dim"))
        return out

    def _pad(self, t: Text, i: int, w: dict[int, int]) -> Text:
        """Cell ``t`` of column ``i`` padded to its width (numbers to the right)."""
        t = t.copy()
        n = w[i] - t.cell_len
        if n > 0:
            (t.pad_left if self.columns[i].kind == "num" else t.pad_right)(n)
        return t


def _join(parts: list[Text], style: str | None = None) -> Text:
    """Cells side by side, ``GAP`` apart, trailing spaces cut."""
    line = Text(" " * GAP).join(parts)
    line.rstrip()
    if style:
        line.stylize(style)
    return line


def _total(ws: dict[int, int], ids: list[int]) -> int:
    """The width of columns ``ids`` side by side at widths ``ws``."""
    return sum(ws[i] for i in ids) + GAP * max(0, len(ids) - 1)


def _squeeze(ids: list[int], want: dict[int, int], steps: Iterable[tuple[list[int], dict[int, int]]],
             width: int) -> dict[int, int]:
    """Widths for columns ``ids``: each as wide as it wants, then, while the columns are wider than ``width``,
    the columns of each step in turn narrowed towards that step's widths, the widest first, in proportion to
    their room."""
    w = {i: want[i] for i in ids}
    for group, target in steps:
        excess = _total(w, ids) - width
        room = {i: w[i] - target[i] for i in group if w[i] > target[i]}
        if excess <= 0 or not room:
            continue
        if sum(room.values()) <= excess:
            w.update({i: target[i] for i in room})
            continue
        left = excess
        for i in sorted(room, key=lambda i: -room[i]):  # widest first, in proportion to their room
            take = min(room[i], left, -(-excess * room[i] // sum(room.values())))
            w[i] -= take
            left -= take
    return w
