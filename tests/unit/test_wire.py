"""The judge harness's wire: plain data round-trips exactly; nothing else crosses, in either direction."""

from __future__ import annotations

import math
import socket
import struct

import pytest

from codemill.sandbox.wire import (
    BadData,
    ChannelClosed,
    ChannelTimeout,
    decode_value,
    encode_value,
    recv_frame,
    send_frame,
)

PLAIN = [None, True, False, 0, -7, 2**200, 1.5, -0.0, "", "héllo\n\x00", b"\x00\xff", 3 + 4j, [], (), {}, set(),
         frozenset(), [1, (2, 3), {"a": [None]}], {(1, 2): {3, 4}, "k": frozenset({"x"})}, ((),), [[[]]],
         {1: "int key", 2.5: "float key"}]


@pytest.mark.parametrize("value", PLAIN, ids=repr)
def test_plain_data_round_trips_with_its_exact_types(value):
    back = decode_value(encode_value(value))
    assert back == value
    assert _types(back) == _types(value)


def _types(v):
    if isinstance(v, list | tuple | set | frozenset):
        return (type(v), sorted(repr(_types(x)) for x in v))
    if isinstance(v, dict):
        return (dict, sorted(repr((_types(k), _types(x))) for k, x in v.items()))
    return type(v)


def test_nan_and_infinities_cross():
    back = decode_value(encode_value([math.nan, math.inf, -math.inf]))
    assert math.isnan(back[0]) and back[1:] == [math.inf, -math.inf]


class AlwaysEqual(int):
    def __eq__(self, other):
        return True

    __hash__ = int.__hash__


class Sneaky(str):
    pass


@pytest.mark.parametrize("value", [AlwaysEqual(1), [AlwaysEqual(1)], {"k": Sneaky("v")}, object(), len,
                                   iter([1]), bytearray(b"x"), range(3), {1: 2}.keys(), type],
                         ids=lambda v: type(v).__name__)
def test_anything_but_plain_data_is_refused_when_encoding(value):
    with pytest.raises(TypeError, match="not plain data"):
        encode_value(value)


@pytest.mark.parametrize("text", ['{"x": 1}', '{"t": 1}', '{"d": [[1]]}', '{"d": [[[1], 2]]}', '{"s": [[1]]}',
                                  '{"b": "zz"}', '{"c": ["1", 2]}', '{"t": [1], "s": [2]}', "[1,", "nope",
                                  '{"__class__": "os.system"}', "[" * 100000])
def test_decoding_refuses_what_the_encoder_cannot_write(text):
    with pytest.raises(BadData):
        decode_value(text)


def test_deeply_nested_values_are_refused_not_crashed():
    deep: list = []
    for _ in range(300):
        deep = [deep]
    with pytest.raises(TypeError, match="deeper"):
        encode_value(deep)


def test_frames_round_trip_and_reject_bad_or_oversized_frames():
    a, b = socket.socketpair()
    with a, b:
        send_frame(a, {"op": "x", "v": [1, 2]})
        assert recv_frame(b) == {"op": "x", "v": [1, 2]}
        a.sendall(struct.pack(">I", 10) + b"not json!!")
        with pytest.raises(BadData, match="not JSON"):
            recv_frame(b)
        a.sendall(struct.pack(">I", 2) + b"[]")
        with pytest.raises(BadData, match="JSON object"):
            recv_frame(b)
        a.sendall(struct.pack(">I", 1 << 30))
        with pytest.raises(BadData, match="exceeds"):
            recv_frame(b, max_bytes=1 << 20)


def test_a_silent_or_closed_peer_is_a_timeout_or_closed_channel():
    import time

    a, b = socket.socketpair()
    with b:
        with pytest.raises(ChannelTimeout):
            recv_frame(b, deadline=time.monotonic() + 0.05)
        a.sendall(struct.pack(">I", 100) + b"{")
        a.close()
        with pytest.raises(ChannelClosed, match="mid-frame"):
            recv_frame(b)
