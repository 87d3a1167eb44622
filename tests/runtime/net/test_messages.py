"""The control plane's typed messages (runtime/net/messages.py): what the runtime sends
round-trips through them, and only a user's own keys are pickled."""

from __future__ import annotations

import pytest
from clamor.runtime.net import messages
from clamor.runtime.net.proto import clamor_pb2 as pb

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
