"""Fast replay: the virtual-time replay of :mod:`scaledl.collectives.replay`, vectorised.

It evaluates the same model on a :class:`~scaledl.sim.compiled.Compiled` schedule set: round
``i`` of rank ``r`` (a node) starts when round ``i - 1`` ended and ends at

    max(start + own, max over its receives (start of the matching send's round + alpha +
        shared bytes x beta)) + min(reduced, chunk) x gamma + overhead

with ``own`` the larger of its sends' time (per link class, the rank's sends of a round share its
interface) and the reduction ``reduced x gamma`` the pipeline overlaps with the transfers.  The
round graph is a DAG; nodes are grouped into levels (longest chain of dependencies before them)
and each level is evaluated with numpy at once, so a 1024-rank ring (2046 levels of 1024 rounds)
takes a fraction of a second.  A cycle (a deadlock) raises
:class:`~scaledl.collectives.schedule.ScheduleError`.  Tests check it against the full replay.

On top of the replay's host-interface sharing, :class:`~scaledl.sim.network.Network` adds
oversubscribed rack uplinks and, where bytes pass through host CPUs, a round's CPU time: ``own``
is at least the time its CPU work (bytes through TCP, the reduction) takes when the rounds of
one index share the cores; see :mod:`scaledl.sim.hostcpu` and :mod:`scaledl.sim.network`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from scaledl.collectives.schedule import ScheduleError
from scaledl.sim.compiled import Compiled
from scaledl.sim.hostcpu import shared_cores, stage_seconds, tcp_work
from scaledl.sim.network import UPLINK, Network
from scaledl.topology import Topology

__all__ = ["Costs", "cost", "evaluate", "makespan", "PathFeatures", "critical_path"]

Arr = np.ndarray


@dataclass(frozen=True)
class Costs:
    """Static per-round and per-message costs of a compiled schedule on a network."""

    own: Arr
    """Per node: the round's own transfer and reduction time (``start + own``)."""
    post: Arr
    """Per node: reduction of one chunk plus the executor's per-round overhead."""
    edge: Arr
    """Per receive: latency plus shared bytes x beta of the matching send."""
    send_class: Arr
    """Per send: canonical link class (classes with equal alpha and beta are one interface)."""
    out: Arr
    """Per node and canonical class, shape ``(nodes, 3)``: bytes sent, weighted by sharing, less
    an idle shaped link's burst (the bytes paid at ``beta``)."""
    alphas: tuple[float, float, float]
    betas: tuple[float, float, float]
    used: Arr
    """Per node and canonical class: the round sends on it (pays its ``alpha`` even when the
    burst left no bytes to pay)."""


def _rank_arrays(topology: Topology) -> tuple[Arr, Arr, Arr]:
    p = topology.world_size
    coords = np.array([topology.coords(r) for r in range(p)], dtype=np.int64).reshape(p, -1)
    host = np.array([topology.node(r) for r in range(p)], dtype=np.int64)
    per_rack = topology.axes[1] if len(topology.axes) > 1 else 1
    return coords, host, host // per_rack


def _classes(compiled: Compiled, coords: Arr) -> Arr:
    differ = coords[compiled.send_rank] != coords[compiled.send_peer]
    depth = coords.shape[1]
    axis = depth - 1 - np.argmax(differ[:, ::-1], axis=1)
    klass: Arr = np.minimum(axis, UPLINK)
    return klass


