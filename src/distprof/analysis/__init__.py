"""Trace analysis: a streaming reader for Kineto / Chrome-trace JSON, one pass per file into compact
columns (:mod:`.table`), one module per analysis (each an ``extract`` per file and a ``combine`` over
files), the verbs as library calls (:mod:`.analyze`: ``analyze.summary(path)`` ...) and one handle reading a path
once for all of them (:func:`open`: ``run = distprof.analysis.open(path); run.summary()``). No torch needed."""

from distprof.analysis import analyze
from distprof.analysis.handle import Analysis, open
from distprof.trace.listing import TraceFile, find_traces
from distprof.trace.reader import RankTrace, TraceError, TraceStream, open_trace, read_trace
from distprof.trace.selection import Selection
from distprof.trace.table import TraceTable

__all__ = [
           "Analysis",
           "RankTrace",
           "Selection",
           "TraceError",
           "TraceFile",
           "TraceStream",
           "TraceTable",
           "analyze",
           "find_traces",
           "open",
           "open_trace",
           "read_trace",
]
