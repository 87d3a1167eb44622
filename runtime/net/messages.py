"""Conversions between the runtime's values and the control plane's typed messages.

The control plane (proto/clamor.proto) pickles only user values and programs; what the
runtime itself sends travels as typed messages, built and read here:

- partition keys (:func:`encode_key` / :func:`decode_key`): the runtime's keys are a
  kind and integers, e.g. ``("ds", 7, 3)``; a key of another shape (one a user gave
  ``Cluster.put`` or ``TaskContext.put``: any hashable) travels pickled, as user values do;
- a worker's paging configuration (:func:`paging_config_message` / :func:`paging_config`),
  the part of ``WorkerConfig`` the driver's pager fills in;
- what a worker announces when ready (:func:`worker_info_message` / :func:`worker_info`);
- a worker's stats (:func:`worker_stats_message` / :func:`worker_stats`): counters by name;
- a page invalidation (:func:`invalidation` / :func:`invalidated_pages`): the written pages
  packed as little-endian uint64s (tens of thousands a stage when the driver rewrites a
  large array: as varints they took milliseconds to build and to read, per worker).
"""

from __future__ import annotations

import operator
import pickle
from collections.abc import Mapping
from typing import Any

import numpy as np
from clamor.runtime.credentials import TLSMaterial
from clamor.runtime.net.proto import clamor_pb2 as pb
from clamor.runtime.paging.paging_api import PagingConfig, PagingInfo, PagingKind
from clamor.runtime.stage import PartitionKey

_INT64 = (-(2**63), 2**63 - 1)


def _typed(key: PartitionKey) -> bool:
    """Whether ``key`` has the runtime's shape: a tuple of a string and int64 integers."""
    if type(key) is not tuple or not key or type(key[0]) is not str:
        return False
    low, high = _INT64
    return all(type(n) is int and low <= n <= high for n in key[1:])


def encode_key(key: PartitionKey) -> pb.PartitionKey:
    """``key`` as a :class:`pb.PartitionKey` (pickled only if it is not a kind and integers)."""
    if _typed(key):
        return pb.PartitionKey(kind=key[0], numbers=key[1:])
    return pb.PartitionKey(pickled=pickle.dumps(key, protocol=pickle.HIGHEST_PROTOCOL))


def decode_key(message: pb.PartitionKey) -> PartitionKey:
    """The key :func:`encode_key` encoded (a pickled one is unpickled: a user's key)."""
    if message.pickled:
        return pickle.loads(message.pickled)
    return (message.kind, *message.numbers)


def key_bytes(key: PartitionKey) -> bytes:
    """``key`` serialized, for a wire of its own (runtime/storage/bulk.py)."""
    return encode_key(key).SerializeToString()


def key_from_bytes(data: bytes) -> PartitionKey:
    """The key :func:`key_bytes` serialized."""
    return decode_key(pb.PartitionKey.FromString(data))


# --- a worker's configuration, info and stats ---------------------------------------------

_PAGING_KINDS = {PagingKind.NONE: pb.PAGING_NONE, PagingKind.ARENA: pb.PAGING_ARENA}
_READ_SETS = {"resident": pb.READ_SETS_RESIDENT, "exact": pb.READ_SETS_EXACT}
_SPILL = {"peer": pb.SPILL_PEER, "disk": pb.SPILL_DISK}


def _lookup(table: Mapping[Any, int], value: int, what: str) -> Any:
    """The key of ``table`` whose message value is ``value`` (``ValueError`` if none: a
    newer peer's choice this side does not know)."""
    for key, number in table.items():
        if number == value:
            return key
    raise ValueError(f"unknown {what} {value} (a newer driver?)")


def spill_message(spill: str) -> int:
    """A spill policy (``"peer"`` or ``"disk"``) as a ``SpillTarget``."""
    return _SPILL[spill]


def spill_policy(value: int) -> str:
    """The spill policy a ``SpillTarget`` names."""
    return _lookup(_SPILL, value, "spill target")


