"""Complete events of one thread into lanes that nest: Perfetto drops or hides a complete (``X``) event that
overlaps another on its thread without nesting in it, so ``merge`` moves such events to extra lane threads.
"""

from __future__ import annotations

import numpy as np

__all__ = ["overlap_lanes"]


def overlap_lanes(ts: np.ndarray, dur: np.ndarray) -> np.ndarray:
    """Lane of each complete event of one thread so that events on one lane nest (0 = stays put).

    ``ts`` must be small (relative to the file's first event: epoch µs times 1000 exceed float64's
    exact integers). Times are compared in integer ns, as Perfetto stores them, and the merged file's
    timestamps are written as exactly those ns plus a whole-ns shift, so the nesting seen here is the
    nesting a viewer sees. Events are taken by start (the
    longer first on ties); each goes to the first lane where it fits inside the innermost open event
    or where nothing is open.
    """
    start = np.round(ts * 1000.0).astype(np.int64)
    end = start + np.round(dur * 1000.0).astype(np.int64)
    lane_of = np.zeros(len(ts), dtype=np.int64)
    if _nested(start, end):
        return lane_of  # the usual case, found without the loop below
    order = np.lexsort((start - end, start))
    stacks: list[list[int]] = []  # per lane: ends of the open events, innermost last
    s_list, e_list = start.tolist(), end.tolist()
    for k in order.tolist():
        s, e = s_list[k], e_list[k]
        for lane, stack in enumerate(stacks):
            while stack and stack[-1] <= s:
                stack.pop()
            if not stack or e <= stack[-1]:
                stack.append(e)
                lane_of[k] = lane
                break
        else:
            lane_of[k] = len(stacks)
            stacks.append([e])
    return lane_of


def _nested(start: np.ndarray, end: np.ndarray) -> bool:
    """Whether the spans ``[start, end)`` (integer ns) already nest: no two overlap without one holding the other.

    Vectorised: every span of positive length is a ``(`` at its start and a ``)`` at its end, ordered by time
    (at one time: ends before starts, as touching spans do not overlap; the inner span's end first, the outer
    span's start first). In that balanced sequence the brackets that match are the consecutive ones at one
    depth; the spans nest exactly when each matching pair is one span. Zero-length spans never overlap.
    """
    keep = end > start
    s, e = start[keep], end[keep]
    n = len(s)
    if n < 2:
        return True
    ids = np.arange(n)
    time = np.concatenate([s, e])
    is_start = np.concatenate([np.ones(n, dtype=np.int64), np.zeros(n, dtype=np.int64)])
    order = np.lexsort((np.concatenate([ids, -ids]), np.concatenate([-e, -s]), is_start, time))
    step = np.where(is_start[order] == 1, 1, -1)
    depth = np.cumsum(step)
    level = np.where(step == 1, depth, depth + 1)  # a start's depth after it, an end's before it
    span = np.concatenate([ids, ids])[order][np.argsort(level, kind="stable")]
    return bool((span[0::2] == span[1::2]).all())
