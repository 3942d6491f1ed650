"""Random sequences of every parameter-server request, each reply checked exactly.

A *config* is one parameter-server job: a strategy (Async SGD, Async MSGD and Hogwild SGD push
updates; Async EASGD and Hogwild EASGD exchange parameters), a number of dedicated servers (0: the
server thread beside rank 0, which rank 0's own worker calls in-process while the other workers
reach it over the wire; k > 0: the last k ranks, each owning one shard), a parameter count and a
dtype.  Every rank builds the job, each worker sends its own random sequence of requests, drawn
from ``(seed, config, rank)`` (the first worker sends none, the last ``calls``, the others
between; :func:`worker_calls`):

- ``step``: a strategy step whose gradients are small integers (``lr`` 0.5, so the pushed update
  ``lr * gradient`` is exact), the fresh parameters taken from the reply;
- ``push``: an integer update pushed through the link, with the versions last read;
- ``exchange``: integer parameters sent for an elastic exchange;
- ``pull`` and ``state``: read the parameters (and momentum, versions);
- ``rejected`` (over the wire only): a PUSH the server must refuse, with its payload (a read
  version from the future for the SGD rule, a PUSH at all for the EASGD rule): the server
  answers ERROR, discards the payload and serves on; the worker's link says so in a
  ProtocolError, and is then used again;

then DONE (:meth:`finish`); a dedicated server serves until every worker is done.  Every worker's
requests, replies and versions are gathered on rank 0, which checks them exactly:

- the updates each shard applied carry the versions 1..N, each once, and each worker saw its
  versions of every shard grow;
- replaying every update in version order with the server's own arithmetic gives, bit for bit,
  every reply (fresh parameters after a push, the elastic difference of an exchange), every
  pulled or saved state of that version, and the shard's final parameters and momentum; a push's
  staleness is the number of other updates between its read and its application;
- with plain SGD (no momentum) the final parameters are the initial ones minus the sum of every
  pushed update, summed in any order: the updates are small integers, so the sum is exact
  (float32 and float64; float16 and bfloat16 travel too, checked by the replay alone).

Hogwild shards apply updates without a lock (lost updates and torn reads are allowed), so for
them only the versions, the staleness of pushes, and the absence of hangs are checked.

With ``SCALEDL_WIRE_JITTER`` set (:mod:`scaledl.transport.direct`) every post and wait of every
request, reply and payload sleeps at random.  ``tests/distributed/test_ps_jitter.py`` runs short
seeded sequences; ``benchmarks/reliability/ps_soak.py`` runs 10,000 requests and more.
"""

from __future__ import annotations

import logging
import random
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from scaledl.strategies.async_easgd import AsyncEASGD, HogwildEASGD
from scaledl.strategies.async_sgd import AsyncMSGD, AsyncSGD, HogwildSGD
from scaledl.strategies.elastic import elastic_difference
from scaledl.strategies.parameter_server import (
    ParameterServerStrategy, ProtocolError, ShardSpec, shard_specs,
)
from scaledl.strategies.parameter_server.connections import RemoteServers

STRATEGIES: dict[str, type[ParameterServerStrategy]] = {
    cls.name: cls for cls in (AsyncSGD, AsyncMSGD, HogwildSGD, AsyncEASGD, HogwildEASGD)}
CALLS = {"sgd": ("step", "push", "pull", "state", "rejected"),
         "easgd": ("exchange", "pull", "state", "rejected")}
"""The request kinds a worker draws from, by server rule (DONE ends every sequence)."""
NUMELS = (1, 2, 3, 7, 64, 1000)
DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16)
LR, MOMENTUM, ALPHA = 0.5, 0.5, 0.5
"""Powers of two, so the workers' side of every step is exact."""
TIMEOUT_S = 20.0
EXACT_SUMS = (torch.float32, torch.float64)
"""Dtypes whose sums of a few thousand small integers are exact in any order (the half types
round above 2048 or 256; their replies are checked by the replay, which rounds as the server)."""


@dataclass(frozen=True)
class Config:
    """One parameter-server job."""

    strategy: str
    servers: int
    numel: int
    dtype: torch.dtype = torch.float32

    def __str__(self) -> str:
        return f"{self.strategy} servers={self.servers} numel={self.numel} {self.dtype}"


def draw_configs(world_size: int, seed: int, count: int) -> list[Config]:
    """``count`` configs for ``world_size`` ranks: every strategy with every server count, in a
    seeded order (cycling when ``count`` exceeds them), each with a drawn size and dtype."""
    choose = random.Random(seed)
    combos = [(name, servers) for name in STRATEGIES for servers in range(world_size)]
    choose.shuffle(combos)
    configs = []
    for i in range(count):
        name, servers = combos[i % len(combos)]
        numel = choose.choice([n for n in NUMELS if n >= servers])
        configs.append(Config(name, servers, numel, choose.choice(DTYPES)))
    return configs