def paging_config_message(config: PagingConfig) -> pb.PagingConfig:
    """``config`` as the ``WorkerConfig.paging`` message."""
    message = pb.PagingConfig(
        kind=_PAGING_KINDS[config.kind], arena_size=config.arena_size, page_size=config.page_size,
        driver_host=config.driver_host, driver_page_port=config.driver_page_port,
        bind_host=config.bind_host, readahead=config.readahead, read_sets=_READ_SETS[config.read_sets],
        shm_arena_path=config.shm_arena_path, shm_state_path=config.shm_state_path,
        shm_zap_path=config.shm_zap_path, page_cache_bytes=config.page_cache_bytes,
    )  # fmt: skip
    if config.tls is not None:
        tls = config.tls
        message.tls.CopyFrom(pb.TLSMaterial(ca=tls.ca.decode(), cert=tls.cert.decode(), key=tls.key.decode()))
    return message


def paging_config(message: pb.PagingConfig) -> PagingConfig:
    """The :class:`PagingConfig` a ``WorkerConfig.paging`` message carries (``ValueError``
    for a paging kind or read-set mode this worker does not know)."""
    tls = None
    if message.HasField("tls"):
        tls = TLSMaterial(message.tls.ca.encode(), message.tls.cert.encode(), message.tls.key.encode())
    return PagingConfig(
        kind=_lookup(_PAGING_KINDS, message.kind, "paging kind"), arena_size=message.arena_size,
        page_size=message.page_size, driver_host=message.driver_host,
        driver_page_port=message.driver_page_port, bind_host=message.bind_host,
        readahead=message.readahead, read_sets=_lookup(_READ_SETS, message.read_sets, "read-set mode"),
        tls=tls, shm_arena_path=message.shm_arena_path, shm_state_path=message.shm_state_path,
        shm_zap_path=message.shm_zap_path, page_cache_bytes=message.page_cache_bytes,
    )  # fmt: skip


def worker_info_message(info: PagingInfo, bulk_port: int = 0) -> pb.WorkerInfo:
    """What a worker announces: its paging's ``info`` and its bulk server's port (0: none)."""
    return pb.WorkerInfo(host=info.host, page_port=info.page_port, shm=info.shm, zero_copy=info.zero_copy,
                         tls=info.tls, cache_limit_pages=info.cache_limit_pages, bulk_port=bulk_port)  # fmt: skip


def worker_info(message: pb.WorkerInfo) -> tuple[PagingInfo, int]:
    """The paging info and bulk port a ``WorkerInfo`` message carries."""
    info = PagingInfo(host=message.host, page_port=message.page_port, shm=message.shm,
                      zero_copy=message.zero_copy, tls=message.tls, cache_limit_pages=message.cache_limit_pages)  # fmt: skip
    return info, message.bulk_port


def worker_stats_message(stats: Mapping[str, Any]) -> pb.WorkerStats:
    """A worker's stats dict as a ``WorkerStats`` message: ``id``, ``pid`` and ``spill``
    have fields of their own, every other entry must be an integer (``TypeError``)."""
    counters = {}
    for name, value in stats.items():
        if name in ("id", "pid", "spill"):
            continue
        try:
            counters[name] = operator.index(value)  # ints, bools and numpy integers
        except TypeError:
            raise TypeError(f"worker stat {name!r} is not an integer: {value!r}") from None
    return pb.WorkerStats(id=stats.get("id", 0), pid=stats.get("pid", 0), spill=stats.get("spill", ""),
                          counters=counters)  # fmt: skip


def worker_stats(message: pb.WorkerStats) -> dict[str, Any]:
    """The stats dict a ``WorkerStats`` message carries (``spill`` only if it was set)."""
    stats: dict[str, Any] = {"id": message.id, "pid": message.pid, **message.counters}
    if message.spill:
        stats["spill"] = message.spill
    return stats


def invalidation(epoch: int, pages: Any) -> pb.InvalidateRequest:
    """The driver wrote ``pages`` (page numbers: an array or a sequence), sealed for ``epoch``."""
    return pb.InvalidateRequest(epoch=epoch, pages=np.asarray(pages, "<u8").tobytes())


def invalidated_pages(message: pb.InvalidateRequest) -> np.ndarray:
    """The pages of an :func:`invalidation` (uint64; ``ValueError`` if not whole uint64s)."""
    if len(message.pages) % 8:
        raise ValueError(f"an invalidation's pages are {len(message.pages)} bytes, not whole uint64s")
    return np.frombuffer(message.pages, "<u8")
