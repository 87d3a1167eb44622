"""The driver's page server: authentication, bounds checks and versions, over a real socket."""

from __future__ import annotations

import socket
import time

import numpy as np
import pytest
from clamor.runtime.credentials import TLSMaterial
from clamor.runtime.paging import arena
from clamor.runtime.paging import page_client as pc
from clamor.runtime.paging import pager as pager_module
from clamor.runtime.paging.pager import DriverPager, PagingError

import clamor

TOKEN = b"the-cluster-secret"
PAGE = 64 << 10


@pytest.fixture(scope="module")
def pager():
    p = DriverPager(page_size=PAGE, token=TOKEN, transport="tcp")
    yield p
    p.close()


@pytest.fixture(scope="module")
def data(pager) -> np.ndarray:
    x = clamor.array(4 * PAGE // 8, np.float64)
    x[:] = np.arange(len(x))
    return x


def first_page(x: np.ndarray) -> int:
    return arena.arena_offset(x) // PAGE


def client(pager) -> pc.PageClient:
    return pc.PageClient("127.0.0.1", pager.port, TOKEN)


def test_pages_are_served_at_the_requested_epoch(pager, data):
    epoch1, _ = pager.begin_stage()
    pager.end_stage()
    p = first_page(data) + 1
    with client(pager) as c:
        (reply,) = c.get(p, epoch1)
        assert reply.type == pc.PAGE and reply.epoch == epoch1
        assert reply.data == bytes(arena.view(p * PAGE, (PAGE,), np.uint8, (1,)))
        old = reply.data

        data[len(data) // 4 + 10] = -5.0  # a write to page p after the barrier
        epoch2, invalidated = pager.begin_stage()
        pager.end_stage()
        assert invalidated.tolist() == []  # nobody but an anonymous client held it
        (new,) = c.get(p, epoch2)
        (again_old,) = c.get(p, epoch1)
        assert new.epoch == epoch2 and new.data != old
        assert again_old.data == old and again_old.aux == epoch2 - 1  # valid until the next version
        assert pager.read_version(p, epoch1) == old


def test_wrong_token_is_refused_and_counted(pager):
    failures = pager.stats()["driver"]["auth_failures"]
    with pytest.raises(PermissionError):
        pc.PageClient("127.0.0.1", pager.port, b"not-the-token")
    # The server counts the failure after closing the connection: allow it a moment.
    deadline = time.monotonic() + 5
    while pager.stats()["driver"]["auth_failures"] == failures and time.monotonic() < deadline:
        time.sleep(0.01)
    assert pager.stats()["driver"]["auth_failures"] == failures + 1


def test_bad_requests_get_error_replies_never_memory(pager, data):
    epoch, _ = pager.begin_stage()
    pager.end_stage()
    n_pages = pager.stats()["driver"]["num_pages"]
    with client(pager) as c:
        assert c.get(n_pages, epoch)[0].error == pc.ERR_PAGE_RANGE
        assert c.get(2**63, epoch)[0].error == pc.ERR_PAGE_RANGE
        assert c.get(n_pages - 1, epoch, count=2)[0].error == pc.ERR_PAGE_RANGE
        assert c.get(0, epoch + 1)[0].error == pc.ERR_NO_VERSION  # a version that never existed
        assert c.get(0, 0)[0].error == pc.ERR_NO_VERSION
        (ok,) = c.get(first_page(data), epoch)  # the connection still serves
        assert ok.type == pc.PAGE and len(ok.data) == PAGE
    with client(pager) as c:
        c.send_raw(pc.pack(pc.GET, 0, epoch, aux=pc.MAX_BATCH + 1))
        assert c.recv().error == pc.ERR_BAD_REQUEST
    with client(pager) as c:
        c.send_raw(pc.pack(pc.GET, 0, epoch, magic=0xDEADBEEF))
        assert c.recv().error == pc.ERR_BAD_REQUEST
        with pytest.raises((pc.PageProtocolError, ConnectionError)):
            c.recv()  # and the server hung up
    with client(pager) as c:
        c.send_raw(b"\x00" * 7)  # a truncated header, then silence
        c.sock.shutdown(socket.SHUT_WR)
    with client(pager) as c:  # the server is alive and right
        (ok,) = c.get(first_page(data), epoch)
        assert np.array_equal(np.frombuffer(ok.data, np.float64), data[: PAGE // 8])
    assert pager.stats()["driver"]["bad_requests"] >= 6


def test_rows_are_served_at_the_requested_epoch_without_their_pages(pager):
    x = clamor.array(3 * PAGE // 8, np.float64)
    x[:] = np.arange(len(x))
    epoch1, _ = pager.begin_stage()
    pager.end_stage()
    base = arena.arena_offset(x)
    ids = [7, len(x) - 1, PAGE // 8 - 1, 7]  # one row twice; rows of different pages
    offsets = [base + 8 * i for i in ids]
    with client(pager) as c:
        reply = c.rows(offsets, 8, epoch1)
        assert (reply.type, reply.epoch, reply.aux) == (pc.ROWS, epoch1, 4)
        assert np.frombuffer(reply.data, np.float64).tolist() == [float(i) for i in ids]
        x[7] = -7.0
        epoch2, _ = pager.begin_stage()
        pager.end_stage()
        assert np.frombuffer(c.rows(offsets[:1], 8, epoch2).data, np.float64).tolist() == [-7.0]
        assert np.frombuffer(c.rows(offsets[:1], 8, epoch1).data, np.float64).tolist() == [7.0]  # the log's
        straddling = c.rows([base + PAGE - 8], 16, epoch2)  # a row across two pages
        assert np.frombuffer(straddling.data, np.float64).tolist() == [PAGE / 8 - 1, PAGE / 8]


def test_bad_rows_requests_are_refused_and_the_server_goes_on(pager, data):
    epoch, _ = pager.begin_stage()
    pager.end_stage()
    end = pager.stats()["driver"]["num_pages"] * PAGE
    row = arena.arena_offset(data)
    with client(pager) as c:  # refused, the connection kept
        assert c.rows([end - 4], 8, epoch).error == pc.ERR_PAGE_RANGE  # runs past the arena's end
        assert c.rows([row, 2**64 - 8], 8, epoch).error == pc.ERR_PAGE_RANGE  # would wrap around
        assert c.rows([row], 8, epoch + 1).error == pc.ERR_NO_VERSION
        assert np.frombuffer(c.rows([row], 8, epoch).data, np.float64).tolist() == [data[0]]
    for n, row_bytes, length in [(0, 8, 0), (1, 0, 8), (pc.MAX_ROWS + 1, 8, 8 * (pc.MAX_ROWS + 1)),
                                 (2, pc.MAX_ROWS_BYTES, 16), (2, 8, 8)]:  # fmt: skip
        with client(pager) as c:  # refused, and the server hangs up: the framing is broken
            c.send_raw(pc.pack(pc.ROWS, 0, epoch, n, aux2=row_bytes, length=length))
            assert c.recv().error == pc.ERR_BAD_REQUEST
            with pytest.raises((pc.PageProtocolError, ConnectionError)):
                c.recv()
    with client(pager) as c:
        assert c.get(first_page(data), epoch)[0].type == pc.PAGE


def test_read_version_rejects_bad_pages_and_epochs(pager):
    with pytest.raises(PagingError, match="out of range"):
        pager.read_version(10**12, 1)
    with pytest.raises(PagingError, match="no such version"):
        pager.read_version(0, 10**6)


def test_native_exit_codes_match_the_python_names():
    from clamor.runtime import exitcodes
    from clamor.runtime.paging.native import _native

    assert _native.lib.CLAMOR_EXIT_DRIVER_UNREACHABLE == exitcodes.EXIT_DRIVER_UNREACHABLE
    assert _native.lib.CLAMOR_EXIT_PAGE_ERROR == exitcodes.EXIT_PAGE_ERROR
    assert "page" in exitcodes.describe_exit(exitcodes.EXIT_PAGE_ERROR)


def test_only_one_driver_pager_per_process(pager):
    with pytest.raises(PagingError, match="already running"):
        DriverPager(page_size=PAGE, token=TOKEN)


def test_a_plaintext_pager_hands_workers_no_tls_material(pager):
    config = pager.worker_config(0, "127.0.0.1")
    assert pager.tls is None and config.tls is None
    assert TOKEN.decode() not in repr(config)  # the worker has the token: it never travels


def test_tls_material_is_checked_before_anything_starts(pager):
    with pytest.raises(TypeError, match="TLSMaterial"):
        pager_module._tls_pem({"ca": "x"})  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="TLS key must be PEM"):
        pager_module._tls_pem(TLSMaterial(b"-----BEGIN CERTIFICATE-----", b"-----BEGIN CERTIFICATE-----", b"key"))
