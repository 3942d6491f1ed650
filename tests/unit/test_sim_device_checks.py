"""Single-GPU rates from the device presets: the rates that set a preset are met, every row is
printed with its error, and `scaledl simulate reproduce` prints the table after the scaling
points."""

from __future__ import annotations

from pathlib import Path

import pytest

from scaledl.sim.device_checks import RATE_CHECKS, RateCheck, predicted_rate, rate_table
from tests.unit import sim_golden


@pytest.mark.parametrize("check", [c for c in RATE_CHECKS if c.used],
                         ids=lambda c: f"{c.device}-{c.model}-{c.batch}")
def test_the_rates_that_set_a_preset_are_met(check: RateCheck) -> None:
    assert predicted_rate(check) == pytest.approx(check.published, rel=0.01)


def test_every_check_is_a_row_with_its_error_and_source() -> None:
    made_up = RateCheck("p100", "resnet50", 32, 97.5, "src-x")  # half the preset's own rate
    table = rate_table((made_up, RATE_CHECKS[0]))
    rows = table.splitlines()
    assert len(rows) == 4
    assert rows[2].startswith("| p100 | resnet50 | 32 | 97.5 | 195.0 | +100% | no | src-x |")
    assert rows[3].startswith("| p100 | resnet50 | 32 | 195 | 195.0 | +0% | yes |")


@pytest.mark.timeout(300)  # traces a dozen models: ~12 s alone, minutes on a loaded machine
def test_the_rate_table_is_the_golden_records() -> None:
    """Every rate check predicted as tests/unit/sim_golden.json recorded it (moving the
    published rates to data changes none)."""
    assert rate_table() == sim_golden.load()["rates"]


def test_token_models_name_their_sequence_length() -> None:
    bert = next(c for c in RATE_CHECKS if c.model == "bert_large" and c.device == "a100-80gb")
    assert "| a100-80gb | bert_large (384) | 32 | 61.5 |" in rate_table((bert,))


def test_reproduce_prints_the_rates_after_the_scaling_points(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
) -> None:
    import scaledl.sim.device_checks
    import scaledl.sim.reproduce
    from scaledl.cli.main import main
    from scaledl.sim.reproduce import Case, Prediction

    one = Case("near", "efficiency", 0.9, "s", "src", lambda ideal: Prediction(0.91, "d"))
    monkeypatch.setattr(scaledl.sim.reproduce, "published_families",
                        lambda: (("a source", (one,)),))
    monkeypatch.setattr(scaledl.sim.device_checks, "rate_table", lambda: "RATES")
    assert main(["simulate", "reproduce"]) == 0
    out = capsys.readouterr().out
    assert out.index("| near | 90.0% | 91.0%") < out.index("| a source | 1 | 1 | +1.0 pt |") \
        < out.index("device presets alone") < out.index("RATES")
    assert main(["simulate", "--ideal", "reproduce"]) == 0
    out = capsys.readouterr().out
    assert "RATES" not in out and "By kind of job" not in out  # the check is the full model's


def test_reproduce_writes_the_errors_a_published_check_reads(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    import scaledl.sim.device_checks
    import scaledl.sim.reproduce
    from scaledl.cli.main import main
    from scaledl.sim.job import Job
    from scaledl.sim.reproduce import Case, Prediction
    from scaledl.sim.trust import Traits, load_errors

    job = Job(model="bert_large", device="a100-80gb", gpus=16, topology="8x2",
              network="ib-hdr-x8", mixed_precision=True)
    one = Case("near", "efficiency", 0.9, "s", "src", lambda ideal: Prediction(0.91, "d", job))
    monkeypatch.setattr(scaledl.sim.reproduce, "published_families",
                        lambda: (("a source", (one,)),))
    monkeypatch.setattr(scaledl.sim.device_checks, "rate_table", lambda: "RATES")
    target = tmp_path / "errors.json"
    assert main(["simulate", "reproduce", "--write-errors", str(target)]) == 0
    [point] = load_errors(target)
    assert point.name == "near" and point.published == 0.9
    assert point.error == pytest.approx(1.0)
    assert point.traits == Traits("a100", "transformer", "mixed", "several hosts")
    assert "| a100 | transformer | several hosts | mixed | 1 | 1 | +1.0 pt |" in \
        capsys.readouterr().out
    assert main(["simulate", "--ideal", "reproduce", "--write-errors", str(target)]) == 2
    assert main(["simulate", "reproduce", "--write-errors", str(tmp_path)]) == 2
    assert "is a directory" in capsys.readouterr().err
