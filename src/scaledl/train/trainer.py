"""The training loop of one rank: steps, evaluation, metrics, checkpoints, timeline.

Each step is ``forward -> loss -> backward -> strategy.step()``; the strategy's collectives run
on the communicator thread while backward goes on, and the time they ran and the time this
thread waited for them become the step's ``comm_s`` and ``wait_s``.  Rank 0 writes
``metrics.jsonl`` (one line per step, one per evaluation), checkpoints (atomically, holding model,
optimizer, strategy, sampler position and RNG states), plots, and the merged Chrome trace.

Resuming loads the checkpoint on every rank (the run directory must be shared between hosts), so
a resumed run continues at the exact sample: with the same world size it reproduces the
uninterrupted run bitwise.  A different world size is accepted: the sampler continues from the
same point of the epoch (see :class:`scaledl.data.ShardedSampler`), and the log says so.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from scaledl import collectives
from scaledl.topology import Topology
from scaledl.train.checkpoint import (
    LATEST_NAME, capture_rng, list_checkpoints, load_checkpoint, load_latest, restore_rng,
    write_checkpoint,
)
from scaledl.train.config import TrainConfig
from scaledl.train.metrics import MetricsWriter, RunStats, RunSummary, StepTimes
from scaledl.train.plots import plot_metrics
from scaledl.train.progress import ProgressDisplay
from scaledl.train.setup import RunParts, build_run
from scaledl.train.timeline import Timeline, merge_timelines

__all__ = ["Trainer"]

log = logging.getLogger(__name__)


class Trainer:
    """Train ``config`` on this rank of an initialised process group."""

    def __init__(self, config: TrainConfig, topology: Topology) -> None:
        self.config = config
        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
        self.out = Path(config.run.out)
        self.out.mkdir(parents=True, exist_ok=True)
        self.timeline = Timeline(self.rank)
        checkpoint, state = self._find_checkpoint()
        if state is not None:
            self._check_resumable(state, checkpoint)
        elif self.rank == 0:
            self._clear_old_checkpoints()
        model_state = state["strategy"]["model"] if state is not None else None
        explicit = topology if topology.explicit else None
        self.parts: RunParts = build_run(config, self.rank, self.world_size, explicit,
                                         self.timeline, model_state)
        self.step, self.epoch = 0, 0
        if state is not None:
            self._restore(state)
        self.metrics = (
            MetricsWriter(self.out / "metrics.jsonl", truncate_after_step=self.step)
            if self.rank == 0 else None
        )
        if self.metrics is not None:
            self.metrics.log_run(
                model=config.model.name, dataset=config.data.dataset, world_size=self.world_size,
                strategy=config.parallel.strategy, topology=topology.spec, start_step=self.step,
                config=config.to_dict(),
            )
        self.stats = RunStats()
        self._staleness: float | None = None

    # -- resume ---------------------------------------------------------------------------------
    def _find_checkpoint(self) -> tuple[Path | None, dict[str, Any] | None]:
        """The checkpoint to resume from and its state; ``auto`` takes the newest one that
        loads, skipping (with a warning) a newer one that is corrupt."""
        resume = self.config.run.resume
        if not resume:
            return None, None
        if resume == "auto":
            found = load_latest(self.out)
            return found if found is not None else (None, None)
        return Path(resume), load_checkpoint(resume)

    def _clear_old_checkpoints(self) -> None:
        """A fresh run owns its directory: an older run's checkpoints would outrank its own, and
        its metrics would mix with the new ones."""
        old = list_checkpoints(self.out)
        for _, path in old:
            path.unlink(missing_ok=True)
        (self.out / LATEST_NAME).unlink(missing_ok=True)
        (self.out / "metrics.jsonl").unlink(missing_ok=True)
        if old:
            log.info("fresh run: removed %d checkpoints of an earlier run from %s (use --resume "
                     "auto to continue a run instead)", len(old), self.out)

    def _check_resumable(self, state: dict[str, Any], path: Path | None) -> None:
        saved = state.get("config", {})
        for section, key in (("model", "name"), ("data", "dataset"), ("parallel", "strategy")):
            theirs = saved.get(section, {}).get(key)
            ours = getattr(getattr(self.config, section), key)
            if theirs is not None and theirs != ours:
                raise ValueError(f"checkpoint {path} was trained with {section}.{key}="
                                 f"{theirs!r}, not {ours!r}; resume with the same {key}")
        if state.get("world_size") != self.world_size:
            log.warning("resuming %s written by %s workers with %d workers: the data order "
                        "continues from the same point of the epoch", path,
                        state.get("world_size"), self.world_size)

    def _restore(self, state: dict[str, Any]) -> None:
        self.parts.strategy.load_state_dict(state["strategy"])
        self.parts.sampler.load_state_dict(state["sampler"])
        restore_rng(state["rng"])
        self.step, self.epoch = int(state["step"]), int(state["epoch"])
        log.info("resumed at step %d (epoch %d)", self.step, self.epoch)

    def _save(self) -> None:
        self.parts.strategy.prepare_checkpoint()
        if self.rank != 0:
            return
        state = self.parts.strategy.state_dict()
        payload = {
            "step": self.step, "epoch": self.epoch, "world_size": self.world_size,
            "config": self.config.to_dict(), "strategy": state,
            "sampler": self.parts.sampler.state_dict(), "rng": capture_rng(),
        }
        path = write_checkpoint(self.out, self.step, payload)
        log.info("checkpoint %s", path.name)

    # -- the loop -------------------------------------------------------------------------------
    def run(self) -> dict[str, Any]:
        """Train for the configured epochs; return the summary (``RunSummary`` fields, test
        accuracy, paths) on every rank.  A dedicated parameter-server rank serves instead."""
        strategy = self.parts.strategy
        if not strategy.is_worker:
            log.info("rank %d serves parameters", self.rank)
            strategy.serve()
            return self._finish(self.stats.summary(), None)
        epochs = self.config.optim.epochs
        display = ProgressDisplay(self.rank == 0 and self.config.run.progress,
                                  total=epochs * len(self.parts.loader), done=self.step)
        accuracy = None
        with display:
            while self.epoch < epochs:
                self.parts.sampler.set_epoch(self.epoch)
                self._train_epoch(display)
                accuracy = self.evaluate()
                self._log_eval(accuracy)
                self.epoch += 1
                if self.config.run.checkpoint_every is None:
                    self._save()
        if accuracy is None:
            accuracy = self.evaluate()
        strategy.finish()
        return self._finish(self.stats.summary(), accuracy)

    def _train_epoch(self, display: ProgressDisplay) -> None:
        every, evals = self.config.run.checkpoint_every, self.config.run.eval_every
        for x, y in self.parts.loader:
            self.timeline.begin_step(self.step)
            loss, correct, times = self._train_step(x, y)
            self.step += 1
            global_batch = x.shape[0] * self.parts.strategy.num_workers
            self.stats.add(times, global_batch)
            self._log_step(loss, correct / max(1, x.shape[0]), global_batch, times)
            display.advance(loss, correct / max(1, x.shape[0]), global_batch / times.step_s)
            if every is not None and self.step % every == 0:
                self._save()
            if evals is not None and self.step % evals == 0:
                self._log_eval(self.evaluate())

    def _train_step(self, x: torch.Tensor, y: torch.Tensor) -> tuple[float, int, StepTimes]:
        strategy, timeline = self.parts.strategy, self.timeline
        strategy.module.train()
        start = time.perf_counter()
        strategy.zero_grad(set_to_none=True)
        with timeline.span("forward", "compute", lane="compute"):
            output = strategy.model(x)
            loss = nn.functional.cross_entropy(output, y)
        with timeline.span("backward", "compute", lane="compute"):
            loss.backward()
        with timeline.span("optimizer step", "compute", lane="compute"):
            strategy.step()
        elapsed = time.perf_counter() - start
        sync = strategy.stats.reset()
        self.stats.add_staleness(sync.pushes, sync.staleness_sum, sync.staleness_max)
        self._staleness = sync.mean_staleness
        correct = int((output.argmax(dim=1) == y).sum())
        return float(loss.detach()), correct, StepTimes(elapsed, sync.comm_s, sync.wait_s)

    def _log_eval(self, accuracy: float) -> None:
        if self.metrics is not None:
            self.metrics.log_eval(self.step, self.epoch, test_accuracy=accuracy)

    def _log_step(self, loss: float, accuracy: float, samples: int, times: StepTimes) -> None:
        if self.metrics is None:
            return
        self.metrics.log_step(
            self.step, self.epoch, loss=loss, accuracy=accuracy,
            samples_per_s=samples / times.step_s, step_s=times.step_s, comm_s=times.comm_s,
            wait_s=times.wait_s, staleness=self._staleness,
        )

    @torch.no_grad()
    def evaluate(self) -> float:
        """Test accuracy of the strategy's evaluation module (the center variable for elastic
        averaging) over the whole test set, each worker scoring every ``num_workers``-th sample,
        the counts summed with an allreduce over the workers."""
        strategy = self.parts.strategy
        strategy.synchronize()
        model = strategy.evaluation_module()
        model.eval()
        test = self.parts.test_set
        indices = torch.arange(strategy.worker_rank, len(test), strategy.num_workers)
        counts = torch.zeros(2, dtype=torch.int64)
        for chunk in indices.split(512):
            x, y = test.gather(chunk)
            counts[0] += int((model(x).argmax(dim=1) == y).sum())
            counts[1] += chunk.numel()
        collectives.allreduce(counts, algorithm="native", group=strategy.worker_group)
        return float(counts[0]) / max(1, int(counts[1]))

    # -- the end --------------------------------------------------------------------------------
    def _finish(self, summary: RunSummary, accuracy: float | None) -> dict[str, Any]:
        self.timeline.save(self.out / f"timeline-rank{self.rank}.json")
        staleness = self._gather_staleness()
        dist.barrier()
        self.parts.strategy.close()
        result: dict[str, Any] = {**summary.to_dict(), "test_accuracy": accuracy,
                                  "out": str(self.out), "world_size": self.world_size,
                                  "workers": self.parts.strategy.num_workers,
                                  "staleness_per_worker": staleness}
        if self.rank != 0:
            return result
        assert self.metrics is not None
        self.metrics.log_summary(summary)
        self.metrics.close()
        parts = [self.out / f"timeline-rank{r}.json" for r in range(self.world_size)]
        merge_timelines(parts, self.out / "timeline.json")
        for part in parts:
            part.unlink(missing_ok=True)
        result["plots"] = [str(p) for p in plot_metrics(self.out / "metrics.jsonl", self.out)]
        return result

    def _gather_staleness(self) -> list[float | None] | None:
        """Every rank's mean staleness (``None`` for a rank that pushed nothing, e.g. a server),
        gathered on every rank; ``None`` when no rank pushed to a parameter server."""
        mine = torch.tensor([self.stats.pushes, self.stats.staleness_sum], dtype=torch.int64)
        everyone = torch.zeros(self.world_size * 2, dtype=torch.int64)
        collectives.allgather(everyone, mine, algorithm="native")
        pairs = everyone.view(-1, 2).tolist()
        if not any(pushes for pushes, _ in pairs):
            return None
        return [total / pushes if pushes else None for pushes, total in pairs]
