"""Parameter server: wire protocol, server shards and threads, workers' connections, the common
strategy.

The strategies built on it live in :mod:`scaledl.strategies.async_sgd` (Async SGD, Async MSGD,
Hogwild SGD) and :mod:`scaledl.strategies.async_easgd` (Async EASGD, Async MEASGD, Hogwild EASGD).
"""

from __future__ import annotations

from scaledl.strategies.parameter_server.layout import Layout, check_servers, plan_layout
from scaledl.strategies.parameter_server.connections import (
    InProcessServers, RemoteServers, ServerConnection, ServerState,
)
from scaledl.strategies.parameter_server.protocol import (
    HEADER_LEN, MAGIC, ErrorCode, Header, Kind, ProtocolError, ShardSpec,
)
from scaledl.strategies.parameter_server.server import ShardServer
from scaledl.strategies.parameter_server.shard import ServerShard, shard_specs
from scaledl.strategies.parameter_server.strategy import ParameterServerStrategy

__all__ = [
    "Layout", "check_servers", "plan_layout", "ServerConnection", "InProcessServers",
    "RemoteServers", "ServerState",
    "HEADER_LEN", "MAGIC", "ErrorCode", "Header", "Kind", "ProtocolError", "ShardSpec",
    "ShardServer", "ServerShard", "shard_specs", "ParameterServerStrategy",
]
