"""Untrusted text (trace names, file names) shown to a person: invisible characters made visible.

Control characters (C0, DEL, C1), line separators, and the Unicode bidirectional controls are replaced by
escapes such as ``\\x1b``, ``\\n`` or ``\\u202e``. An ESC sequence would restyle a terminal, a newline would
split a table row or an error line, and a right-to-left override (U+202E) would make the rest of a line
render reversed, so a trace could make a claim read as something else. The terminal renderer and the HTML
report both apply :func:`visible` before anything else (HTML escaping comes after, in the report).
"""

from __future__ import annotations

import unicodedata
from typing import Any

__all__ = ["control_char", "visible"]

_ESCAPES = {c: f"\\x{c:02x}" for c in (*range(0x20), 0x7F, *range(0x80, 0xA0))}
_ESCAPES.update({0x0A: "\\n", 0x0D: "\\r", 0x09: "\\t"})
# Line/paragraph separators; bidi embeddings, overrides, isolates and marks (LRM, RLM, ALM).
_ESCAPES.update({c: f"\\u{c:04x}" for c in (0x2028, 0x2029, *range(0x202A, 0x202F), *range(0x2066, 0x206A),
                                            0x200E, 0x200F, 0x061C)})


def visible(s: Any) -> str:
    """``s`` as a string with every control and bidirectional character escaped."""
    return ("" if s is None else str(s)).translate(_ESCAPES)


def control_char(text: str) -> str | None:
    """The first control character (NUL, newline, escape, DEL, C1 ...) in ``text``, else None: never part of a
    role, a path or a URL (the config and the run directory's layout refuse them by this one rule)."""
    return next((c for c in text if unicodedata.category(c) == "Cc"), None)
