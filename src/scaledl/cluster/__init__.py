"""An emulated multi-host cluster on one machine: network namespaces joined by shaped links.

``scaledl cluster up --hosts 2 --rate 1gbit`` builds it, ``scaledl cluster run`` starts any
command as ``R`` ranks per host across it, ``scaledl cluster down`` removes it.  Needs root and
iproute2.  Only bandwidth is emulated: this kernel has no ``netem``, so latency and loss are not.
"""

from __future__ import annotations

from scaledl.cluster.netns import create, destroy, link_counters, preflight
from scaledl.cluster.runner import placement, plan_ranks, run_on_cluster, run_ranks
from scaledl.cluster.spec import ClusterSpec, format_rate, parse_rate
from scaledl.cluster.state import ClusterRecord

__all__ = [
    "ClusterSpec", "ClusterRecord", "parse_rate", "format_rate", "preflight", "create", "destroy",
    "link_counters", "placement", "plan_ranks", "run_ranks", "run_on_cluster",
]