@dataclass
class Event:
    """One request of one worker and what came back."""

    kind: str
    call: int
    versions: list[int]
    """The version of every shard the reply carried."""
    sent: torch.Tensor | None = None
    """The pushed update or the exchanged parameters (the full flat vector)."""
    reply: torch.Tensor | None = None
    """The reply's flat vector: fresh parameters, elastic difference, pulled or saved ones."""
    velocity: torch.Tensor | None = None
    read: list[int] | None = None
    """The versions a push says its update was computed at."""
    staleness: int | None = None
    error: str = ""
    """What went wrong with a rejected request ("" when it was rejected as it must be)."""


class _Params(nn.Module):
    """``numel`` parameters in one or two tensors (so the flat vector joins several)."""

    def __init__(self, numel: int, dtype: torch.dtype, generator: torch.Generator) -> None:
        super().__init__()
        second = numel // 3
        self.first = nn.Parameter(_ints(generator, numel - second, dtype))
        self.second = nn.Parameter(_ints(generator, second, dtype)) if second else None


def _ints(generator: torch.Generator, numel: int, dtype: torch.dtype) -> torch.Tensor:
    return torch.randint(-8, 9, (numel,), generator=generator).to(dtype)


def _build(config: Config, seed: int) -> ParameterServerStrategy:
    model = _Params(config.numel, config.dtype, torch.Generator().manual_seed(seed))
    optimizer = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    extra: dict[str, Any] = {"alpha": ALPHA} if STRATEGIES[config.strategy].rule == "easgd" \
        else {}
    if config.strategy == "async-msgd":
        extra["momentum"] = MOMENTUM
    return STRATEGIES[config.strategy](model, optimizer, servers=config.servers,
                                       timeout_s=TIMEOUT_S, **extra)


def worker_calls(worker: int, workers: int, calls: int) -> int:
    """Requests worker ``worker`` of ``workers`` sends before DONE: from 0 (the first, when there
    are several) up to ``calls`` (the last), so workers finish, and close their groups, while
    others are still pushing."""
    return calls if workers == 1 else calls * worker // (workers - 1)


def _work(strategy: ParameterServerStrategy, seed: int, index: int, rank: int,
          calls: int) -> list[Event]:
    """Send this worker's share of ``calls`` random requests (:func:`worker_calls`), then DONE;
    return what was sent and received."""
    link, flat = strategy.link, strategy.flat
    choose = random.Random(f"{seed}:{index}:{rank}")
    generator = torch.Generator().manual_seed(seed * 1009 + index * 31 + rank)
    events = []
    for call in range(worker_calls(strategy.worker_rank, strategy.num_workers, calls)):
        kind = choose.choice(CALLS[strategy.rule])
        data = _ints(generator, flat.numel(), flat.dtype)
        if kind == "step":
            assert isinstance(strategy, AsyncSGD)
            read = list(strategy.versions)
            offset = 0
            for param in strategy.model.parameters():
                param.grad = data[offset:offset + param.numel()].view_as(param).clone()
                offset += param.numel()
            strategy.step()
            events.append(Event("push", call, list(strategy.versions), data * LR, flat.clone(),
                                read=read))
        elif kind == "push":
            assert isinstance(strategy, AsyncSGD)
            read, out = list(strategy.versions), torch.full_like(flat, float("nan"))
            result = link.push(data, read, out)
            strategy.versions = result.versions
            events.append(Event("push", call, result.versions, data, out, read=read,
                                staleness=result.staleness))
        elif kind == "exchange":
            out = torch.full_like(flat, float("nan"))
            result = link.exchange(data, out)
            events.append(Event("exchange", call, result.versions, data, out,
                                staleness=result.staleness))
        elif kind == "pull":
            out = torch.full_like(flat, float("nan"))
            events.append(Event("pull", call, link.pull(out), reply=out))
        elif kind == "rejected" and isinstance(link, RemoteServers):
            events.append(_rejected(link, strategy, data, call))
        else:
            state = link.state()
            events.append(Event("state", call, state.versions, reply=state.params,
                                velocity=state.velocity))
    strategy.finish()
    return events


def _rejected(link: RemoteServers, strategy: ParameterServerStrategy, data: torch.Tensor,
              call: int) -> Event:
    """A PUSH every server must reject (its ``versions``: those it claimed to have read)."""
    known = list(getattr(strategy, "versions", [0] * len(link.shards)))
    future = [v + 1000 for v in known] if strategy.rule == "sgd" else known
    want = "BAD_VERSION" if strategy.rule == "sgd" else "WRONG_RULE"
    try:
        link.push(data, future, torch.empty_like(strategy.flat))
        error = "accepted"
    except ProtocolError as exc:
        error = "" if str(exc).endswith(f"rejected PUSH: {want}") else str(exc)
    link.broken = None  # every server answered and served on: the link is in step again
    return Event("rejected", call, known, error=error)


