"""The training loop of one rank: steps, evaluation, metrics, checkpoints, timeline.

Each step (an update) is ``forward -> loss -> backward`` on each of ``grad_accum``
micro-batches (all but the last inside the DataParallel's ``no_sync()``), then the learning
rate of the step (:mod:`scaledl.train.optim`), gradient clipping and ``strategy.step()``;
forward and loss run under the run's autocast, and ``fp16`` scales the loss
(:mod:`scaledl.train.precision`).  The strategy's collectives run on the communicator thread
while backward goes on, and the time they ran and the time this thread waited for them become
the step's ``comm_s`` and ``wait_s``.  With ``device = "cuda"`` the model and every batch live on
this rank's GPU (:mod:`scaledl.train.device`).  ``max_steps`` ends the run after that many
updates, inside an epoch if need be.  Rank 0 writes
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

import contextlib
import logging
import time
from contextlib import AbstractContextManager
from dataclasses import dataclass
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
from scaledl.train.model_file import MODEL_NAME, save_model
from scaledl.train.optim import LearningRate, total_updates, updates_per_epoch
from scaledl.train.precision import MixedPrecision
from scaledl.train.plots import plot_metrics
from scaledl.train.progress import LogProgress, NoProgress, StepProgress
from scaledl.train.restarts import job_id, restart_record, restart_totals
from scaledl.train.resume import JOB_KEY, check_resumable, clear_old_run, find_resume
from scaledl.train.sample_log import SampleLog
from scaledl.train.setup import RunParts, build_run
from scaledl.train.timeline import Timeline, merge_timelines

__all__ = ["Trainer"]

log = logging.getLogger(__name__)


@dataclass
class _Update:
    """What the micro-batches of one update add up to."""

    size: int
    """Micro-batches in this update (``grad_accum``, or fewer at an epoch's end)."""
    start: float
    """When its first micro-batch began (``time.perf_counter()``)."""
    done: int = 0
    loss: float = 0.0
    """Sum of the micro-batches' losses weighted by their samples."""
    correct: int = 0
    samples: int = 0


class Trainer:
    """Train ``config`` on this rank of an initialised process group."""

    def __init__(self, config: TrainConfig, topology: Topology,
                 progress: StepProgress | None = None,
                 device: torch.device | None = None) -> None:
        self.config = config
        self.device = device or torch.device("cpu")
        """Where the model, the batches and the trainer's own collectives live."""
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
                                         self.timeline, model_state, self.device)
        self.precision = MixedPrecision(config.run.precision, self.device, self.parts.strategy)
        optim, per_epoch = config.optim, len(self.parts.loader)
        workers = self.parts.strategy.num_workers
        self.total_steps = total_updates(optim, per_epoch)
        """Updates of the whole run (every epoch's, or ``max_steps``)."""
        self.lr = LearningRate(optim, updates_per_epoch(per_epoch, optim.grad_accum),
                               self.total_steps,
                               config.data.batch_size * workers * optim.grad_accum)
        self._evaluated: torch.nn.Module | None = None
        """Rank 0: the module the last evaluation scored (what ``model.pt`` holds)."""
        self._rate = self.lr(0)
        """The learning rate of the last update (logged with its step)."""
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
            (self.out / MODEL_NAME).unlink(missing_ok=True)  # written again when this run ends
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
        attempt = torch.tensor([time.time()], dtype=torch.float64, device=self.device)
        collectives.broadcast(attempt, 0, algorithm="native")
        if not self.parts.strategy.is_worker:
            return None
        return SampleLog(self.out, self.rank, self.world_size, float(attempt[0]),
                         self.step if resumed else None, self.job)

    # -- checkpoints ----------------------------------------------------------------------------
    def _restore(self, state: dict[str, Any]) -> None:
        self.parts.strategy.load_state_dict(state["strategy"])
        self.parts.sampler.load_state_dict(state["sampler"])
        self.precision.load_state_dict(state.get("precision", {}))
        restore_rng(state["rng"])
        self.step, self.epoch = int(state["step"]), int(state["epoch"])
        log.info("resumed at step %d (epoch %d)", self.step, self.epoch)

    def _agree(self, decision: torch.Tensor) -> None:
        moved = decision.to(self.device)  # NCCL moves device tensors only
        collectives.broadcast(moved, 0, algorithm="native",
                              group=self.parts.strategy.worker_group)
        decision.copy_(moved.cpu())

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
            "precision": self.precision.state_dict(),
            "sample": {"input_shape": list(self.parts.train_set.input_shape),
                       "num_classes": self.parts.train_set.num_classes},
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
        self.progress.start(self.total_steps, self.step)
        accuracy, stopped = None, False
        try:
            while self.epoch < epochs and self.step < self.total_steps:
                self.parts.sampler.set_epoch(self.epoch)
                if not self._train_epoch():
                    accuracy, stopped = None, True  # max_steps ended the run inside this epoch
                    break
                accuracy = self.evaluate()
                self._log_eval(accuracy)
                self.epoch += 1
                if self.config.run.checkpoint_every is None and self._checkpoints:
                    self._save(wait=self.epoch == epochs or self.step >= self.total_steps)
        finally:
            self.progress.stop()
        if accuracy is None:
            accuracy = self.evaluate()
            if stopped:
                self._log_eval(accuracy)
        if self._on_disk != self.step and self._checkpoints:
            self._save(wait=True)
        if self.rank == 0 and self._evaluated is not None:
            train = self.parts.train_set
            save_model(self.out, self._evaluated, self.config.model.name, train.input_shape,
                       train.num_classes)
        return accuracy

    def _train_epoch(self) -> bool:
        """The rest of this epoch; False when ``max_steps`` ended it early."""
        evals, accum = self.config.run.eval_every, self.config.optim.grad_accum
        batches = self.parts.loader.batch_indices()
        update: _Update | None = None
        first = 0
        for index, (x, y) in enumerate(self.parts.loader):
            if update is None:  # the first micro-batch of an update
                at_step(self.step + 1)
                self.timeline.begin_step(self.step)
                update = _Update(min(accum, len(batches) - index), time.perf_counter())
                first = index
            self._micro_step(x, y, update)
            if update.done < update.size:
                continue
            times = self._update(update)
            self.step += 1
            if self.samples is not None:
                self.samples.record(self.step, self.epoch, torch.cat(batches[first:index + 1]))
            global_batch = update.samples * self.parts.strategy.num_workers
            loss, accuracy = update.loss / update.samples, update.correct / update.samples
            self.stats.add(times, global_batch)
            self._log_step(loss, accuracy, global_batch, times)
            self.progress.advance(loss, accuracy, global_batch / times.step_s)
            update = None
            if self._checkpoints and self.schedule.due(self.step):
                self._save()
            if evals is not None and self.step % evals == 0:
                self._log_eval(self.evaluate())
            if self.step >= self.total_steps and index + 1 < len(batches):
                return False
        return True

    def _micro_step(self, x: torch.Tensor, y: torch.Tensor, update: _Update) -> None:
        """Forward and backward of one micro-batch; its gradients add to the update's (loss
        divided by the micro-batches of the update, so they add up to their mean)."""
        strategy, timeline = self.parts.strategy, self.timeline
        if update.done == 0:
            strategy.module.train()
            strategy.zero_grad(set_to_none=True)
        x, y = x.to(self.device, non_blocking=True), y.to(self.device, non_blocking=True)
        last = update.done + 1 == update.size
        with contextlib.nullcontext() if last else self._no_sync():
            with timeline.span("forward", "compute", lane="compute"), self.precision.autocast():
                output = strategy.model(x)
                loss = nn.functional.cross_entropy(output, y)
            with timeline.span("backward", "compute", lane="compute"):
                self.precision.backward(loss / update.size if update.size > 1 else loss)
        update.done += 1
        update.loss += float(loss.detach()) * x.shape[0]
        update.correct += int((output.argmax(dim=1) == y).sum())
        update.samples += x.shape[0]

    def _no_sync(self) -> AbstractContextManager[object]:
        """The context of a micro-batch whose gradients stay local: DataParallel's
        ``no_sync()``; nothing for the periodic strategies, whose backward does not
        communicate (the configuration check refuses grad_accum with any other)."""
        no_sync = getattr(self.parts.strategy.model, "no_sync", None)
        return no_sync() if no_sync is not None else contextlib.nullcontext()

    def _update(self, update: _Update) -> StepTimes:
        """The update after the micro-batches: this step's rate, unscaling, clipping and the
        strategy's step (skipped under fp16 when a gradient overflowed)."""
        strategy, clip = self.parts.strategy, self.config.optim.clip_grad_norm
        with self.timeline.span("optimizer step", "compute", lane="compute"):
            self._rate = self.lr.apply(strategy.optimizer, self.step)
            self.precision.unscale()
            if clip is not None:
                nn.utils.clip_grad_norm_(strategy.module.parameters(), clip)
            if not self.precision.step():
                log.info("step %d skipped: the fp16 gradients overflowed (scale now %g)",
                         self.step + 1, self.precision.scaler.get_scale()
                         if self.precision.scaler is not None else 0.0)
        elapsed = time.perf_counter() - update.start
        sync = strategy.stats.reset()
        self.stats.add_staleness(sync.pushes, sync.staleness_sum, sync.staleness_max)
        self.stats.add_bytes(sync.bytes)
        self._staleness = sync.mean_staleness
        return StepTimes(elapsed, sync.comm_s, sync.wait_s)

    def _log_eval(self, accuracy: float | None) -> None:
        if self.metrics is not None and accuracy is not None:
            self.metrics.log_eval(self.step, self.epoch, test_accuracy=accuracy)

    def _log_step(self, loss: float, accuracy: float, samples: int, times: StepTimes) -> None:
        if self.metrics is None:
            return
        self.metrics.log_step(
            self.step, self.epoch, loss=loss, accuracy=accuracy,
            samples_per_s=samples / times.step_s, step_s=times.step_s, comm_s=times.comm_s,
            wait_s=times.wait_s, staleness=self._staleness, lr=self._rate,
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
        self._evaluated = model
        test = self.parts.test_set
        share, shares = (0, 1) if alone else (strategy.worker_rank, strategy.num_workers)
        indices = torch.arange(share, len(test), shares)
        counts = torch.zeros(2, dtype=torch.int64, device=self.device)
        for chunk in indices.split(512):  # type: ignore[no-untyped-call]  # unannotated in torch
            x, y = (t.to(self.device) for t in test.gather(chunk))
            with self.precision.autocast():
                output = model(x)
            counts[0] += (output.argmax(dim=1) == y).sum()
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
                                                self.world_size, self.device)
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
        result["plots"] = ([str(p) for p in plot_metrics(self.out / METRICS_NAME, self.out)]
                           if self.config.run.plots else [])
        return result

    def _part(self, rank: int) -> Path:
        return self.out / f"timeline-rank{rank}.json"
