"""The control plane pickles only user values and programs: every ``bytes`` field of
runtime/net/proto/clamor.proto is one of those, or packed numbers that are no pickle.
A new ``bytes`` field fails here until it is listed with its reason."""

from __future__ import annotations

import re
from pathlib import Path

from clamor.runtime.net.proto import clamor_pb2 as pb
from google.protobuf.descriptor import FieldDescriptor

PROTO = Path(__file__).resolve().parents[3] / "runtime" / "net" / "proto" / "clamor.proto"

#: Pickles the control plane carries on purpose: what a user's code gives or runs.
PICKLED = {
    "TaskReport.value": "a task's result: a user value",
    "TaskReport.accumulators": "accumulator updates: user values",
    "TaskReport.error": "the exception a user's task raised",
    "Chunk.data": "a partition's value: a user value",
    "LaunchRequest.program": "a stage's program",
    "Assignment.payloads": "a task's call: a user's function and arguments",
    "PartitionKey.pickled": "a key of a user's choosing (Cluster.put, TaskContext.put): any hashable",
}
#: Bytes that are numbers packed little-endian, not pickles.
PACKED = {
    "TaskReport.read_runs": "a read set as runs (runtime/paging/read_sets.py)",
    "LineageNode.read_runs": "a read set as runs",
    "PageSnapshot.requests": "uint64 per page",
    "PageSnapshot.driver_bytes": "uint64 per page",
    "PageSnapshot.peer_bytes": "uint64 per page",
    "PageSnapshot.holders": "uint32 per page",
    "PageSnapshot.version": "uint32 per page",
    "InvalidateRequest.pages": "uint64 per written page (runtime/net/messages.py)",
}


def bytes_fields(text: str) -> set[str]:
    """``Message.field`` for every ``bytes`` field of the schema ``text`` (``repeated``,
    ``optional`` or in a ``oneof``; map values are checked apart), nested messages named
    by their innermost message."""
    tokens = re.findall(r"[A-Za-z_][\w.]*|<[^>]*>|[{};=]", re.sub(r"//[^\n]*", "", text))
    found, scopes = set(), []  # scopes: (keyword, name) of the blocks we are in
    for i, token in enumerate(tokens):
        if token == "{":
            scopes.append((tokens[i - 2], tokens[i - 1]) if i >= 2 else ("", ""))
        elif token == "}":
            scopes.pop()
        elif token == "bytes" and i + 2 < len(tokens) and tokens[i + 2] == "=":
            message = next(name for keyword, name in reversed(scopes) if keyword == "message")
            found.add(f"{message}.{tokens[i + 1]}")
    return found


def test_the_parser_finds_bytes_fields_and_only_them():
    sample = """
    message A { bytes x = 1; repeated bytes y = 2; // bytes z = 3;
      string bytes_like = 4; map<string, bytes> m = 5; optional bytes w = 6;
      oneof o { bytes v = 7; uint32 u = 8; }
      message Inner { bytes i = 1; } }
    enum E { E_ZERO = 0; }
    message B { uint64 n = 1; }
    """
    assert bytes_fields(sample) == {"A.x", "A.y", "A.w", "A.v", "Inner.i"}


def test_the_parser_agrees_with_the_generated_module():
    def walk(message):
        yield message
        for nested in message.nested_types:
            yield from walk(nested)

    generated = {
        f"{m.name}.{f.name}"
        for top in pb.DESCRIPTOR.message_types_by_name.values()
        for m in walk(top)
        if not m.GetOptions().map_entry
        for f in m.fields
        if f.type == FieldDescriptor.TYPE_BYTES
    }
    assert bytes_fields(PROTO.read_text()) == generated


def test_no_field_is_pickled_but_user_values_and_programs():
    fields = bytes_fields(PROTO.read_text())
    assert fields - PICKLED.keys() - PACKED.keys() == set(), "a bytes field to type, or to list with its reason"
    assert (PICKLED.keys() | PACKED.keys()) - fields == set(), "listed fields the schema no longer has"


def test_no_map_carries_bytes():
    assert not re.search(r"map<\s*\w+\s*,\s*bytes\s*>", re.sub(r"//[^\n]*", "", PROTO.read_text()))
