"""Whether a measured profile's own numbers can be trusted: a profile taken on a busy machine
shows it (iterations spread wide, a larger batch faster than a smaller one); the commands that
write or use one say so in a warning (``scaledl.cli.simulate_warnings.warn_on_busy_profile``) and
still use it."""

from __future__ import annotations

from scaledl.profiling.profile_file import MeasuredProfile

__all__ = ["JITTER_LIMIT", "FASTER_SLACK", "untrustworthy"]

JITTER_LIMIT = 0.5
"""A ``jitter_cv`` above this says the machine was busy: iterations that vary by half their
median (robustly: interquartile range / 1.349) are not one device's time.  Quiet CPUs measure
0.05-0.09 and this shared VM 0.12 (``benchmarks/sim_validation/raw``), H100s under 0.01."""

FASTER_SLACK = 1 / 3
"""A larger batch whose forward+backward took less than ``1 - FASTER_SLACK`` (two thirds) of a
smaller batch's says the machine was busy while the smaller one ran: no device computes more
in less time.  The slack is the noise of a tiny model's medians over a few repeats on a shared
but usable machine: 30 LeNet profiles at batches 2 and 4 with 3 repeats, here at load average
2 on 2 cores, had batch 4 at 0.76-1.43x batch 2's time."""


def untrustworthy(profile: MeasuredProfile) -> list[str]:
    """What ``profile``'s own numbers say is wrong with them: iterations spread wider than
    :data:`JITTER_LIMIT`, or a larger batch's forward+backward more than
    :data:`FASTER_SLACK` faster than a smaller batch's (both signs of a busy machine)."""
    problems = []
    if profile.jitter_cv > JITTER_LIMIT:
        problems.append(f"jitter_cv {profile.jitter_cv:.2f} is above {JITTER_LIMIT} (its "
                        "iterations varied by more than half their median)")
    fb = profile.forward_backward_s
    pairs = [(fb[j] / fb[i], i, j) for i in range(len(fb)) for j in range(i + 1, len(fb))
             if fb[i] > 0]
    ratio, i, j = min(pairs, default=(1.0, 0, 0))
    if ratio < 1.0 - FASTER_SLACK:
        problems.append(f"batch {profile.batches[j]} took {fb[j] * 1e3:.3g} ms forward+backward, "
                        f"under {1 - FASTER_SLACK:.0%} of batch {profile.batches[i]}'s "
                        f"{fb[i] * 1e3:.3g} ms")
    return problems
