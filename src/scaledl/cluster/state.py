"""Where live clusters are recorded, so ``scaledl cluster down`` and ``list`` find them.

One JSON file per cluster in :func:`state_dir` (``/run/scaledl/clusters``, or
``$SCALEDL_CLUSTER_DIR``).  The record is written *before* the first namespace is created, so a
crash half-way through creation still leaves something ``down`` can clean.  Allocation of a name
and a subnet happens under an exclusive ``flock`` on the directory's lock file, so two
``scaledl cluster up`` started together get different names and subnets.
"""

from __future__ import annotations

import fcntl
import json
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

from scaledl.cluster.spec import MAX_SUBNETS, ClusterSpec, check_name, new_name

__all__ = ["ClusterRecord", "state_dir", "allocate", "exists", "load", "load_all", "load_all_known",
           "known_dirs", "save", "remove", "STATE_ENV", "DEFAULT_STATE_DIR", "DIRECTORIES_FILE"]

STATE_ENV = "SCALEDL_CLUSTER_DIR"
"""Environment variable naming the directory of cluster records."""
DEFAULT_STATE_DIR = "/run/scaledl/clusters"
"""Cluster records when :data:`STATE_ENV` is unset (``/run`` is emptied at boot, as are netns)."""
DIRECTORIES_FILE = "/run/scaledl/record-dirs"
"""Every record directory a cluster was allocated in since boot, one per line, so that
``cluster down --all`` in one directory leaves the namespaces recorded in another alone."""


