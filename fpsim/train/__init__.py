"""Training: the loop, per-step traces, checkpoints."""
from .checkpoint import CHECKPOINT_VERSION, CheckpointError, load_checkpoint, save_checkpoint
from .data import DATASETS, Dataset, make_dataset
from .loop import TrainResult, loss_hash, resolve_scaler, train
from .trace import TRACE_VERSION, StepRecord, TraceError, TraceWriter, read_trace

__all__ = ["StepRecord", "TraceWriter", "read_trace", "TraceError", "TRACE_VERSION",
           "save_checkpoint", "load_checkpoint", "CheckpointError", "CHECKPOINT_VERSION",
           "train", "TrainResult", "resolve_scaler", "loss_hash", "Dataset", "make_dataset",
           "DATASETS"]
