"""Training: the loop, per-step traces, checkpoints."""
from .trace import TRACE_VERSION, StepRecord, TraceError, TraceWriter, read_trace

__all__ = ["StepRecord", "TraceWriter", "read_trace", "TraceError", "TRACE_VERSION"]
