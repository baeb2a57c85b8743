"""What crosses a process boundary of the judge harness: length-prefixed JSON frames and a plain-data codec.

Stdlib only, and no ``from __future__``: this file's source is also sent into the sandbox as the first part of
the judge and candidate server programs (``servers.program``).

The codec is the trust boundary between a candidate and its judge. It carries plain data only: None, bool,
int, float, complex, str, bytes, and list/tuple/dict/set/frozenset of these, each of *exactly* that type (a
subclass of ``int`` with an always-true ``__eq__`` is refused when encoding, and cannot be produced by
decoding). JSON gives null/bool/int/float/str/list natively; every JSON object is one tag:
``{"t": [...]}`` tuple, ``{"d": [[k, v], ...]}`` dict, ``{"s": [...]}`` set, ``{"f": [...]}`` frozenset,
``{"b": "hex"}`` bytes, ``{"c": [re, im]}`` complex, ``{"i": "hex"}`` an int too long for a JSON number
(Python refuses decimal conversions of ints over 4300 digits; hex has no such limit and is linear). Decoding
validates every node; anything else is ``BadData``. No pickle, no marshal, no eval: nothing in a frame can
name code.
"""

import json
import re
import socket
import struct
import time

FRAME_HEADER = struct.Struct(">I")
MAX_FRAME_BYTES = 64 << 20
MAX_FDS = 4


class BadData(Exception):
    """A frame or value that is not what the protocol allows."""


class ChannelClosed(Exception):
    """The other side closed the connection (or died) before sending a whole frame."""


class ChannelTimeout(Exception):
    """No frame arrived before the deadline."""


# --- plain-data codec ------------------------------------------------------------------------------------
_SCALARS = (type(None), bool, int, float, str)
BIG_INT_BITS = 13000  # about 3900 decimal digits: below the interpreter's 4300-digit limit for str(int)
_HEX_INT = re.compile(r"-?[0-9a-f]+")


def to_plain(value, depth=0):
    """A JSON-ready tree of tagged nodes, or TypeError naming the first value that is not plain data."""
    if depth > 200:
        raise TypeError("value nests deeper than 200 levels")
    kind = type(value)
    if kind is int and value.bit_length() > BIG_INT_BITS:
        return {"i": format(value, "x")}
    if kind in _SCALARS:
        return value
    if kind is list:
        return [to_plain(v, depth + 1) for v in value]
    if kind is tuple:
        return {"t": [to_plain(v, depth + 1) for v in value]}
    if kind is dict:
        return {"d": [[to_plain(k, depth + 1), to_plain(v, depth + 1)] for k, v in value.items()]}
    if kind is set:
        return {"s": [to_plain(v, depth + 1) for v in value]}
    if kind is frozenset:
        return {"f": [to_plain(v, depth + 1) for v in value]}
    if kind is bytes:
        return {"b": value.hex()}
    if kind is complex:
        return {"c": [value.real, value.imag]}
    raise TypeError(f"not plain data: a value of type {kind.__module__}.{kind.__qualname__}")


def from_plain(node, depth=0):
    """The value a tagged tree stands for; BadData for anything the encoder could not have written."""
    if depth > 200:
        raise BadData("value nests deeper than 200 levels")
    kind = type(node)
    if kind in _SCALARS:
        return node
    if kind is list:
        return [from_plain(v, depth + 1) for v in node]
    if kind is not dict or len(node) != 1:
        raise BadData(f"unexpected node of type {kind.__name__}")
    (tag, body), = node.items()
    try:
        if tag == "b" and type(body) is str:
            return bytes.fromhex(body)
        if tag == "i" and type(body) is str and _HEX_INT.fullmatch(body):
            return int(body, 16)
        if type(body) is not list:
            raise BadData(f"tag {tag!r} needs a list")
        if tag == "t":
            return tuple(from_plain(v, depth + 1) for v in body)
        if tag == "s":
            return {from_plain(v, depth + 1) for v in body}
        if tag == "f":
            return frozenset(from_plain(v, depth + 1) for v in body)
        if tag == "d":
            out = {}
            for pair in body:
                if type(pair) is not list or len(pair) != 2:
                    raise BadData("a dict entry must be a [key, value] pair")
                out[from_plain(pair[0], depth + 1)] = from_plain(pair[1], depth + 1)
            return out
        if tag == "c" and len(body) == 2 and all(type(x) in (int, float) for x in body):
            return complex(body[0], body[1])
    except TypeError as exc:  # an unhashable set member or dict key
        raise BadData(str(exc)) from None
    except ValueError as exc:  # bad hex
        raise BadData(str(exc)) from None
    raise BadData(f"unknown tag {tag!r}")