@dataclass
class ClusterRecord:
    """A cluster as recorded on disk: its spec and who owns it."""

    spec: ClusterSpec
    """The cluster."""
    owner_pid: int
    """Process that created it."""
    ephemeral: bool
    """True for ``cluster run --hosts``: its owner tears it down; stale once the owner is gone."""
    created: float
    """Creation time (seconds since the epoch)."""
    status: str = "creating"
    """``creating`` until every command succeeded, then ``up``."""

    @property
    def stale(self) -> bool:
        """An ephemeral cluster whose owner has exited, or a creation that never finished."""
        return (self.ephemeral or self.status != "up") and not _alive(self.owner_pid)

    def to_json(self) -> str:
        """The record as JSON text."""
        data = asdict(self)
        return json.dumps(data, indent=1, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> ClusterRecord:
        """Parse :meth:`to_json`'s output."""
        data = json.loads(text)
        spec = ClusterSpec(**data.pop("spec"))
        return cls(spec=spec, **data)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def state_dir() -> Path:
    """The directory of cluster records (created on first use)."""
    given = os.environ.get(STATE_ENV)
    path = Path(given or DEFAULT_STATE_DIR)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        where = f"{STATE_ENV}={given}" if given else f"the default {path}"
        raise ValueError(f"cluster records cannot be kept in {where} ({error.strerror}); "
                         f"set {STATE_ENV} to a directory this user can write") from None
    return path


@contextmanager
def _locked() -> Iterator[Path]:
    directory = state_dir()
    with open(directory / ".lock", "a+") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield directory
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _path(directory: Path, name: str) -> Path:
    return directory / f"{check_name(name)}.json"


def exists(name: str) -> bool:
    """Whether cluster ``name`` is recorded in :func:`state_dir`."""
    return _path(state_dir(), name).exists()


def load(name: str) -> ClusterRecord:
    """The record of cluster ``name``; ``ValueError`` if there is none or it is unreadable."""
    path = _path(state_dir(), name)
    if not path.exists():
        known = ", ".join(r.spec.name for r in load_all()) or "none"
        raise ValueError(
            f"no cluster named {name!r} is recorded in {path.parent} (clusters: {known}); "
            "create it with 'scaledl cluster up' or see 'scaledl cluster list'"
        )
    try:
        return ClusterRecord.from_json(path.read_text())
    except (ValueError, TypeError, KeyError) as error:
        raise ValueError(f"cluster record {path} is unreadable ({error}); delete it, then "
                         "'scaledl cluster down --all' removes its namespaces") from None


def load_all() -> list[ClusterRecord]:
    """Every recorded cluster, oldest first (unreadable files are skipped)."""
    records = []
    for path in sorted(state_dir().glob("*.json")):
        try:
            records.append(ClusterRecord.from_json(path.read_text()))
        except (ValueError, TypeError, KeyError):
            continue
    return sorted(records, key=lambda r: r.created)


def known_dirs() -> list[Path]:
    """This record directory, the default one and every registered one that still exists."""
    paths = [state_dir(), Path(DEFAULT_STATE_DIR)]
    try:
        paths += [Path(line) for line in Path(DIRECTORIES_FILE).read_text().splitlines() if line]
    except OSError:
        pass
    unique: dict[str, Path] = {}
    for path in paths:
        if path.is_dir():
            unique.setdefault(str(path.resolve()), path)
    return list(unique.values())


def load_all_known() -> list[ClusterRecord]:
    """The records of every directory in :func:`known_dirs`."""
    records = []
    for directory in known_dirs():
        for path in sorted(directory.glob("*.json")):
            try:
                records.append(ClusterRecord.from_json(path.read_text()))
            except (OSError, ValueError, TypeError, KeyError):
                continue
    return records


def _register(directory: Path) -> None:
    """Add ``directory`` to :data:`DIRECTORIES_FILE` (dropping ones that are gone); best effort."""
    registry = Path(DIRECTORIES_FILE)
    try:
        registry.parent.mkdir(parents=True, exist_ok=True)
        with open(registry, "a+") as file:
            fcntl.flock(file, fcntl.LOCK_EX)
            file.seek(0)
            lines = {line for line in file.read().splitlines() if line and Path(line).is_dir()}
            lines.add(str(directory.resolve()))
            file.seek(0)
            file.truncate()
            file.write("".join(f"{line}\n" for line in sorted(lines)))
    except OSError:
        return


def save(record: ClusterRecord) -> None:
    """Write ``record`` atomically."""
    path = _path(state_dir(), record.spec.name)
    temporary = path.with_suffix(f".tmp{os.getpid()}")
    temporary.write_text(record.to_json() + "\n")
    temporary.replace(path)


def remove(name: str) -> None:
    """Forget cluster ``name`` (no error if it is not recorded)."""
    _path(state_dir(), name).unlink(missing_ok=True)


def allocate(
    hosts: int, rate: int | None, shaper: str, name: str | None, ephemeral: bool,
    taken_namespaces: set[str] | None = None,
) -> ClusterRecord:
    """Reserve a unique name and subnet and record the cluster as ``creating``.

    ``taken_namespaces`` (the namespaces that exist now) makes a name whose namespaces already
    exist count as taken even without a record.
    """
    existing = taken_namespaces or set()
    with _locked() as directory:
        records = load_all()
        names = {r.spec.name for r in records}
        subnets = {r.spec.subnet for r in records}
        free = [s for s in range(MAX_SUBNETS) if s not in subnets]
        if not free:
            raise ValueError(f"all {MAX_SUBNETS} cluster subnets are in use; remove clusters with "
                             "'scaledl cluster down --all'")
        chosen = _choose_name(name, names, existing)
        spec = ClusterSpec(name=chosen, hosts=hosts, rate=rate, subnet=free[0], shaper=shaper)
        record = ClusterRecord(spec, os.getpid(), ephemeral, time.time())
        save(record)
        _register(directory)
        return record


def _choose_name(name: str | None, names: set[str], namespaces: set[str]) -> str:
    def taken(candidate: str) -> bool:
        prefix = ClusterSpec(candidate, 1, None, 0).switch_namespace.removesuffix("-sw")
        return candidate in names or any(ns.startswith(prefix + "-") for ns in namespaces)

    if name is not None:
        if taken(check_name(name)):
            raise ValueError(f"cluster name {name!r} is taken; choose another --name or remove it "
                             f"with 'scaledl cluster down {name}'")
        return name
    for _ in range(100):
        candidate = new_name()
        if not taken(candidate):
            return candidate
    raise ValueError("could not find a free cluster name; remove old clusters with "
                     "'scaledl cluster down --all'")
