"""Trace analysis: a streaming reader for Kineto / Chrome-trace JSON, one pass per file into compact
columns (:mod:`.table`), one module per analysis (each an ``extract`` per file and a ``combine`` over
files), and the verbs as library calls (:mod:`.analyze`: ``analyze.summary(path)`` ...). No torch needed."""

from . import analyze
from .listing import TraceFile, find_traces
from .reader import RankTrace, TraceError, TraceStream, open_trace, read_trace
from .selection import Selection
from .table import TraceTable

__all__ = ["analyze", "RankTrace", "TraceError", "TraceFile", "TraceStream", "TraceTable", "Selection", "find_traces",
           "open_trace", "read_trace"]
