"""Training: configuration, checkpoints, step metrics, the timeline and plots of a run."""

from scaledl.train.checkpoint import (
    CHECKPOINT_VERSION, capture_rng, latest_checkpoint, list_checkpoints, load_checkpoint,
    load_latest, prune_checkpoints, restore_rng, save_checkpoint, write_checkpoint,
)
from scaledl.train.config import (
    FIELD_SECTION, DataConfig, ModelConfig, OptimConfig, ParallelConfig, RunConfig,
    TrainConfig, build_config, load_toml,
)
from scaledl.train.metrics import (
    MetricsWriter, RunStats, RunSummary, StepTimer, StepTimes, read_metrics,
)
from scaledl.train.plots import plot_metrics
from scaledl.train.timeline import Timeline, load_timeline, merge_timelines

__all__ = [
    "DataConfig", "ModelConfig", "OptimConfig", "ParallelConfig", "RunConfig", "TrainConfig",
    "FIELD_SECTION", "load_toml", "build_config",
    "CHECKPOINT_VERSION", "save_checkpoint", "load_checkpoint", "write_checkpoint",
    "list_checkpoints", "latest_checkpoint", "load_latest", "prune_checkpoints", "capture_rng",
    "restore_rng",
    "MetricsWriter", "read_metrics", "StepTimer", "StepTimes", "RunStats", "RunSummary",
    "Timeline", "merge_timelines", "load_timeline", "plot_metrics",
]
