"""Property-based fuzzing of the driver's page server (runtime/paging/native/page_server.c).

Over 10,000 malformed or hostile exchanges (hypothesis, derandomized) go to a
real DriverPager: bad headers (magic, version, type, lengths), truncated
messages, broken and partial handshakes, authenticated GETs with out-of-range
pages, epochs, batch counts, flags and aux2 values, HAVEs with bogus fields,
ROWS requests with bad counts, row sizes, lengths and offsets, and random bytes. A model of the protocol predicts every reply byte for byte,
whether the server keeps the connection, and how much the auth_failures and
bad_requests counters move. A smaller batch runs the same properties inside
TLS. Afterwards the server must still serve exactly the arena's bytes.
"""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
import random
import socket
import ssl
import struct

import numpy as np
import pytest
from clamor.runtime.credentials import TLSMaterial
from clamor.runtime.paging import arena
from clamor.runtime.paging import page_client as pc
from clamor.runtime.paging.native import _native
from clamor.runtime.paging.pager import DriverPager
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import clamor

pytestmark = pytest.mark.slow

PAGE = 4096
TOKEN = b"fuzz-cluster-token"
DATA_PAGES = 48
U32, U64 = 2**32 - 1, 2**64 - 1
# Examples per property, (plaintext, TLS): 4,000 plaintext exchanges in all (7,000 took
# 50 s of the suite's 10 minutes on 2 cores, 10,000 took 70 s; derandomized, each run
# covers the same ones).
EXAMPLES = {"requests": (2000, 300), "handshakes": (1000, 150), "raw": (1000, 100)}


@dataclasses.dataclass
class Server:
    pager: DriverPager
    tls: TLSMaterial | None
    context: ssl.SSLContext | None
    data: np.ndarray  # DATA_PAGES pages, page-aligned; its last page changed after epoch 1
    first: int  # the page of data[0]
    num_pages: int
    epoch: int


