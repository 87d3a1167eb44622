"""The control plane's typed messages (runtime/net/messages.py): partition keys, a
worker's configuration, info and stats round-trip through them, and only a user's own
keys are pickled."""

from __future__ import annotations

import numpy as np
import pytest
from clamor.runtime.credentials import TLSMaterial
from clamor.runtime.net import messages
from clamor.runtime.net.proto import clamor_pb2 as pb
from clamor.runtime.paging.paging_api import PagingConfig, PagingInfo, PagingKind
from clamor.runtime.worker import process

#: The keys the runtime makes (runtime/data, runtime/worker/tasks.py).
RUNTIME_KEYS = [("ds", 7, 3), ("par", 2, 0), ("restored", 9, 1), ("shuffle", 1, 4, 0, 2, 5),
                ("agg", 3, 1, 0), ("reply", 2**40), ("x", -(2**63), 2**63 - 1), ("solo",)]  # fmt: skip


@pytest.mark.parametrize("key", RUNTIME_KEYS)
def test_the_runtimes_keys_travel_typed(key):
    message = messages.encode_key(key)
    assert not message.pickled and message.kind == key[0] and list(message.numbers) == list(key[1:])
    wire = pb.PartitionKey.FromString(message.SerializeToString())
    assert messages.decode_key(wire) == key and type(messages.decode_key(wire)) is tuple
    assert messages.key_from_bytes(messages.key_bytes(key)) == key


@pytest.mark.parametrize("key", ["a", 3, ("t", "driver"), (1, 2), (), ("ds", 1.5), ("ds", True),
                                 ("big", 2**63), frozenset({1}), ("nested", (1, 2))])  # fmt: skip
def test_a_users_key_of_another_shape_travels_pickled_and_comes_back_equal(key):
    message = messages.encode_key(key)
    assert message.pickled and not message.kind and not message.numbers
    back = messages.decode_key(pb.PartitionKey.FromString(message.SerializeToString()))
    assert back == key and type(back) is type(key)


def test_an_unset_key_field_is_not_a_key():
    assignment = pb.Assignment(attempt_id=1)
    assert not assignment.HasField("output")
    assignment.output.CopyFrom(messages.encode_key(("ds", 1, 0)))
    assert messages.decode_key(pb.Assignment.FromString(assignment.SerializeToString()).output) == ("ds", 1, 0)


# --- a worker's configuration, info and stats ------------------------------------------------

PEM = b"-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"


def test_a_worker_configuration_round_trips_through_the_typed_messages():
    paging = PagingConfig(
        kind=PagingKind.ARENA, arena_size=2**35, page_size=2**18, driver_host="10.0.0.1",
        driver_page_port=4567, bind_host="10.0.0.2", readahead=False, read_sets="exact",
        tls=TLSMaterial(PEM, PEM, PEM.replace(b"CERTIFICATE", b"PRIVATE KEY")),
        shm_arena_path="/proc/1/fd/3", shm_state_path="/proc/1/fd/4", shm_zap_path="/proc/1/fd/5",
        page_cache_bytes=3 << 30,
    )  # fmt: skip
    config = pb.WorkerConfig(memory_budget=8 << 30, zero_copy=True, spill=messages.spill_message("disk"),
                             spill_dir="/tmp/clamor-spill-1", task_stream_port=7000, task_stream_unix="clamor-1",
                             paging=messages.paging_config_message(paging))  # fmt: skip
    wire = pb.RegisterReply.FromString(pb.RegisterReply(worker_id=3, config=config).SerializeToString())
    assert wire.worker_id == 3 and wire.config == config
    assert messages.paging_config(wire.config.paging) == paging
    assert messages.spill_policy(wire.config.spill) == "disk"
    assert (wire.config.memory_budget, wire.config.task_stream_unix) == (8 << 30, "clamor-1")


def test_the_default_configuration_builds_no_paging_and_sends_no_tls():
    message = messages.paging_config_message(PagingConfig())
    assert message.kind == pb.PAGING_NONE and not message.HasField("tls")
    assert messages.paging_config(pb.PagingConfig.FromString(message.SerializeToString())) == PagingConfig()
    assert messages.spill_policy(pb.WorkerConfig().spill) == "peer"


def test_a_paging_kind_the_worker_does_not_know_is_refused_not_imported():
    with pytest.raises(ValueError, match="unknown paging kind 7"):
        messages.paging_config(pb.PagingConfig(kind=7))  # a newer driver's choice
    assert set(process.PAGINGS) == set(PagingKind)  # every kind the driver may name is built here


def test_a_workers_info_round_trips():
    info = PagingInfo(host="10.0.0.2", page_port=4321, shm=True, zero_copy=True, tls=False, cache_limit_pages=512)
    wire = pb.ReadyRequest.FromString(
        pb.ReadyRequest(worker_id=1, info=messages.worker_info_message(info, 9999)).SerializeToString()
    )
    assert messages.worker_info(wire.info) == (info, 9999)
    assert messages.worker_info(pb.WorkerInfo()) == (PagingInfo(host=""), 0)


def test_a_workers_stats_round_trip_as_counters():
    stats = {"id": 2, "pid": 1234, "tasks_run": 5, "rss_bytes": 2**40, "spill": "peer", "faults": np.uint64(3),
             "zero": False}  # fmt: skip
    wire = pb.StatsReply.FromString(pb.StatsReply(stats=messages.worker_stats_message(stats)).SerializeToString())
    assert messages.worker_stats(wire.stats) == {**stats, "faults": 3, "zero": 0}
    with pytest.raises(TypeError, match="'ratio' is not an integer"):
        messages.worker_stats_message({"ratio": 0.5})


def test_an_invalidation_carries_its_pages_packed_and_a_torn_one_is_refused():
    pages = np.array([0, 7, 2**40, 2**64 - 1], np.uint64)
    message = messages.invalidation(9, pages)
    assert len(message.pages) == 8 * len(pages)  # 8 bytes a page, not a varint each
    wire = pb.InvalidateRequest.FromString(message.SerializeToString())
    assert wire.epoch == 9 and messages.invalidated_pages(wire).tolist() == pages.tolist()
    assert messages.invalidated_pages(messages.invalidation(3, [5, 6])).tolist() == [5, 6]  # a list too
    with pytest.raises(ValueError, match="not whole uint64s"):
        messages.invalidated_pages(pb.InvalidateRequest(epoch=1, pages=b"\x01" * 12))
