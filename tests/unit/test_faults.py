"""Fault plans: parsing, one-line errors, and which rank, step, collective and attempt fire."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from scaledl import faults


@pytest.fixture(autouse=True)
def fresh_plan(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in (faults.FAULT_ENV, "RANK", "TORCHELASTIC_RESTART_COUNT", faults.RELAUNCH_ENV):
        monkeypatch.delenv(name, raising=False)
    faults.reset()
    yield
    faults.reset()


def test_parse_every_kind() -> None:
    plan = faults.parse_faults("rank:1,step:5,kind:crash; rank:0,collective:3,kind:slow:2.5,"
                               "attempt:*;rank:2,step:1,kind:lose,attempt:1")
    assert plan[0] == faults.Fault(rank=1, kind="crash", step=5)
    assert plan[1] == faults.Fault(rank=0, kind="slow", collective=3, seconds=2.5, attempt=None)
    assert plan[2] == faults.Fault(rank=2, kind="lose", step=1, attempt=1)
    assert plan[0].describe() == "injected crash of rank 1 before step 5"


@pytest.mark.parametrize(("text", "needle"), [
    ("rank:1,kind:crash", "exactly one of step:N or collective:N"),
    ("rank:1,step:2,collective:3,kind:crash", "exactly one of"),
    ("step:2,kind:crash", "needs rank: too"),
    ("rank:5,step:1", "needs kind: too .kind: one of crash, hang, raise, slow:S, lose"),
    ("step:1", "needs rank: and kind: too"),
    ("rank:1,step:0,kind:crash", "step:0 must be a whole number >= 1"),
    ("rank:x,step:2,kind:crash", "rank:x must be a whole number"),
    ("rank:1,step:2,kind:explode", "kind:explode is unknown"),
    ("rank:1,step:2,kind:slow", "kind:slow needs a positive number of seconds"),
    ("rank:1,step:2,kind:slow:-1", "kind:slow needs a positive"),
    ("rank:1,step:2,kind:crash:3", "kind:crash takes no value"),
    ("rank:1,step:2,kind:crash,color:red", "'color:red' is not one of the fields"),
    ("rank:1,rank:2,step:2,kind:crash", "is not one of the fields"),
    ("rank 1", "is not one of the fields"),
])
def test_malformed_plans_are_one_line_errors(text: str, needle: str) -> None:
    with pytest.raises(ValueError, match=needle) as info:
        faults.parse_faults(text)
    assert "\n" not in str(info.value)


def test_a_malformed_flag_is_named_as_the_flag() -> None:
    """``--inject-fault rank:5,step:1`` said 'SCALEDL_FAULT ... needs rank: and kind:'."""
    with pytest.raises(ValueError) as info:
        faults.check_fault_spec("rank:5,step:1", 2, source="--inject-fault")
    assert str(info.value).startswith("--inject-fault 'rank:5,step:1' needs kind: too")


def test_check_fault_spec_bounds_the_rank() -> None:
    with pytest.raises(ValueError, match="rank:3 is outside the 3 workers"):
        faults.check_fault_spec("rank:3,step:1,kind:crash", world_size=3)
    with pytest.raises(ValueError, match="names no fault"):
        faults.check_fault_spec(" ; ")


@pytest.mark.parametrize(("text", "needle"), [
    ("rank:1,step:16,kind:crash", "step:16 is beyond the run's 15 training steps, so the fault "
     "would never fire; name a step in 1..15 or train for more epochs"),
    ("rank:0,step:1,kind:raise;rank:3,step:2,kind:hang", "rank:3 serves parameters and takes "
     "no training step, so step:2 never comes; name a training rank in 0..2, or collective:N"),
    ("rank:4,collective:9,kind:crash", "rank:4 is outside the 4 workers; name a rank in 0..3"),
])
def test_a_fault_that_can_never_fire_is_refused(text: str, needle: str) -> None:
    """rank:2,step:20 on a 15-step run never fired, and nothing said so."""
    with pytest.raises(ValueError, match=needle) as info:
        faults.check_fault_spec(text, 4, steps=15, training_ranks=3, source="--inject-fault")
    assert str(info.value).startswith(f"--inject-fault {text!r}: ")


def test_faults_that_can_fire_pass() -> None:
    plan = "rank:1,step:15,kind:crash;rank:3,collective:2,kind:hang;rank:2,step:900,kind:raise"
    with pytest.raises(ValueError, match="step:900"):
        faults.check_fault_spec(plan, 4, steps=15)
    assert len(faults.check_fault_spec(plan, 4, training_ranks=3)) == 3
    assert faults.fault_problem(faults.Fault(rank=3, kind="crash", step=15), 4, 15, 4) is None


def test_step_fault_fires_once_on_its_rank_and_attempt(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(faults.FAULT_ENV, "rank:1,step:3,kind:raise;rank:0,step:3,kind:raise")
    monkeypatch.setenv("RANK", "1")
    faults.at_step(2)
    with pytest.raises(faults.InjectedFault, match="raise of rank 1 before step 3"):
        faults.at_step(3)
    faults.at_step(3)  # fired once only
    faults.reset()
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")
    faults.at_step(3)  # attempt 1: the attempt-0 fault is not armed


def test_every_attempt_and_relaunches_count(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(faults.FAULT_ENV, "rank:0,step:1,kind:raise,attempt:2")
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")
    monkeypatch.setenv(faults.RELAUNCH_ENV, "1")
    with pytest.raises(faults.InjectedFault):
        faults.at_step(1)


def _two_collectives(rank: int, world_size: int) -> str:
    import scaledl

    tensor = torch.ones(4)
    scaledl.allreduce(tensor)
    try:
        scaledl.allreduce(tensor)
    except faults.InjectedFault as error:
        scaledl.allreduce(tensor)  # fired once: the next call runs
        return str(error)
    return "no fault"


def test_collective_fault_fires_inside_the_nth_collective() -> None:
    from tests.harness import run_ranks

    messages = run_ranks(1, _two_collectives, timeout=60,
                         env={faults.FAULT_ENV: "rank:0,collective:2,kind:raise"})
    assert messages == ["injected raise of rank 0 in collective call 2"]


def test_slow_sleeps_and_goes_on(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(faults.FAULT_ENV, "rank:0,step:1,kind:slow:0.01")
    faults.at_step(1)


@pytest.mark.parametrize(("kind", "code"), [("crash", -9), ("raise", 1)])
def test_crash_is_a_sigkill(kind: str, code: int) -> None:
    script = ("from scaledl import faults\nfaults.at_step(1)\nprint('survived')\n")
    env = {faults.FAULT_ENV: f"rank:0,step:1,kind:{kind}", "PATH": "",
           "PYTHONPATH": os.environ.get("PYTHONPATH", "")}  # scaledl from a source tree too
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == code and "survived" not in done.stdout
    assert f"injected {kind} of rank 0 before step 1" in done.stderr