def encode_value(value):
    return json.dumps(to_plain(value), allow_nan=True, separators=(",", ":"))


def decode_value(text):
    try:
        node = json.loads(text)
    except (ValueError, RecursionError) as exc:  # malformed JSON, or an int over the digit limit
        raise BadData(f"not JSON: {str(exc)[:200]}") from None
    return from_plain(node)


# --- frames ----------------------------------------------------------------------------------------------
def send_frame(sock, obj, fds=()):
    """One JSON object, length-prefixed; file descriptors ride on the first chunk (SCM_RIGHTS)."""
    data = json.dumps(obj, allow_nan=True, separators=(",", ":")).encode("utf-8", "surrogatepass")
    if len(data) > MAX_FRAME_BYTES:
        raise BadData(f"frame of {len(data)} bytes exceeds {MAX_FRAME_BYTES}")
    buf = FRAME_HEADER.pack(len(data)) + data
    if fds:
        sent = socket.send_fds(sock, [buf], list(fds))
        buf = buf[sent:]
    if buf:
        sock.sendall(buf)


def _recv_exact(sock, n, deadline):
    chunks, got = [], 0
    while got < n:
        _wait(sock, deadline)
        chunk = sock.recv(min(n - got, 1 << 20))
        if not chunk:
            raise ChannelClosed("connection closed mid-frame" if got else "connection closed")
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


def _wait(sock, deadline):
    if deadline is None:
        sock.settimeout(None)
        return
    left = deadline - time.monotonic()
    if left <= 0:
        raise ChannelTimeout("deadline passed")
    sock.settimeout(left)


def recv_frame(sock, deadline=None, max_bytes=MAX_FRAME_BYTES, want_fds=False):
    """The next JSON object (and, with want_fds, the descriptors sent with it). deadline: time.monotonic()."""
    fds: list = []
    try:
        if want_fds:
            _wait(sock, deadline)
            head, fds, _flags, _addr = socket.recv_fds(sock, FRAME_HEADER.size, MAX_FDS)
            if not head:
                raise ChannelClosed("connection closed")
            if len(head) < FRAME_HEADER.size:
                head += _recv_exact(sock, FRAME_HEADER.size - len(head), deadline)
        else:
            head = _recv_exact(sock, FRAME_HEADER.size, deadline)
        (size,) = FRAME_HEADER.unpack(head)
        if size > max_bytes:
            raise BadData(f"frame of {size} bytes exceeds the limit of {max_bytes}")
        data = _recv_exact(sock, size, deadline)
    except TimeoutError:
        raise ChannelTimeout("deadline passed") from None
    except (ConnectionError, OSError) as exc:
        if isinstance(exc, (ChannelClosed, ChannelTimeout, BadData)):
            raise
        raise ChannelClosed(f"connection failed: {exc}") from None
    try:
        obj = json.loads(data.decode("utf-8", "surrogatepass"))
    except (ValueError, RecursionError) as exc:
        raise BadData(f"frame is not JSON: {str(exc)[:200]}") from None
    if type(obj) is not dict:
        raise BadData("a frame must be a JSON object")
    return (obj, fds) if want_fds else obj
