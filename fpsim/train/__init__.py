"""Training: the loop (any model, any loss, data of any shape), per-step traces,
checkpoints, runs read back and compared."""
from .checkpoint import CHECKPOINT_VERSION, CheckpointError, load_checkpoint, save_checkpoint
from .data import DATASETS, Dataset, make_dataset
from .config import TrainConfig
from .loop import TrainResult, loss_hash, resolve_scaler
from .losses import LOSSES, resolve_loss
from .recipes import RECIPE_DEFAULTS, Recipe, recipe_for, recipe_record, scaler_name
from .runs import Comparison, Difference, Run, compare_runs, load_run, run_label
from .trace import TRACE_VERSION, StepRecord, TraceError, TraceWriter, read_trace
from .training import run_config, train

__all__ = ["StepRecord", "TraceWriter", "read_trace", "TraceError", "TRACE_VERSION",
           "save_checkpoint", "load_checkpoint", "CheckpointError", "CHECKPOINT_VERSION",
           "train", "TrainResult", "resolve_scaler", "loss_hash", "Dataset", "make_dataset",
           "DATASETS", "Run", "load_run", "compare_runs", "Comparison", "Difference",
           "run_label", "Recipe", "recipe_for", "RECIPE_DEFAULTS", "recipe_record",
           "scaler_name", "LOSSES", "resolve_loss", "TrainConfig", "run_config"]
