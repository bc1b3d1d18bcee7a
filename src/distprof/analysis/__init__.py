"""Trace analysis: a streaming reader for Kineto / Chrome-trace JSON, one pass per file into compact
columns (:mod:`.table`), one module per analysis (each an ``extract`` per file and a ``combine`` over
files), and the verbs as library calls (:mod:`.analyze`: ``analyze.summary(path)`` ...). No torch needed."""

from distprof.analysis import analyze
from distprof.trace.listing import TraceFile, find_traces
from distprof.trace.reader import RankTrace, TraceError, TraceStream, open_trace, read_trace
from distprof.trace.selection import Selection
from distprof.trace.table import TraceTable

__all__ = [
           "RankTrace",
           "Selection",
           "TraceError",
           "TraceFile",
           "TraceStream",
           "TraceTable",
           "analyze",
           "find_traces",
           "open_trace",
           "read_trace",
]