@pytest.fixture(scope="module", params=["plain", "tls"])
def server(request):
    tls = TLSMaterial.generate() if request.param == "tls" else None
    pager = DriverPager(page_size=PAGE, token=TOKEN, transport="tcp", tls=tls)
    try:
        data = clamor.array(DATA_PAGES * PAGE // 8, np.float64)
        assert arena.arena_offset(data) % PAGE == 0
        data[:] = np.arange(len(data)) * 0.25
        pager.begin_stage()
        pager.end_stage()
        data[-1] = -1.0  # the last page differs between epochs 1 and 2
        epoch, _ = pager.begin_stage()
        pager.end_stage()
        yield Server(
            pager,
            tls,
            pc.tls_context(tls) if tls else None,
            data,
            arena.arena_offset(data) // PAGE,
            pager.stats()["driver"]["num_pages"],
            epoch,
        )
    finally:
        pager.close()


def counters(s: Server) -> tuple[int, int]:
    d = s.pager.stats()["driver"]
    return d["auth_failures"], d["bad_requests"]


def n_examples(s: Server, name: str) -> int:
    return EXAMPLES[name][s.tls is not None]


def fuzz_settings(n: int) -> settings:
    return settings(
        max_examples=n,
        derandomize=True,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
    )


# ------------------------------------------------------------------ the wire --


def open_socket(s: Server) -> socket.socket:
    return pc.connect("127.0.0.1", s.pager.port, tls=s.context, timeout=30)


def recv_exact(sock: socket.socket, n: int) -> bytes:
    out = b""
    while len(out) < n:
        chunk = recv_some(sock, n - len(out))
        assert chunk, f"connection closed after {len(out)} of {n} expected bytes"
        out += chunk
    return out


def recv_some(sock: socket.socket, n: int) -> bytes:
    try:
        return sock.recv(n)
    except ssl.SSLEOFError:
        return b""


def assert_closed(sock: socket.socket) -> None:
    """The server hung up and sent nothing more."""
    assert recv_some(sock, 1 << 16) == b"", "the server sent more than the model expects"


def read_reply(sock: socket.socket) -> pc.Reply:
    magic, version, type_, page, epoch, aux, flags, aux2, length = pc.HEADER.unpack(recv_exact(sock, pc.HEADER.size))
    assert (magic, version) == (pc.MAGIC, pc.VERSION)
    assert length <= 6 * 3 * PAGE  # a page, or the rows of rows_messages
    reply = pc.Reply(type_, page, epoch, aux, flags, aux2)
    reply.data = recv_exact(sock, length) if length else b""
    return reply


def half_close(sock: socket.socket) -> None:
    """End our side (EOF for the server) without waiting for its timeout. For TLS the
    TCP socket itself is shut: SSLSocket.shutdown would also drop the TLS session."""
    try:
        socket.socket.shutdown(sock, socket.SHUT_WR)
    except OSError:
        pass


def mac(role: bytes, a: bytes, b: bytes, token: bytes = TOKEN) -> bytes:
    return hmac.new(token, role + a + b, hashlib.sha256).digest()


class Connection:
    """An authenticated connection reused across examples while the server keeps it."""

    def __init__(self, s: Server) -> None:
        self.s = s
        self.sock: socket.socket | None = None
        self.rng = random.Random(7)

    def get(self) -> socket.socket:
        if self.sock is None:
            client_id = self.rng.choice([pc.ANY_CLIENT, self.rng.randrange(64), self.rng.randrange(U32 + 1)])
            sock = open_socket(self.s)
            hello = read_reply(sock)
            client_nonce = bytes(self.rng.randrange(256) for _ in range(pc.NONCE))
            sock.sendall(
                pc.pack(pc.AUTH, aux=client_id, length=2 * pc.NONCE) + client_nonce + mac(b"C", hello.data, client_nonce)
            )
            ok = read_reply(sock)
            assert ok.type == pc.AUTH_OK and ok.data == mac(b"S", client_nonce, hello.data)
            self.sock = sock
        return self.sock

    def drop(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None


# ----------------------------------------------------------------- the model --


@dataclasses.dataclass
class Msg:
    type: int = pc.GET
    page: int = 0
    epoch: int = 1
    aux: int = 1
    flags: int = 0
    aux2: int = 0
    length: int = 0
    magic: int = pc.MAGIC
    version: int = pc.VERSION
    truncate: int | None = None  # send only this many bytes, then end the connection
    offsets: tuple[int, ...] = ()  # ROWS: the payload, sent only where the server reads it

    def wire(self) -> bytes:
        header = pc.pack(self.type, self.page, self.epoch, self.aux, self.flags, self.aux2, self.length,
                         magic=self.magic, version=self.version)  # fmt: skip
        if self.truncate is not None:
            return header[: self.truncate]
        return header + struct.pack(f"<{len(self.offsets)}Q", *self.offsets)


def check_page(s: Server, reply: pc.Reply, page: int, epoch: int) -> None:
    """A PAGE reply carrying exactly what the pager resolves for (page, epoch)."""
    assert (reply.type, reply.page) == (pc.PAGE, page), reply
    out = _native.ffi.new("uint8_t[]", PAGE)
    version = _native.lib.clamor_driver_read_version(page, epoch, out)
    assert reply.epoch == version and version <= epoch <= reply.aux
    assert (reply.flags, reply.aux2) == (0, 0)
    assert reply.data == _native.ffi.buffer(out)[:]


def check_rows(s: Server, reply: pc.Reply, offsets: tuple[int, ...], row: int, epoch: int) -> None:
    """A ROWS reply carrying each row's bytes as the pager resolves its pages at `epoch`."""
    assert (reply.type, reply.epoch, reply.aux) == (pc.ROWS, epoch, len(offsets)), reply
    pages: dict[int, bytes] = {}
    for page in {p for o in offsets for p in range(o // PAGE, (o + row - 1) // PAGE + 1)}:
        out = _native.ffi.new("uint8_t[]", PAGE)
        assert _native.lib.clamor_driver_read_version(page, epoch, out) >= 0
        pages[page] = _native.ffi.buffer(out)[:]
    def row_bytes(o: int) -> bytes:
        first = o // PAGE
        return b"".join(pages[p] for p in range(first, (o + row - 1) // PAGE + 1))[o - first * PAGE :][:row]
    assert reply.data == b"".join(row_bytes(o) for o in offsets)


def rows_refusal(s: Server, m: Msg) -> int | None:
    """The error a ROWS request gets (None: its rows), as page_server.c checks it."""
    n, row = m.aux, m.aux2
    if not (n and row and n <= pc.MAX_ROWS and n * row <= pc.MAX_ROWS_BYTES and m.length == 8 * n):
        return pc.ERR_BAD_REQUEST
    arena = s.num_pages * PAGE
    if any(o > arena or row > arena - o for o in m.offsets):
        return pc.ERR_PAGE_RANGE
    return None if 1 <= m.epoch <= s.epoch else pc.ERR_NO_VERSION


def exchange(s: Server, conn: Connection, msgs: list[Msg]) -> int:
    """Send `msgs` pipelined on one connection, check every reply; returns bad_requests expected."""
    msgs = [dataclasses.replace(m, truncate=None) for m in msgs[:-1]] + msgs[-1:]  # only the last is cut
    sock = conn.get()
    sock.sendall(b"".join(m.wire() for m in msgs))
    bad = 0
    for m in msgs:
        if m.truncate is not None:
            half_close(sock)  # a header cut short: the server just hangs up
            assert_closed(sock)
            conn.drop()
            return bad
        if (m.magic, m.version) != (pc.MAGIC, pc.VERSION):
            expect_error(sock, 0, pc.ERR_BAD_REQUEST)
            conn.drop()
            return bad + 1
        if m.type == pc.HAVE and m.length == 0:
            bad += m.page >= s.num_pages  # counted, not answered
            continue
        if m.type == pc.ROWS:
            refusal = rows_refusal(s, m)
            if refusal is None:
                check_rows(s, read_reply(sock), m.offsets, m.aux2, m.epoch)
                continue
            expect_error(sock, 0, refusal, keep=refusal != pc.ERR_BAD_REQUEST)
            bad += 1
            if refusal == pc.ERR_BAD_REQUEST:  # the server hung up
                conn.drop()
                return bad
            continue
        if m.type != pc.GET:
            expect_error(sock, m.page, pc.ERR_BAD_REQUEST)
            conn.drop()
            return bad + 1
        n = m.aux or 1
        if m.length != 0 or n > pc.MAX_BATCH:
            expect_error(sock, m.page, pc.ERR_BAD_REQUEST)
            conn.drop()
            return bad + 1
        if m.page >= s.num_pages or n > s.num_pages - m.page:
            expect_error(sock, m.page, pc.ERR_PAGE_RANGE, keep=True)
            bad += 1
            continue
        if not 1 <= m.epoch <= s.epoch:
            expect_error(sock, m.page, pc.ERR_NO_VERSION, keep=True)
            bad += 1
            continue
        for i in range(n):
            check_page(s, read_reply(sock), m.page + i, m.epoch)
    # A valid request last: its reply proves every message before it was processed.
    sock.sendall(pc.pack(pc.GET, s.first, s.epoch, 1, pc.NO_REDIRECT))
    check_page(s, read_reply(sock), s.first, s.epoch)
    return bad


def expect_error(sock: socket.socket, page: int, code: int, keep: bool = False) -> None:
    reply = read_reply(sock)
    assert (reply.type, reply.page, reply.aux, reply.data) == (pc.ERROR, page, code, b""), reply
    if not keep:
        assert_closed(sock)


# ---------------------------------------------------------------- strategies --

u32 = st.integers(0, U32)


def pages(s: Server) -> st.SearchStrategy[int]:
    """Mostly pages near the data and the arena's end; never a random valid page
    (each one read would commit arena memory)."""
    return st.one_of(
        st.integers(max(0, s.first - 4), s.first + DATA_PAGES + 4),
        st.integers(s.num_pages - 1100, s.num_pages + 2),
        st.integers(s.num_pages, U64),
    )


@st.composite
def rows_messages(draw, s: Server) -> Msg:
    """ROWS requests: counts, row sizes and lengths around the limits, offsets near the
    data and past the arena's end; the offsets are sent where the server reads them."""
    small = st.integers(1, 6)
    n = draw(st.one_of(small, small, st.just(0), st.sampled_from([pc.MAX_ROWS, pc.MAX_ROWS + 1]), u32))
    row = draw(st.one_of(st.integers(1, 3 * PAGE), st.integers(1, 3 * PAGE), st.just(0),
                         st.just(pc.MAX_ROWS_BYTES + 1), u32))  # fmt: skip
    length = draw(st.one_of(st.just(8 * n), st.just(8 * n), st.integers(0, U64)))
    if (n > 6 or row > 3 * PAGE) and length == 8 * n and row and n * row <= pc.MAX_ROWS_BYTES:
        length += 1  # valid, it would need a million offsets sent, or read megabytes of arena
    epoch = draw(st.one_of(st.integers(1, s.epoch), st.integers(1, s.epoch), st.integers(0, s.epoch + 1), u32))
    m = Msg(type=pc.ROWS, epoch=epoch, aux=n, aux2=row, length=length)
    if rows_refusal(s, m) == pc.ERR_BAD_REQUEST:
        return m
    arena = s.num_pages * PAGE
    near = st.integers(max(0, s.first - 1) * PAGE, (s.first + DATA_PAGES + 1) * PAGE)
    offsets = st.one_of(near, near, near, st.integers(arena - 2 * PAGE, U64))
    return dataclasses.replace(m, offsets=tuple(draw(st.lists(offsets, min_size=n, max_size=n))))


def messages(s: Server) -> st.SearchStrategy[Msg]:
    return rows_messages(s) | st.builds(
        Msg,
        type=st.one_of(st.just(pc.GET), st.just(pc.HAVE), st.integers(0, 0xFFFF)),
        page=pages(s),
        epoch=st.one_of(st.integers(0, s.epoch + 1), u32),
        aux=st.one_of(st.integers(0, 8), st.sampled_from([pc.MAX_BATCH - 1, pc.MAX_BATCH, pc.MAX_BATCH + 1]), u32),
        flags=st.one_of(st.sampled_from([0, pc.NO_REDIRECT]), u32),
        aux2=st.one_of(st.integers(0, 65), u32),
        length=st.one_of(st.just(0), st.just(0), st.integers(1, U64)),
        magic=st.one_of(st.just(pc.MAGIC), st.just(pc.MAGIC), st.just(pc.MAGIC), st.integers(0, U32)),
        version=st.one_of(st.just(pc.VERSION), st.just(pc.VERSION), st.just(pc.VERSION), st.integers(0, 0xFFFF)),
        truncate=st.one_of(st.none(), st.none(), st.none(), st.none(), st.integers(0, pc.HEADER.size - 1)),
    ).filter(lambda m: m.type != pc.ROWS)  # rows_messages builds those, with their payload


# ------------------------------------------------------------------- fuzzing --


def test_authenticated_requests_match_the_model(server):
    s, conn = server, Connection(server)
    tally = {"bad": 0}
    failures, bad = counters(s)

    @fuzz_settings(n_examples(s, "requests"))
    @given(st.lists(messages(s), min_size=1, max_size=3))
    def run(msgs):
        try:
            tally["bad"] += exchange(s, conn, msgs)
        except BaseException:
            conn.drop()  # a fresh connection for the next (shrinking) attempt
            raise

    try:
        run()
    finally:
        conn.drop()
    assert counters(s) == (failures, bad + tally["bad"])
    assert tally["bad"] > n_examples(s, "requests") // 4


@st.composite
def handshakes(draw, s: Server):
    """Bytes a client sends after HELLO: an AUTH with fuzzed fields, or noise."""
    kind = draw(st.sampled_from(["auth", "auth", "noise"]))
    if kind == "noise":
        return draw(st.binary(max_size=300)), None
    header = Msg(
        type=draw(st.one_of(st.just(pc.AUTH), st.integers(0, 0xFFFF))),
        page=draw(st.integers(0, U64)),
        epoch=draw(u32),
        aux=draw(st.one_of(st.just(pc.ANY_CLIENT), st.integers(0, 70), u32)),
        length=draw(st.one_of(st.just(2 * pc.NONCE), st.integers(0, 2 * pc.NONCE + 1), st.integers(0, U64))),
        magic=draw(st.one_of(st.just(pc.MAGIC), st.integers(0, U32))),
        version=draw(st.one_of(st.just(pc.VERSION), st.integers(0, 0xFFFF))),
    )
    body = draw(st.sampled_from(["right-mac", "wrong-token", "random"]))
    cut = draw(st.one_of(st.none(), st.integers(0, pc.HEADER.size + 2 * pc.NONCE - 1)))
    return header, (body, cut)


def handshake_outcome(data: bytes) -> str:
    """What the server does with `data` (then EOF) after HELLO: "refuse" (ERR_AUTH), a "silent"
    close (a cut AUTH body), or "check-mac" (a complete AUTH)."""
    if len(data) < pc.HEADER.size:
        return "refuse"  # no AUTH header at all
    magic, version, type_, *_, length = pc.HEADER.unpack(data[: pc.HEADER.size])
    if (magic, version) != (pc.MAGIC, pc.VERSION) or type_ != pc.AUTH or length != 2 * pc.NONCE:
        return "refuse"
    if len(data) < pc.HEADER.size + 2 * pc.NONCE:
        return "silent"
    return "check-mac"


def test_broken_handshakes_are_refused_and_counted(server):
    s = server
    tally = {"refused": 0}
    failures, bad = counters(s)

    @fuzz_settings(n_examples(s, "handshakes"))
    @given(handshakes(s))
    def run(example):
        header, how = example
        sock = open_socket(s)
        try:
            hello = read_reply(sock)
            assert hello.type == pc.HELLO and len(hello.data) == pc.NONCE
            if how is None:
                data = header
            else:
                body, cut = how
                nonce = bytes(pc.NONCE)
                tag = {"right-mac": mac(b"C", hello.data, nonce), "wrong-token": mac(b"C", hello.data, nonce, b"x"),
                       "random": hashlib.sha256(header.wire()).digest()}[body]  # fmt: skip
                data = header.wire() + nonce + tag
                data = data[:cut] if cut is not None else data
            outcome = handshake_outcome(data)
            if outcome == "check-mac":
                right = data[pc.HEADER.size + pc.NONCE :] == mac(b"C", hello.data, data[pc.HEADER.size : pc.HEADER.size + pc.NONCE])
                outcome = "ok" if right else "refuse"
            sock.sendall(data)
            if outcome == "ok":
                ok = read_reply(sock)
                assert ok.type == pc.AUTH_OK
                assert ok.data == mac(b"S", data[pc.HEADER.size : pc.HEADER.size + pc.NONCE], hello.data)
                sock.sendall(pc.pack(pc.GET, s.first, s.epoch, 1, pc.NO_REDIRECT))
                check_page(s, read_reply(sock), s.first, s.epoch)
                return
            half_close(sock)
            if outcome == "refuse":
                expect_error(sock, 0, pc.ERR_AUTH)
            else:
                assert_closed(sock)
            tally["refused"] += 1
            # Counted before the server hangs up, so exactly now.
            assert counters(s)[0] == failures + tally["refused"]
        finally:
            sock.close()

    run()
    assert counters(s) == (failures + tally["refused"], bad)
    assert tally["refused"] > n_examples(s, "handshakes") // 2


def test_random_bytes_before_any_handshake(server):
    """Noise from the first byte on (for TLS: instead of a ClientHello) is refused and counted."""
    s = server
    tally = {"n": 0}
    failures, bad = counters(s)

    @fuzz_settings(n_examples(s, "raw"))
    @given(st.binary(max_size=2048))
    def run(data):
        sock = socket.create_connection(("127.0.0.1", s.pager.port), timeout=30)
        try:
            sock.sendall(data)
            half_close(sock)
            received = b""
            while chunk := sock.recv(1 << 16):
                received += chunk
            if s.tls is None:  # HELLO, then ERR_AUTH if the noise parsed as a header
                assert received[: pc.HEADER.size] == pc.pack(pc.HELLO, length=pc.NONCE)
                rest = received[pc.HEADER.size + pc.NONCE :]
                outcome = handshake_outcome(data)
                assert outcome in ("silent", "refuse", "check-mac")
                assert rest == (b"" if outcome == "silent" else pc.pack(pc.ERROR, aux=pc.ERR_AUTH))
            else:  # at most a TLS alert: never a page-protocol byte
                assert pc.MAGIC.to_bytes(4, "little") not in received
            tally["n"] += 1
            assert counters(s)[0] == failures + tally["n"]
        except ConnectionResetError:
            # A server that hung up on noise it had not read resets the connection.
            tally["n"] += 1
        finally:
            sock.close()

    run()
    assert counters(s) == (failures + tally["n"], bad)


def test_after_fuzzing_the_server_serves_the_arena(server):
    s = server
    failures, bad = counters(s)
    assert failures > 0 and bad > 0
    if s.tls is None:  # 4,000 exchanges: the model checked ROWS replies too (TLS's 300 may hold none)
        assert s.pager.stats()["driver"]["rows_served"] > 0
    with pc.PageClient("127.0.0.1", s.pager.port, TOKEN, tls=s.context) as c:
        rows = c.rows([arena.arena_offset(s.data) + 8 * i for i in (3, 0, len(s.data) - 2)], 16, s.epoch)
        assert np.frombuffer(rows.data, np.float64).tolist() == [0.75, 1.0, 0.0, 0.25, s.data[-2], -1.0]
        replies = c.get(s.first, s.epoch, count=DATA_PAGES)
        assert b"".join(r.data for r in replies) == s.data.tobytes()
        (old,) = c.get(s.first + DATA_PAGES - 1, 1)
        expected = np.arange(len(s.data)) * 0.25
        assert old.data == expected[-PAGE // 8 :].tobytes()
    assert counters(s) == (failures, bad)
