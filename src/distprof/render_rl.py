"""Terminal rendering of the RL step view (``steps``' ``rl_steps``, :mod:`distprof.analysis.rlsteps`). Only the
CLI calls this (through :func:`distprof.render.steps`)."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.text import Text

from .render import _table, _t, plain, us
from .termfit import say

__all__ = ["rl_steps"]


def rl_steps(console: Console, d: dict[str, Any]) -> None:
    """One table: per RL step and role its busy, idle, critical-path and overlapped time and what-if saving;
    under it each step's critical path."""
    rl = d.get("rl_steps") or []
    if not rl:
        return
    t = _table("RL steps: per role (idle = waiting for another role; overlap = busy while another role is; "
               "saves = the step's saving if this role took its median step's time, on the path)",
               ["step", "role", "duration", "busy", "idle", "on path", "overlap", "saves"], left=("role",))
    for s in rl:
        saves = {w["role"]: w["saves_us"] for w in s["what_if"]}
        for j, r in enumerate(s["roles"]):
            t.add_row(str(s["step"]), _t(r["role"]), us(s["duration_us"]) if j == 0 else "", us(r["busy_us"]),
                      us(r["idle_us"]), us(r["on_path_us"]), us(r["overlapped_us"]), us(saves.get(r["role"])))
        t.add_section()
    console.print(t)
    for s in rl:
        best = s["what_if"][0] if s["what_if"] else None
        line = f"step {s['step']}: path {' > '.join(plain(r) for r in s['critical_path'])}"
        if best and best["saves_us"] > 0:
            line += f"; {plain(best['role'])} at its median saves {us(best['saves_us'])}"
        for e in s.get("engine") or []:
            line += (f"; {plain(e['role'])}: {e['engine_iterations']} iterations, prefill {us(e['prefill_us'])}, "
                     f"decode {us(e['decode_us'])}")
        say(console, Text(line))
