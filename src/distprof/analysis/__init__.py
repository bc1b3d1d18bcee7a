"""Trace analysis: a streaming reader for Kineto / Chrome-trace JSON and small analyses on top. No torch needed."""

from .reader import RankTrace, TraceError, TraceFile, TraceStream, find_traces, open_trace, read_trace
from .summary import summarize_ranks, summarize_trace

__all__ = ["RankTrace", "TraceError", "TraceFile", "TraceStream", "find_traces", "open_trace", "read_trace", "summarize_trace", "summarize_ranks"]