def _pauses(strategy: ParameterServerStrategy) -> int:
    """Delays drawn on this rank's wire (the link's and the server's transports)."""
    wires = []
    if strategy.is_worker and isinstance(strategy.link, RemoteServers):
        wires.append(strategy.link.wire)
    if strategy.shard_server is not None:
        wires.append(strategy.shard_server.wire)
    return sum(wire.jitter.pauses for wire in wires if wire.jitter is not None)


def run_config(rank: int, world_size: int, seed: int, index: int, config: Config,
               calls: int) -> dict[str, Any]:
    """Run one job on this rank; on rank 0 return its check, elsewhere only the counts."""
    started = time.perf_counter()
    strategy = _build(config, seed * 7919 + index)
    built = time.perf_counter()
    initial = strategy.flat.clone()
    events = _work(strategy, seed, index, rank, calls) if strategy.is_worker else []
    if not strategy.is_worker:
        strategy.serve()
    server = strategy.shard_server
    final = None if server is None else (
        server.shard.spec, server.shard.params.clone(),
        None if server.shard.velocity is None else server.shard.velocity.clone(),
        server.shard.version, list(server.dropped), server.rejected)
    pauses = _pauses(strategy)
    served = time.perf_counter()
    strategy.close()
    mine = {"rank": rank, "events": events, "final": final, "pauses": pauses}
    gathered: list[Any] = [None] * world_size
    dist.all_gather_object(gathered, mine)
    failures = check(config, initial, gathered) if rank == 0 else []
    return {"failures": [f"config {index} ({config}): {f}" for f in failures],
            "requests": sum(len(g["events"]) + 1 for g in gathered if g["rank"] <
                            world_size - config.servers),
            "kinds": Counter(e.kind for g in gathered for e in g["events"]),
            "pauses": pauses, "seconds": {"build": round(built - started, 3),
                                          "requests": round(served - built, 3),
                                          "close": round(time.perf_counter() - served, 3)}}


def run(rank: int, world_size: int, seed: int, calls: int,
        configs: list[Config] | None = None, count: int = 3) -> dict[str, Any]:
    """Run ``configs`` (default: ``count`` drawn from ``seed``) in turn, ``calls`` requests per
    worker in each; return failures, requests (a worker's request goes to every shard:
    ``shard_requests`` counts each shard's), the configs run, the delays drawn and the time."""
    torch.set_num_threads(1)
    # the server logs every rejection as an error; the check counts them (and any drop) instead
    logging.getLogger("scaledl.strategies.parameter_server.server").setLevel(logging.CRITICAL)
    jobs = draw_configs(world_size, seed, count) if configs is None else configs
    failures, requests, shard_requests, pauses, seconds = [], 0, 0, [], []
    kinds: Counter[str] = Counter()
    for index, config in enumerate(jobs):
        result = run_config(rank, world_size, seed, index, config, calls)
        failures += result["failures"]
        requests += result["requests"]
        kinds.update(result["kinds"])
        shard_requests += result["requests"] * max(1, config.servers)
        pauses.append(result["pauses"])
        seconds.append(result["seconds"])
    return {"failures": failures, "requests": requests, "shard_requests": shard_requests,
            "kinds": dict(kinds), "pauses": pauses, "configs": [str(c) for c in jobs],
            "seconds": seconds}


# -- the check ------------------------------------------------------------------------------------
def check(config: Config, initial: torch.Tensor, gathered: list[dict[str, Any]]) -> list[str]:
    """Every way the gathered requests and replies can be wrong, as one line each."""
    cls = STRATEGIES[config.strategy]
    specs = shard_specs(config.numel, max(1, config.servers))
    events = [(g["rank"], e) for g in gathered for e in g["events"]]
    finals = {g["final"][0].index: g["final"] for g in gathered if g["final"] is not None}
    failures = _check_versions(gathered, len(specs))
    failures += [f"rank {rank} call {e.call}: a request the server must reject: {e.error}"
                 for rank, e in events if e.kind == "rejected" and e.error]
    rejected = sum(e.kind == "rejected" for _, e in events)
    for spec in specs:
        if spec.index not in finals:
            failures.append(f"no rank reported shard {spec.index}")
            continue
        failures += _check_shard(cls, spec, initial, events, finals[spec.index], rejected)
    if cls.rule == "sgd":
        for rank, event in events:
            if event.staleness is not None and event.read is not None:
                want = max(v - 1 - r for v, r in zip(event.versions, event.read))
                if event.staleness != want:
                    failures.append(f"rank {rank} call {event.call}: staleness "
                                    f"{event.staleness}, expected {want}")
    elif cls.locked:
        failures += [f"rank {rank} call {e.call}: a locked exchange reported staleness "
                     f"{e.staleness}" for rank, e in events if e.staleness not in (None, 0)]
    if cls.rule == "sgd" and cls is not AsyncMSGD and initial.dtype in EXACT_SUMS:
        updates = [e.sent for _, e in events if e.kind == "push" and e.sent is not None]
        total = torch.stack(updates).sum(0) if updates else torch.zeros_like(initial)
        final = torch.cat([finals[s.index][1] for s in specs if s.index in finals])
        if cls.locked and final.numel() == initial.numel() and not torch.equal(
                final, initial - total):
            failures.append("the final parameters are not the initial ones less every update")
    return failures


