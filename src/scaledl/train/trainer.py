"""The training loop of one rank: steps, evaluation, metrics, checkpoints, timeline.

Each step is ``forward -> loss -> backward -> strategy.step()``; the strategy's collectives run
on the communicator thread while backward goes on, and the time they ran and the time this
thread waited for them become the step's ``comm_s`` and ``wait_s``.  Rank 0 writes
``metrics.jsonl`` (one line per step, one per evaluation, one per restart), checkpoints (in the
background, atomically, holding model, optimizer, strategy, sampler position and RNG states),
plots, and the merged Chrome trace.

Where a run starts is :mod:`scaledl.train.resume`'s decision: a restarted worker resumes from
its job's newest good checkpoint on its own.  With the same world size the run then reproduces
the uninterrupted one bitwise; with another (an elastic job that lost a worker) the rest of the
epoch is shared exactly among the remaining workers.  Checkpoints come every
``checkpoint_every`` steps (else at every epoch's end), every ``checkpoint_seconds`` (see
:mod:`scaledl.train.checkpoint_schedule`) and at the end; a step never waits for the disk
(:mod:`scaledl.train.checkpoint_writer`).  Fault plans (:mod:`scaledl.faults`) fire before a
step.  Asynchronous strategies evaluate on rank 0 alone and end without collectives, so a dead
worker that the parameter server dropped cannot stall the others (:mod:`scaledl.train.finish`).
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
from scaledl.faults import at_step
from scaledl.strategies.parameter_server import ParameterServerStrategy
from scaledl.topology import Topology
from scaledl.train import finish
from scaledl.train.checkpoint import capture_rng, restore_rng
from scaledl.train.checkpoint_schedule import CheckpointSchedule
from scaledl.train.checkpoint_writer import CheckpointWriter
from scaledl.strategies.catalogue import strategy_class
from scaledl.train.config import TrainConfig
from scaledl.sync.data_parallel import DataParallel
from scaledl.train.metrics import (
    METRICS_NAME, MetricsWriter, RunStats, StepTimes, overlap_note,
)
from scaledl.train.plots import plot_metrics
from scaledl.train.progress import LogProgress, NoProgress, StepProgress
from scaledl.train.restarts import job_id, restart_record, restart_totals
from scaledl.train.resume import JOB_KEY, check_resumable, clear_old_run, find_resume
from scaledl.train.sample_log import SampleLog
from scaledl.train.setup import RunParts, build_run
from scaledl.train.timeline import Timeline, merge_timelines

__all__ = ["Trainer"]

log = logging.getLogger(__name__)


class Trainer:
    """Train ``config`` on this rank of an initialised process group."""

    def __init__(self, config: TrainConfig, topology: Topology,
                 progress: StepProgress | None = None) -> None:
        self.config = config
        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
        shown = self.rank == 0 and config.run.progress and progress is not None
        self.progress: StepProgress = progress if shown and progress else \
            LogProgress(config.run.log_every) if self.rank == 0 else NoProgress()
        """Told of every step on rank 0: the CLI's bar when ``run.progress`` is on, else a log
        line every ``run.log_every`` steps."""
        self.out = Path(config.run.out)
        self.out.mkdir(parents=True, exist_ok=True)
        self.timeline = Timeline(self.rank)
        self.job = job_id()
        self.asynchronous = strategy_class(config.parallel.strategy).server
        state, restart = self._starting_point()
        model_state = state["strategy"]["model"] if state is not None else None
        explicit = topology if topology.explicit else None
        self.parts: RunParts = build_run(config, self.rank, self.world_size, explicit,
                                         self.timeline, model_state)
        self.step, self.epoch = 0, 0
        if state is not None:
            self._restore(state)
        self._open_metrics(topology, restart)
        self.stats = RunStats()
        self._staleness: float | None = None
        strategy = self.parts.strategy
        self.writer = CheckpointWriter(self.out) if self.rank == 0 else None
        collective = not self.asynchronous and strategy.num_workers > 1
        self.schedule = CheckpointSchedule(config.run.checkpoint_every,
                                           config.run.checkpoint_seconds,
                                           self._agree if collective else None)
        self.schedule.start(self.step)
        self._on_disk = self.step if state is not None else -1
        self.samples = self._sample_log(state is not None) if config.run.log_samples else None

    def _starting_point(self) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
        """The state this run starts from (None: from scratch, and rank 0 clears an older run's
        files) and, on rank 0 of a restarted job, the restart's record."""
        resume = find_resume(self.config, self.out, self.job)
        state = resume.state
        restart = None
        if self.rank == 0:
            restart = restart_record(self.out / METRICS_NAME, self.job,
                                     int(state["step"]) if state else 0, self.world_size,
                                     state.get("world_size") if state else None)
            if state is None:
                clear_old_run(self.out)
            finish.clear_reports(self.out)
        if state is not None:
            check_resumable(self.config, state, resume.path, self.world_size)
        return state, restart

    def _open_metrics(self, topology: Topology, restart: dict[str, Any] | None) -> None:
        self.metrics = (
            MetricsWriter(self.out / METRICS_NAME, flush_interval_s=0.0,
                          truncate_after_step=self.step) if self.rank == 0 else None
        )
        if self.metrics is None:
            return
        config = self.config
        self.metrics.log_run(
            model=config.model.name, dataset=config.data.dataset, world_size=self.world_size,
            strategy=config.parallel.strategy, topology=topology.spec, start_step=self.step,
            config=config.to_dict(), launch_id=self.job,
        )
        if restart is not None:
            self.metrics.write(restart)
            log.warning("restart: resumed at step %d with %d workers; %d steps to redo, %.1f s "
                        "lost", self.step, self.world_size, restart["steps_redone"],
                        restart["time_lost_s"] or 0.0)

    def _sample_log(self, resumed: bool) -> SampleLog | None:
        """Every rank's sample log, with rank 0's start time as the attempt's name."""
        attempt = torch.tensor([time.time()], dtype=torch.float64)
        collectives.broadcast(attempt, 0, algorithm="native")
        if not self.parts.strategy.is_worker:
            return None
        return SampleLog(self.out, self.rank, self.world_size, float(attempt[0]),
                         self.step if resumed else None, self.job)

    # -- checkpoints ----------------------------------------------------------------------------
    def _restore(self, state: dict[str, Any]) -> None:
        self.parts.strategy.load_state_dict(state["strategy"])
        self.parts.sampler.load_state_dict(state["sampler"])
        restore_rng(state["rng"])
        self.step, self.epoch = int(state["step"]), int(state["epoch"])
        log.info("resumed at step %d (epoch %d)", self.step, self.epoch)

    def _agree(self, decision: torch.Tensor) -> None:
        collectives.broadcast(decision, 0, algorithm="native",
                              group=self.parts.strategy.worker_group)

    def _save(self, wait: bool = False) -> None:
        """A checkpoint of the state after ``self.step`` (every worker of a synchronous strategy
        calls it; rank 0 alone with an asynchronous one); ``wait``: on disk before returning."""
        if not self.asynchronous:
            self.parts.strategy.prepare_checkpoint()
        self.schedule.saved(self.step)
        if wait:
            self._on_disk = self.step
        if self.writer is None:
            return
        payload = {
            "step": self.step, "epoch": self.epoch, "world_size": self.world_size,
            "config": self.config.to_dict(), "strategy": self.parts.strategy.state_dict(),
            "sampler": self.parts.sampler.state_dict(), "rng": capture_rng(), JOB_KEY: self.job,
        }
        self.writer.submit(self.step, payload, wait=wait)

    @property
    def _checkpoints(self) -> bool:
        """Whether this rank takes part in checkpoints."""
        return self.rank == 0 or not self.asynchronous

    # -- the loop -------------------------------------------------------------------------------
    def run(self) -> dict[str, Any]:
        """Train for the configured epochs; return the summary (``RunSummary`` fields, test
        accuracy, restarts, dropped workers, paths).  A parameter-server rank serves instead."""
        try:
            if not self.parts.strategy.is_worker:
                log.info("rank %d serves parameters", self.rank)
                self.parts.strategy.serve()
                return self._finish(None)
            return self._finish(self._train())
        finally:
            if self.writer is not None:
                self.writer.close(self.config.parallel.timeout_s)
            if self.samples is not None:
                self.samples.close()

    def _train(self) -> float | None:
        epochs = self.config.optim.epochs
        self.progress.start(epochs * len(self.parts.loader), self.step)
        accuracy = None
        try:
            while self.epoch < epochs:
                self.parts.sampler.set_epoch(self.epoch)
                self._train_epoch()
                accuracy = self.evaluate()
                self._log_eval(accuracy)
                self.epoch += 1
                if self.config.run.checkpoint_every is None and self._checkpoints:
                    self._save(wait=self.epoch == epochs)
        finally:
            self.progress.stop()
        if accuracy is None:
            accuracy = self.evaluate()
        if self._on_disk != self.step and self._checkpoints:
            self._save(wait=True)
        return accuracy

    def _train_epoch(self) -> None:
        evals = self.config.run.eval_every
        batches = self.parts.loader.batch_indices() if self.samples is not None else []
        for index, (x, y) in enumerate(self.parts.loader):
            at_step(self.step + 1)
            self.timeline.begin_step(self.step)
            loss, correct, times = self._train_step(x, y)
            self.step += 1
            if self.samples is not None:
                self.samples.record(self.step, self.epoch, batches[index])
            global_batch = x.shape[0] * self.parts.strategy.num_workers
            self.stats.add(times, global_batch)
            self._log_step(loss, correct / max(1, x.shape[0]), global_batch, times)
            self.progress.advance(loss, correct / max(1, x.shape[0]), global_batch / times.step_s)
            if self._checkpoints and self.schedule.due(self.step):
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
            loss.backward()  # type: ignore[no-untyped-call]  # torch leaves it unannotated
        with timeline.span("optimizer step", "compute", lane="compute"):
            strategy.step()
        elapsed = time.perf_counter() - start
        sync = strategy.stats.reset()
        self.stats.add_staleness(sync.pushes, sync.staleness_sum, sync.staleness_max)
        self._staleness = sync.mean_staleness
        correct = int((output.argmax(dim=1) == y).sum())
        return float(loss.detach()), correct, StepTimes(elapsed, sync.comm_s, sync.wait_s)

    def _log_eval(self, accuracy: float | None) -> None:
        if self.metrics is not None and accuracy is not None:
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
    def evaluate(self) -> float | None:
        """Test accuracy of the strategy's evaluation module (the center variable for elastic
        averaging) over the whole test set: each worker scores every ``num_workers``-th sample
        and an allreduce sums the counts; with an asynchronous strategy rank 0 scores it all
        alone (the other workers return None), so a dropped worker cannot stall it."""
        strategy = self.parts.strategy
        if self.asynchronous and self.rank != 0:
            return None
        alone = self.asynchronous or strategy.num_workers == 1
        strategy.synchronize()
        model = strategy.evaluation_module()
        model.eval()
        test = self.parts.test_set
        share, shares = (0, 1) if alone else (strategy.worker_rank, strategy.num_workers)
        indices = torch.arange(share, len(test), shares)
        counts = torch.zeros(2, dtype=torch.int64)
        for chunk in indices.split(512):  # type: ignore[no-untyped-call]  # unannotated in torch
            x, y = test.gather(chunk)
            counts[0] += int((model(x).argmax(dim=1) == y).sum())
            counts[1] += chunk.numel()
        if not alone:
            collectives.allreduce(counts, algorithm="native", group=strategy.worker_group)
        return float(counts[0]) / max(1, int(counts[1]))

    # -- the end --------------------------------------------------------------------------------
    def _finish(self, accuracy: float | None) -> dict[str, Any]:
        strategy = self.parts.strategy
        if self.asynchronous:
            assert isinstance(strategy, ParameterServerStrategy)
            self.timeline.save(self._part(self.rank))
            staleness, dropped = finish.end_asynchronously(
                strategy, self.out, self.rank, self.world_size, self.stats,
                self.config.parallel.timeout_s)
        else:
            strategy.finish()
            self.timeline.save(self._part(self.rank))
            staleness = finish.gather_staleness(self.stats.pushes, self.stats.staleness_sum,
                                                self.world_size)
            finish.world_barrier()
            dropped = []
        strategy.close()
        summary = self.stats.summary()
        buckets = [nbytes for _, _, nbytes in strategy.model.bucket_summary()] \
            if isinstance(strategy.model, DataParallel) else []
        result: dict[str, Any] = {**summary.to_dict(), "test_accuracy": accuracy,
                                  "out": str(self.out), "world_size": self.world_size,
                                  "workers": strategy.num_workers,
                                  "staleness_per_worker": staleness, "dropped_workers": dropped,
                                  "gradient_buckets": buckets,
                                  "overlap_note": overlap_note(summary.hidden_fraction, buckets,
                                                               self.config.parallel.bucket_mb)}
        if self.rank != 0:
            return result
        assert self.metrics is not None
        result.update(restart_totals(self.out / METRICS_NAME))
        self.metrics.write({"kind": "summary", "time": time.time(), **summary.to_dict(),
                            **{key: result[key] for key in ("restarts", "steps_redone",
                                                            "time_lost_s", "dropped_workers")}})
        self.metrics.close()
        parts = [self._part(r) for r in range(self.world_size) if self._part(r).is_file()]
        merge_timelines(parts, self.out / "timeline.json")
        for part in parts:
            part.unlink(missing_ok=True)
        finish.clear_reports(self.out)
        result["plots"] = [str(p) for p in plot_metrics(self.out / METRICS_NAME, self.out)]
        return result

    def _part(self, rank: int) -> Path:
        return self.out / f"timeline-rank{rank}.json"
