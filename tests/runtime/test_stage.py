"""TaskSpec, the value a stage's task is: its hand-written constructor (faster than a
frozen dataclass's generated one) takes exactly the dataclass's fields and defaults, and
the spec stays an immutable, hashable value."""

from __future__ import annotations

import dataclasses
import inspect

import pytest

from clamor.runtime.stage import TaskSpec


def test_the_constructor_takes_every_field_in_order_with_its_default() -> None:
    params = list(inspect.signature(TaskSpec.__init__).parameters.values())[1:]
    fields = dataclasses.fields(TaskSpec)
    assert [p.name for p in params] == [f.name for f in fields]
    assert [p.default for p in params] == [
        inspect.Parameter.empty if f.default is dataclasses.MISSING else f.default for f in fields
    ]


def test_a_spec_is_an_immutable_hashable_value() -> None:
    spec = TaskSpec(3, inputs=("k",), reads=((0, 4096),), payload=b"x")
    assert spec == TaskSpec(3, ("k",), None, True, None, ((0, 4096),), (), b"x")
    assert hash(spec) == hash(TaskSpec(3, inputs=("k",), reads=((0, 4096),), payload=b"x"))
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.index = 4  # type: ignore[misc]
    moved = dataclasses.replace(spec, worker=1)
    assert (moved.worker, moved.index, moved.payload, spec.worker) == (1, 3, b"x", None)
