"""What the docs promise of the package itself: submodules after ``import scaledl``, ``python -m
scaledl``, install lines that work from a clone, and examples/ holding what the docs name."""

from __future__ import annotations

import re
import subprocess
import sys

from tests.docs.blocks import ROOT, markers_before

DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def _python(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=60,
                          cwd=ROOT)


def test_submodules_load_on_first_use_after_import_scaledl() -> None:
    # A fresh interpreter: in this one, some test has imported scaledl.collectives already.
    result = _python("-c", "import scaledl; print(scaledl.collectives.available('allreduce')); "
                           "print(scaledl.data.ShardedLoader.__name__)")
    assert result.returncode == 0, result.stderr
    assert "'ring'" in result.stdout and "ShardedLoader" in result.stdout


def test_unknown_names_are_still_attribute_errors() -> None:
    result = _python("-c", "import scaledl, sys; "
                           "sys.exit(any(hasattr(scaledl, n) for n in ('nope', '__main__')))")
    assert result.returncode == 0, result.stderr


def test_python_dash_m_scaledl_is_the_scaledl_command() -> None:
    result = _python("-m", "scaledl", "--version")
    assert result.returncode == 0, result.stderr
    assert "0.1.0" in result.stdout + result.stderr
    refused = _python("-m", "scaledl", "train", "--epochs", "0")
    assert refused.returncode == 2
    assert refused.stderr.startswith("scaledl: error: epochs 0"), refused.stderr


def _pip_install_lines() -> list[tuple[str, str]]:
    lines = []
    for document in DOCUMENTS:
        for line in document.read_text().splitlines():
            if re.search(r"\bpip install\b", line) and "scaledl" in line.split("#")[0]:
                lines.append((document.name, line))
    return lines


def test_pip_install_lines_install_scaledl_from_the_clone() -> None:
    """scaledl is not on PyPI: ``pip install 'scaledl[lightning]'`` finds nothing, while
    ``pip install -e '.[lightning]'`` in a clone works; every extra named must exist."""
    extras = set(re.findall(r"^(\w+) = \[", (ROOT / "pyproject.toml").read_text(), re.M))
    for name, line in _pip_install_lines():
        command = line.split("#")[0]
        assert not re.search(r"""['"]?\bscaledl\[""", command), f"{name}: {line}"
        for extra in re.findall(r"\.\[([\w,]+)\]", line):
            assert set(extra.split(",")) <= extras, f"{name}: {line}: no such extra"


def test_the_programs_the_docs_run_are_in_examples() -> None:
    named = set()
    for document in DOCUMENTS:
        named.update(re.findall(r"\bexamples/[\w.-]+", document.read_text()))
    assert {"examples/train.py", "examples/horovod_train.py", "examples/train.toml"} <= named
    for path in named:
        assert (ROOT / path).is_file(), f"{path} is named in the docs but missing"


def test_markers_are_read_from_the_comments_right_above_a_block() -> None:
    text = 'x\n<!-- skip: next "r" -->\n<!-- launch: python; torchrun -->\n```python\n'
    assert markers_before(text, text.index("```")) == {"skip": 'next "r"',
                                                       "launch": "python; torchrun"}
    assert markers_before("<!-- save: a.py -->\ntext\n```", 25) == {}
