"""The warnings ``scaledl simulate`` prints on stderr before a prediction: where the model is
known to be optimistic for the job asked (one host's shared memory with more ranks than cores,
a device preset pricing a model its published rates do not bear out, a profile measured on a
busy machine, at other batches than the one asked, or with more threads than a rank gets).
Each is one ``scaledl: warning:`` line; the prediction still runs."""

from __future__ import annotations

import sys
from pathlib import Path

from scaledl.sim.job import Job
from scaledl.sim.scenario import contention
from scaledl.profiling.profile_file import MeasuredProfile
from scaledl.topology import Topology

__all__ = ["warn_on_one_host_oversubscription", "warn_on_busy_profile",
           "warn_on_unchecked_compute", "warn_on_unmeasured_batch", "warn_on_threaded_profile"]


def warn_on_one_host_oversubscription(job: Job, topology: Topology) -> None:
    """Say so when every rank is on one host and they outnumber ``--cores``: there the
    shared-memory allreduce measured 2.4-17x the model's price (docs/simulation.md,
    "Validation here"), which is not modelled."""
    if topology.num_nodes == 1 and contention(job, topology.world_size) > 1.0:
        print(f"scaledl: warning: {topology.world_size} ranks share {job.cores} cores on one "
              "host, where this project measured the shared-memory allreduce at 2.4-17x the "
              "model's price (docs/simulation.md, \"Validation here\"); the communication "
              "predicted here is optimistic", file=sys.stderr)


def warn_on_busy_profile(profile: MeasuredProfile, path: Path) -> None:
    """One ``scaledl: warning:`` line naming ``path`` when the profile's own numbers say it was
    measured on a busy machine (:func:`scaledl.profiling.profile_trust.untrustworthy`); it is still
    used."""
    from scaledl.profiling.profile_trust import untrustworthy

    problems = untrustworthy(profile)
    if problems:
        print(f"scaledl: warning: profile {path} looks measured on a busy machine: "
              f"{'; '.join(problems)}; predictions from it are unreliable: profile again on a "
              "quiet machine (with more --repeats)", file=sys.stderr)


def warn_on_unchecked_compute(job: Job) -> None:
    """Say so when a device preset prices a model its published rates do not bear out
    (docs/simulation.md, "Device efficiency"), so only a measured rate or profile is worth
    using there: depthwise convolutions (EfficientNet's rates are 1.5-2.3x below the presets'
    estimates) and, on a GPU, transformers (the presets predict BERT's published rates 41% too
    slow to 25% too fast: their efficiency comes from convolutional networks)."""
    from scaledl.sim.presets import device
    from scaledl.sim.profile import TOKEN_MODELS, has_depthwise

    if job.compute_time is not None or job.profile_path is not None:
        return
    if has_depthwise(job.model, job.input_shape):
        print(f"scaledl: warning: {job.model} has depthwise convolutions, which the device "
              "presets price 1.5-2.3x too fast (EfficientNet against NVIDIA's published rates, "
              "docs/simulation.md); pass the rate you measured (--compute-time) or a profile "
              "(--profile)", file=sys.stderr)
    elif job.model in TOKEN_MODELS and device(job.device).is_gpu:
        print(f"scaledl: warning: {job.model} is a transformer, whose published single-GPU "
              "rates the GPU presets miss by 41% too slow to 25% too fast (BERT-large and "
              "BERT-base, docs/simulation.md), which moves the share of a step communication "
              "takes; pass the rate you measured (--compute-time) or a profile (--profile)",
              file=sys.stderr)


def warn_on_unmeasured_batch(job: Job, profile: MeasuredProfile) -> None:
    """Say so when the batch lies outside the batches ``profile`` measured: its layer times
    are then the nearest two points' straight line extended (a single point's, scaled in
    proportion), which misses what changes there (a GPU's launch-bound floor at small
    batches, a CPU's caches at large ones).  Not with ``--ideal`` or ``--compute-time``, which
    do not take the profile's times."""
    low, high = min(profile.batches), max(profile.batches)
    if job.lossless or job.compute_time is not None or low <= job.batch <= high:
        return
    wanted = ",".join(map(str, sorted({*profile.batches, job.batch})))
    print(f"scaledl: warning: batch {job.batch} is outside the batches the profile "
          f"{job.profile_path} measured ({', '.join(map(str, profile.batches))}): its layer "
          "times are extended from them in a straight line, not measured; profile that batch "
          f"too (`scaledl simulate profile --batches {wanted}`)", file=sys.stderr)


def warn_on_threaded_profile(job: Job, profile: MeasuredProfile) -> None:
    """Say so when a CPU profile measured with several threads meets ``--cores`` that cannot
    give every rank as many: ``--cores`` stretches a rank's measured time by ranks per core, as
    if each rank ran one thread (as torchrun's ``OMP_NUM_THREADS=1`` runs them), so a profile
    that several threads sped up is priced too fast there."""
    threads = profile.device.get("threads", 1)
    if (job.cores is None or job.lossless or job.compute_time is not None or not profile.on_cpu
            or not isinstance(threads, int) or threads <= 1 or job.gpus * threads <= job.cores):
        return
    print(f"scaledl: warning: the profile {job.profile_path} was measured with {threads} "
          f"threads, and {job.gpus} ranks on {job.cores} cores get fewer each: --cores "
          "stretches a one-thread rank's time, so this prediction is optimistic; profile with "
          "the threads each rank will run (`scaledl simulate profile --threads 1`)",
          file=sys.stderr)
