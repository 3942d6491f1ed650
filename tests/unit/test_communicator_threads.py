"""Two threads whose first scaledl calls race on one group share one communicator: creating
one is a collective, and a second creation would open a channel under store keys that the
other ranks never use (a hang on 4 ranks, found by a new user's threaded script)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch.distributed as dist

from scaledl.collectives import communicator as communicator_module
from scaledl.collectives.communicator import Communicator, communicator_for, forget_communicator


@pytest.fixture
def world_of_one(tmp_path: Path) -> Iterator[None]:
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0,
                            world_size=1)
    try:
        yield
    finally:
        group = dist.group.WORLD
        assert group is not None
        forget_communicator(group)
        dist.destroy_process_group()


def test_racing_first_calls_share_one_communicator(world_of_one: None,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    made: list[int] = []
    original = Communicator.__init__

    def slow_init(self: Communicator, group: dist.ProcessGroup) -> None:
        made.append(threading.get_ident())
        time.sleep(0.2)  # a creation waits for its peers; the other thread arrives meanwhile
        original(self, group)

    monkeypatch.setattr(communicator_module.Communicator, "__init__", slow_init)
    got: list[Communicator] = []
    threads = [threading.Thread(target=lambda: got.append(communicator_for(None)))
               for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert len(made) == 1 and len(got) == 2 and got[0] is got[1]