def _check_versions(gathered: list[dict[str, Any]], shards: int) -> list[str]:
    """Each worker's versions of every shard never go back; updates advance them."""
    failures = []
    for g in gathered:
        last = [0] * shards
        for event in g["events"]:
            if event.kind == "rejected":
                continue  # its reply is an ERROR, which carries no versions
            if len(event.versions) != shards:
                failures.append(f"rank {g['rank']} call {event.call}: {len(event.versions)} "
                                f"versions for {shards} shards")
                continue
            grew = all(v > was for v, was in zip(event.versions, last))
            if any(v < was for v, was in zip(event.versions, last)) or (
                    event.kind in ("push", "exchange") and not grew):
                failures.append(f"rank {g['rank']} call {event.call} ({event.kind}): versions "
                                f"{event.versions} after {last}")
            last = list(event.versions)
    return failures


def _check_shard(cls: type[ParameterServerStrategy], spec: ShardSpec, initial: torch.Tensor,
                 events: list[tuple[int, Event]], final: tuple[Any, ...],
                 rejections: int) -> list[str]:
    """Replay shard ``spec``'s updates in version order; compare every reply and its end."""
    _, params_end, velocity_end, version_end, dropped, rejected = final
    failures = [] if not dropped and rejected == rejections else [
        f"shard {spec.index}: server dropped {dropped}, rejected {rejected} requests of the "
        f"{rejections} it had to"]
    applied: dict[int, tuple[int, Event]] = {}
    for rank, event in events:
        if event.kind in ("push", "exchange"):
            version = event.versions[spec.index]
            if version in applied:
                failures.append(f"shard {spec.index}: version {version} given to rank "
                                f"{applied[version][0]} and rank {rank}")
            applied[version] = (rank, event)
    count = len(applied)
    if sorted(applied) != list(range(1, count + 1)) or version_end != count:
        failures.append(f"shard {spec.index}: {count} updates carry versions "
                        f"{sorted(applied)[:8]}..., the shard ends at version {version_end}")
        return failures
    if not cls.locked:
        return failures  # Hogwild: values may lose updates or tear, by design
    part = slice(spec.offset, spec.offset + spec.numel)
    params = initial[part].clone()
    momentum = cls.rule == "sgd" and cls is AsyncMSGD
    velocity = torch.zeros_like(params) if momentum else None
    history = [(params.clone(), None if velocity is None else velocity.clone())]
    for version in range(1, count + 1):
        rank, event = applied[version]
        assert event.sent is not None and event.reply is not None
        sent = event.sent[part]
        if cls.rule == "sgd":
            if velocity is not None:
                velocity.mul_(MOMENTUM).add_(sent)
                params.sub_(velocity)
            else:
                params.sub_(sent)
            want = params
        else:
            want = elastic_difference(sent, params, ALPHA)
            params.add_(want)
        if not torch.equal(event.reply[part], want):
            failures.append(f"shard {spec.index} version {version}: the {event.kind} reply to "
                            f"rank {rank} call {event.call} differs from the replay")
        history.append((params.clone(), None if velocity is None else velocity.clone()))
    for rank, event in events:
        if event.kind not in ("pull", "state"):
            continue
        version = event.versions[spec.index]
        assert event.reply is not None
        if version > count:
            failures.append(f"shard {spec.index}: rank {rank} read version {version} of "
                            f"{count}")
            continue
        want_params, want_velocity = history[version]
        if not torch.equal(event.reply[part], want_params):
            failures.append(f"shard {spec.index}: rank {rank} call {event.call} {event.kind} "
                            f"at version {version} read other parameters")
        if event.kind == "state" and want_velocity is not None and (
                event.velocity is None or not torch.equal(event.velocity[part], want_velocity)):
            failures.append(f"shard {spec.index}: rank {rank} call {event.call} state at "
                            f"version {version} read another momentum")
    if not torch.equal(params_end, params) or (
            velocity is not None and not torch.equal(velocity_end, velocity)):
        failures.append(f"shard {spec.index}: final state differs from the replay")
    return failures
