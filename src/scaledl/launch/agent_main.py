"""One node's torch elastic agent (``python -m scaledl.launch.agent_main SPEC``), started by
:func:`scaledl.launch.agents.launch_agents` for each worker.

It does what ``torchrun --nnodes MIN:MAX --nproc-per-node 1 --rdzv-backend c10d`` does, with
three settings torchrun has no flag for: the rendezvous store is a client of the launcher's
(``is_host`` false), heartbeats are every second (a lost node leaves the next round after
:data:`HEARTBEAT_ATTEMPTS` seconds), and there is no exit barrier (torch's keeps a finished
agent alive until every agent has finished, which a dead worker's never does; it exists to keep
an agent-hosted store alive, and here the launcher hosts it).  When the agent is done it writes
``agent-<node>.json``: ``{"failures": {global rank: {"exitcode", "cause", "time"}},
"succeeded": [global ranks]}``.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from pathlib import Path
from typing import Any

from torch.distributed.elastic.agent.server.api import RunResult, WorkerSpec
from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent
from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs, SignalException
from torch.distributed.elastic.rendezvous import RendezvousParameters
from torch.distributed.elastic.rendezvous.registry import get_rendezvous_handler

from scaledl.launch.policy import SHUTDOWN_GRACE_S, die_with_launcher, supported_options

__all__ = ["main", "HEARTBEAT_ATTEMPTS", "LAST_CALL_S"]

HEARTBEAT_ATTEMPTS = 3
"""Missed one-second heartbeats after which a node is taken for dead."""
LAST_CALL_S = 3
"""Seconds a round waits for more nodes once ``min_nodes`` have joined."""
JOIN_TIMEOUT_S = 120
"""Seconds a node waits for a round to complete (fewer than ``min_nodes`` left: it gives up)."""


class _NodeAgent(LocalElasticAgent):
    """torch's local agent without the exit barrier (see the module docstring)."""

    def _exit_barrier(self) -> None:
        return


def _failures(result: RunResult | None) -> dict[str, dict[str, Any]]:
    if result is None or not result.is_failed():
        return {}
    found = {}
    for rank, failure in result.failures.items():
        cause = (f"died ({failure.signal_name()})" if failure.exitcode < 0
                 else f"exited with code {failure.exitcode}")
        found[str(rank)] = {"exitcode": failure.exitcode, "cause": cause,
                            "time": failure.timestamp}
    return found


def main(spec: dict[str, Any]) -> int:
    """Run one node's agent as ``spec`` says; return its exit code."""
    logging.basicConfig(level=logging.WARNING, format="[agent %(process)d] %(message)s")
    die_with_launcher()  # a killed launcher takes its agents (and so their workers) with it
    directory = Path(spec["directory"])
    params = RendezvousParameters(
        backend="c10d", endpoint=f"127.0.0.1:{spec['port']}", run_id=spec["run_id"],
        min_nodes=spec["min_nodes"], max_nodes=spec["max_nodes"], local_addr="127.0.0.1",
        is_host=False, join_timeout=JOIN_TIMEOUT_S, last_call_timeout=LAST_CALL_S,
        keep_alive_interval=1, keep_alive_max_attempt=HEARTBEAT_ATTEMPTS,
    )
    handler = get_rendezvous_handler(params)
    worker = WorkerSpec(role="worker", local_world_size=1, entrypoint=spec["entrypoint"],
                        args=tuple(spec["args"]), rdzv_handler=handler,
                        max_restarts=spec["max_restarts"], monitor_interval=0.1,
                        local_addr="127.0.0.1")
    logs = DefaultLogsSpecs(log_dir=str(directory / f"logs-{spec['node']}"))
    agent = _NodeAgent(worker, logs, exit_barrier_timeout=0,
                       **supported_options(LocalElasticAgent, shutdown_timeout=SHUTDOWN_GRACE_S))
    result = None
    try:
        result = agent.run()
    except SignalException:
        return 1
    finally:
        handler.shutdown()
        succeeded = [] if result is None or result.is_failed() else list(result.return_values)
        report = {"failures": _failures(result), "succeeded": succeeded}
        tmp = directory / f".agent-{spec['node']}.json"
        tmp.write_text(json.dumps(report))
        os.replace(tmp, directory / f"agent-{spec['node']}.json")
    return 1 if report["failures"] else 0


if __name__ == "__main__":
    sys.exit(main(json.loads(sys.argv[1])))