def _sharers(group: Arr, rnd: Arr, node: Arr, mask: Arr, max_rounds: int) -> Arr:
    """Per send: how many distinct ranks of its group send (``mask``) in the same round."""
    result = np.ones(len(node), dtype=np.float64)
    if not mask.any():
        return result
    senders = np.unique(node[mask])
    keys = group[senders // max_rounds] * max_rounds + senders % max_rounds
    uniq, counts = np.unique(keys, return_counts=True)
    mine = group[node[mask] // max_rounds] * max_rounds + rnd[mask]
    result[mask] = counts[np.searchsorted(uniq, mine)]
    return result


def cost(
    compiled: Compiled, topology: Topology, network: Network, merge_equal: bool = True
) -> Costs:
    """Per-round and per-message costs of ``compiled`` on ``network``.

    With ``merge_equal`` (as the full replay does), link classes with equal alpha and beta are
    one interface whose bandwidth a rank's sends over either share; calibration turns it off so
    that each class keeps its own parameters while they are fitted.
    """
    if topology.world_size != compiled.world_size:
        raise ValueError(f"topology {topology.spec} has {topology.world_size} ranks but the "
                         f"schedules {compiled.world_size}")
    links = network.classes
    canon = [next(j for j in range(3) if (links[j].alpha, links[j].beta) ==
                  (links[c].alpha, links[c].beta)) if merge_equal else c for c in range(3)]
    coords, host, rack = _rank_arrays(topology)
    raw = _classes(compiled, coords)
    klass = np.array(canon, dtype=np.int64)[raw]
    node, rnd, r_max = compiled.send_node, compiled.send_round, compiled.max_rounds
    host_share = (_sharers(host, rnd, node, raw >= 1, r_max) if network.share_host_interface
                  else np.ones(len(node)))
    weight = host_share
    if network.oversubscription > 1 and len(topology.axes) > 2:
        rack_share = _sharers(rack, rnd, node, raw >= UPLINK, r_max)
        scaled = rack_share * network.oversubscription / topology.axes[1]
        weight = np.where(raw >= UPLINK, np.maximum(weight, scaled), weight)
    n = compiled.nodes
    real = ~compiled.send_virtual if compiled.send_virtual is not None else np.ones(
        len(node), dtype=bool)
    out = np.zeros((n, 3), dtype=np.float64)
    np.add.at(out, (node[real], klass[real]), (compiled.send_bytes * weight)[real])
    if network.burst_bytes > 0:
        _spend_burst(out, compiled, host, (raw >= 1) & real, klass, network.burst_bytes)
    used = np.zeros((n, 3), dtype=bool)
    used[node[real], klass[real]] = True
    alphas = np.array([link.alpha for link in links])
    betas = np.array([link.beta for link in links])
    link_time = np.where(used, alphas[None, :] + out * betas[None, :], 0.0).max(axis=1)
    reduced = np.zeros(n, dtype=np.float64)
    np.add.at(reduced, compiled.recv_node, compiled.recv_bytes * compiled.recv_reduce)
    work = reduced * network.gamma + tcp_work(compiled, network, raw >= 1, host_share)
    own = np.maximum(link_time, shared_cores(work, compiled.world_size, compiled.max_rounds,
                                             network.cpu_contention))
    post = (np.minimum(reduced, network.chunk_bytes) * network.gamma * network.cpu_contention
            + network.overhead)
    matched = compiled.match
    e_class = klass[matched]
    edge = alphas[e_class] + out[node[matched], e_class] * betas[e_class]
    if compiled.stages:
        _price_stages(compiled, network, host, own, post, edge)
    a0, a1, a2 = (float(a) for a in alphas)
    b0, b1, b2 = (float(b) for b in betas)
    return Costs(own, post, edge, klass, out, (a0, a1, a2), (b0, b1, b2), used)


def _spend_burst(out: Arr, compiled: Compiled, host: Arr, leaving: Arr, klass: Arr,
                 burst: float) -> None:
    """A shaped host interface that idled passes ``burst`` bytes at once (a token bucket's
    depth): the first round in which a host's ranks send off it, after the call's start, finds
    the bucket full, so that round's (shared) bytes on the class are ``burst`` fewer, never below
    0; later rounds find it drained."""
    if not leaving.any():
        return
    hosts, rounds = host[compiled.send_rank[leaving]], compiled.send_round[leaving]
    first = np.full(int(host.max()) + 1, compiled.max_rounds, dtype=np.int64)
    np.minimum.at(first, hosts, rounds)
    chosen = np.flatnonzero(leaving)[rounds == first[hosts]]
    nodes, classes = compiled.send_node[chosen], klass[chosen]
    out[nodes, classes] = np.maximum(out[nodes, classes] - burst, 0.0)


def _price_stages(
    compiled: Compiled, network: Network, host: Arr, own: Arr, post: Arr, edge: Arr
) -> None:
    """A stage node ends ``stage_time`` after the last of its members started it: its own cost
    and every marker edge into it carry that time, and it pays no per-round overhead.  Stages of
    one host and round that leave the host share its interface (as the full replay has it); the
    host CPU's share of a stage is :func:`~scaledl.sim.hostcpu.stage_seconds`'s."""
    assert compiled.stages is not None and compiled.recv_virtual is not None
    model = network.to_cost_model()
    r_max = compiled.max_rounds
    leaving: dict[tuple[int, int], int] = {}
    for node, stage in compiled.stages.items():
        rank = node // r_max
        if any(host[member] != host[rank] for member in stage.members):
            key = (int(host[rank]), node % r_max)
            leaving[key] = leaving.get(key, 0) + 1
    seconds = {
        node: stage_seconds(stage, compiled.itemsize, model, network,
                            leaving.get((int(host[node // r_max]), node % r_max), 1))
        for node, stage in compiled.stages.items()
    }
    nodes = np.fromiter(seconds, dtype=np.int64, count=len(seconds))
    times = np.fromiter(seconds.values(), dtype=np.float64, count=len(seconds))
    own[nodes] = times
    post[nodes] = 0.0
    marker = np.flatnonzero(compiled.recv_virtual)
    lookup = dict(zip(nodes.tolist(), times.tolist()))
    edge[marker] = [lookup[int(d)] for d in compiled.recv_node[marker]]


def _send_pred(compiled: Compiled) -> Arr:
    """Per receive: the node whose end starts the matching send's round (-1: starts at 0)."""
    src = compiled.send_node[compiled.match]
    return np.where(src % compiled.max_rounds > 0, src - 1, -1)


def _levels(compiled: Compiled, valid: Arr) -> Arr:
    """Longest dependency chain before each node; ScheduleError on a cycle."""
    p, r_max = compiled.world_size, compiled.max_rounds
    index = np.tile(np.arange(r_max), p)
    pred, dst = _send_pred(compiled), compiled.recv_node
    level = index.copy()
    total = int(valid.sum())
    while True:
        ext = np.full(compiled.nodes, -1, dtype=np.int64)
        vals = np.where(pred >= 0, level[np.maximum(pred, 0)] + 1, 0)
        np.maximum.at(ext, dst, vals)
        val = (ext - index).reshape(p, r_max)
        val[:, 0] = np.maximum(val[:, 0], 0)
        new = (index.reshape(p, r_max) + np.maximum.accumulate(val, axis=1)).reshape(-1)
        if np.array_equal(new, level):
            return level
        level = new
        if level[valid].max(initial=0) > total:
            stuck = sorted({int(v) for v in dst[vals > total] // r_max})[:8]
            raise ScheduleError(f"replay deadlocked: ranks {stuck} wait for messages never sent")


def evaluate(compiled: Compiled, costs: Costs) -> Arr:
    """End time of every node (padding nodes hold 0)."""
    valid = compiled.valid()
    level = _levels(compiled, valid)
    nodes = np.flatnonzero(valid)
    order = np.argsort(level[nodes], kind="stable")
    nodes = nodes[order]
    node_bounds = np.searchsorted(level[nodes], np.arange(level[nodes].max(initial=-1) + 2))
    dst = compiled.recv_node
    e_order = np.argsort(level[dst], kind="stable")
    e_dst, e_pred, e_cost = dst[e_order], _send_pred(compiled)[e_order], costs.edge[e_order]
    e_bounds = np.searchsorted(level[e_dst], np.arange(len(node_bounds)))
    r_max = compiled.max_rounds
    end = np.zeros(compiled.nodes, dtype=np.float64)
    acc = np.zeros(compiled.nodes, dtype=np.float64)
    for lv in range(len(node_bounds) - 1):
        here = nodes[node_bounds[lv]:node_bounds[lv + 1]]
        start = np.where(here % r_max > 0, end[here - 1], 0.0)
        acc[here] = start + costs.own[here]
        lo, hi = e_bounds[lv], e_bounds[lv + 1]
        if hi > lo:
            pred = e_pred[lo:hi]
            sent = np.where(pred >= 0, end[np.maximum(pred, 0)], 0.0)
            np.maximum.at(acc, e_dst[lo:hi], sent + e_cost[lo:hi])
        end[here] = acc[here] + costs.post[here]
    return end


def makespan(compiled: Compiled, costs: Costs) -> float:
    """Seconds until the last rank finishes."""
    if len(compiled.send_node) == 0 and not compiled.rounds.any():
        return 0.0
    return float(evaluate(compiled, costs).max(initial=0.0))


@dataclass(frozen=True)
class PathFeatures:
    """The critical path as a linear function of the link parameters."""

    alpha_counts: tuple[float, float, float]
    """Latencies paid per link class."""
    byte_counts: tuple[float, float, float]
    """Bytes (weighted by sharing) paid at each class's ``beta``."""
    known: float
    """Seconds the path pays that do not depend on alpha or beta (overhead, reduction)."""


def critical_path(compiled: Compiled, costs: Costs, end: Arr | None = None) -> PathFeatures:
    """Walk back from the last rank's end along whichever term set each round's end."""
    end = evaluate(compiled, costs) if end is None else end
    r_max = compiled.max_rounds
    into: dict[int, list[int]] = {}
    for k, d in enumerate(compiled.recv_node.tolist()):
        into.setdefault(d, []).append(k)
    pred, matched = _send_pred(compiled), compiled.match
    alpha, nbytes, known = [0.0] * 3, [0.0] * 3, 0.0
    node = int(np.argmax(end)) if end.size else -1
    while node >= 0:
        known += float(costs.post[node])
        target = end[node] - costs.post[node]
        start = end[node - 1] if node % r_max else 0.0
        tol = 1e-12 + 1e-9 * abs(target)
        chosen = next((k for k in into.get(node, []) if abs(
            (end[pred[k]] if pred[k] >= 0 else 0.0) + costs.edge[k] - target) <= tol
            and start + costs.own[node] <= target + tol), None)
        if chosen is not None:
            klass = int(costs.send_class[matched[chosen]])
            alpha[klass] += 1
            nbytes[klass] += float(costs.out[compiled.send_node[matched[chosen]], klass])
            node = int(pred[chosen])
            continue
        own = float(costs.own[node])
        times = [costs.alphas[c] + costs.out[node, c] * costs.betas[c]
                 if costs.used[node, c] else -1.0 for c in range(3)]
        best = int(np.argmax(times))
        if own > 0 and abs(times[best] - own) <= 1e-12 + 1e-9 * own:
            alpha[best] += 1
            nbytes[best] += float(costs.out[node, best])
        else:
            known += own
        node = node - 1 if node % r_max else -1
    return PathFeatures(tuple(alpha), tuple(nbytes), known)  # type: ignore[arg-type]
