"""Conversions between the runtime's values and the control plane's typed messages.

The control plane (proto/clamor.proto) pickles only user values and programs; what the
runtime itself sends travels as typed messages, built and read here:

- partition keys (:func:`encode_key` / :func:`decode_key`): the runtime's keys are a
  kind and integers, e.g. ``("ds", 7, 3)``; a key of another shape (one a user gave
  ``Cluster.put`` or ``TaskContext.put``: any hashable) travels pickled, as user values do.
"""

from __future__ import annotations

import pickle

from clamor.runtime.net.proto import clamor_pb2 as pb
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
