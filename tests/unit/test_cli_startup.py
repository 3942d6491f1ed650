"""What a process imports on its way to work: every worker of ``scaledl train`` and every
elastic agent pays its imports on each start and restart, so neither loads what it never runs."""

from __future__ import annotations

import subprocess
import sys


def _modules_after(code: str) -> set[str]:
    """The ``scaledl`` modules a fresh interpreter holds after running ``code``."""
    probe = (code + "\nimport sys\n"
             "print('\\n'.join(m for m in sys.modules if m.startswith('scaledl')))")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          timeout=120, check=True)
    return set(done.stdout.split())


def test_a_subcommand_loads_only_its_own_module() -> None:
    loaded = _modules_after(
        "from scaledl.cli.main import main\n"
        "try:\n    main(['train', '--help'])\nexcept SystemExit:\n    pass")
    assert "scaledl.cli.train" in loaded
    assert not loaded & {"scaledl.cli.bench", "scaledl.cli.simulate", "scaledl.cli.cluster",
                         "scaledl.cli.run"}


def test_the_full_parser_still_lists_every_subcommand() -> None:
    from scaledl.cli.main import COMMANDS, build_parser

    text = build_parser().format_help()
    assert all(name in text for name in COMMANDS)


def test_an_elastic_agent_does_not_load_the_training_package() -> None:
    loaded = _modules_after("import scaledl.launch.agent_main")
    assert not {m for m in loaded if m.startswith(("scaledl.train", "scaledl.strategies"))}
