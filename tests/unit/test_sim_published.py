"""The published results, the single-GPU rates and the presets are TOML data, each read by its
loader: a mistake in a file is a one-line error naming the file, the record and the field, and
the shipped files hold every source."""

from __future__ import annotations

from pathlib import Path

import pytest

from scaledl.sim.device_checks import RATE_CHECKS, load_rate_checks
from scaledl.sim.presets import DEVICES, LINKS, TCP_LINKS, load_presets
from scaledl.sim.reproduce import load_cases, published_cases, published_families

GOOD = '''
family = "a source"

[job]
device = "v100"
network = "ib-edr"

[[case]]
name = "eight GPUs"
metric = "efficiency"
published = {throughput = [100.0, 760.0]}
setup = "one host"
source = "a README"
job = {model = "resnet50", gpus = 8, topology = "8", rate = 100.0}
'''


def test_a_case_is_its_job_against_one_gpu_with_the_published_throughputs(tmp_path: Path) -> None:
    [(family, (case,))] = load_cases(_write(tmp_path, GOOD))
    assert family == "a source" and case.name == "eight GPUs"
    assert case.published == pytest.approx(760 / (8 * 100)) and case.rates == (100.0, 760.0)
    assert case.job is not None and case.base is not None
    assert (case.job.gpus, case.job.device, case.job.compute_time) == (8, "v100", 32 / 100.0)
    assert (case.base.gpus, case.base.topology) == (1, "1")


def _write(tmp_path: Path, text: str) -> Path:
    (tmp_path / "01-source.toml").write_text(text)
    return tmp_path


@pytest.mark.parametrize("old, new, message", [
    ('metric = "efficiency"', 'metric = "throughput"', "case 1 ('eight GPUs'): metric"),
    ("gpus = 8,", "gpu = 8,", "field 'job': unknown job field 'gpu'"),
    ("gpus = 8,", 'gpus = "8",', "job field 'gpus' is '8', not int"),
    ("rate = 100.0", "rate = -1.0", "job field 'rate' is -1.0"),
    ('source = "a README"\n', "", "field 'source' is missing"),
    ('setup = "one host"', 'setup = "one host"\ncompare = "fastest"', "field 'compare'"),
    ("[100.0, 760.0]", "[100.0]", "field 'published.throughput' is [100.0]"),
    ("{throughput = [100.0, 760.0]}", "{speed = 1.0}", "field 'published' is a number"),
    ('name = "eight GPUs"', 'name = "eight GPUs"\ncomment = "x"', "unknown field 'comment'"),
    ('family = "a source"', "", "field 'family' is missing"),
])
def test_a_mistake_names_the_file_the_case_and_the_field(tmp_path: Path, old: str, new: str,
                                                         message: str) -> None:
    assert old in GOOD
    with pytest.raises(ValueError, match="published results file 01-source.toml") as error:
        load_cases(_write(tmp_path, GOOD.replace(old, new)))
    assert message in str(error.value)


def test_an_empty_directory_and_broken_toml_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="no published results"):
        load_cases(tmp_path)
    with pytest.raises(ValueError, match="01-source.toml is not valid TOML"):
        load_cases(_write(tmp_path, "family = "))


def test_the_shipped_files_hold_every_source_once_and_unique_names() -> None:
    families = published_families()
    assert len(families) == 16 and len({name for name, _ in families}) == 16
    names = [case.name for case in published_cases()]
    assert len(names) == len(set(names)) == 249
    assert published_families() is families  # read once


def test_rate_checks_are_checked_as_they_load() -> None:
    assert len(RATE_CHECKS) == 73 and sum(check.used for check in RATE_CHECKS) == 7
    with pytest.raises(ValueError, match="rates.toml, rate 1: field 'batch' is '32', not int"):
        load_rate_checks('[[rate]]\ndevice = "p100"\nmodel = "resnet50"\nbatch = "32"\n'
                         'published = 1.0\nsource = "s"\n', "rates.toml")
    with pytest.raises(ValueError, match="rates.toml, rate 1: field 'source' is missing"):
        load_rate_checks('[[rate]]\ndevice = "p100"\nmodel = "resnet50"\nbatch = 32\n'
                         'published = 1.0\n', "rates.toml")
    with pytest.raises(ValueError, match="unknown field 'gpus'"):
        load_rate_checks('[[rate]]\ndevice = "p100"\nmodel = "resnet50"\nbatch = 32\n'
                         'published = 1.0\nsource = "s"\ngpus = 2\n', "rates.toml")


def test_presets_are_checked_as_they_load() -> None:
    devices, links = load_presets('[[device]]\nname = "x"\npeak_tflops = 1.0\nefficiency = 0.5\n'
                                  'memory_gbps = 10.0\nintra = "pcie3"\nsource = "s"\n'
                                  '[[link]]\nname = "l"\nlatency_s = 1e-6\ngbits = 8.0\n', "p.toml")
    assert devices["x"].peak_tflops == 1.0 and links["l"]["gbits"] == 8.0
    with pytest.raises(ValueError, match="p.toml, device 1: unknown field 'peak'"):
        load_presets('[[device]]\nname = "x"\npeak = 1.0\n', "p.toml")
    with pytest.raises(ValueError, match="p.toml, device 1: .*missing"):
        load_presets('[[device]]\nname = "x"\n', "p.toml")
    with pytest.raises(ValueError, match="p.toml, link 1: needs name, latency_s and one of"):
        load_presets('[[link]]\nname = "l"\nlatency_s = 1e-6\ngbits = 8.0\ngbps = 1.0\n',
                     "p.toml")
    assert len(DEVICES) == 9 and len(LINKS) == 29 and "25gbe-roce" not in TCP_LINKS
