"""How a figure reads in the terminal, defined once: durations (``us``) and shares (``share``). Every terminal
view (terminal.py and the views it draws: flops_view, termcoll, telemetry_view, watchview) writes them so."""

from __future__ import annotations

__all__ = ["share", "us"]


def us(v: float | None) -> str:
    """A duration in microseconds as the terminal writes it: ``812.4 us``, ``3.21 ms``, ``1.50 s``; ``-`` for none."""
    if v is None:
        return "-"
    return f"{v / 1e6:,.2f} s" if abs(v) >= 1e6 else f"{v / 1000:,.2f} ms" if abs(v) >= 1000 else f"{v:,.1f} us"


def share(v: float | None) -> str:
    """A fraction as a percentage with one decimal; ``-`` for none."""
    return "-" if v is None else f"{v:.1%}"
