"""The driver's page directory with 1,000 workers (runtime/paging/native/driver_pager.c).

No cluster: a real DriverPager, 1,000 fake peers registered through the C API
(clamor_driver_set_peer), and the page protocol spoken by page_client.py under
worker ids, so the directory sees exactly what 1,000 workers would tell it. A
page held by up to 7 workers keeps their ids inline; past that, a 1,024-bit
bitmap; both must give the same answers: redirects spread over the live
holders (two random choices), drops on eviction notices, failed redirects and
lost workers, invalidation at stage start, counts and id lists for the
inspection APIs, and no trace of client ids at or past the 1,024 limit.
"""

from __future__ import annotations

import collections

import numpy as np
import pytest
from clamor.runtime.paging import arena
from clamor.runtime.paging import page_client as pc
from clamor.runtime.paging.native import _native
from clamor.runtime.paging.pager import MAX_WORKERS, DriverPager

import clamor

lib = _native.lib
TOKEN = b"directory-test-token"
PAGE = 4096
PEERS = 1000
PORT0 = 20000  # fake peer w "listens" on PORT0 + w: redirects name it, nobody connects
LOCALHOST = 0x7F000001
SYNC_PAGE = [0]  # the last page of `data`, which no test checks


@pytest.fixture(scope="module")
def pager():
    p = DriverPager(page_size=PAGE, token=TOKEN, transport="tcp", replication=True)
    try:
        for w in range(PEERS):
            assert lib.clamor_driver_set_peer(w, b"127.0.0.1", PORT0 + w) == 0
        yield p
    finally:
        p.close()


@pytest.fixture(scope="module")
def data(pager) -> np.ndarray:
    x = clamor.array(9 * PAGE // 8, np.float64)
    x[:] = np.arange(len(x))
    assert arena.arena_offset(x) % PAGE == 0
    SYNC_PAGE[0] = arena.arena_offset(x) // PAGE + 8
    return x


def page_of(x: np.ndarray, i: int = 0) -> int:
    return arena.arena_offset(x) // PAGE + i


def holders(pager: DriverPager, page: int) -> list[int]:
    counts, ids = pager.page_holders(page, 1)
    assert counts[0] == len(ids) == pager.page_stats(page, 1)["holders"][0]
    return ids.tolist()


def stage(pager: DriverPager) -> tuple[int, list[int]]:
    epoch, invalidated = pager.begin_stage()
    pager.end_stage()
    return epoch, invalidated


def fetch_as(pager: DriverPager, workers, page: int, epoch: int) -> None:
    """Each of ``workers`` GETs the page from the driver (NO_REDIRECT): it holds it then."""
    for w in workers:
        with pc.PageClient("127.0.0.1", pager.port, TOKEN, client_id=w) as c:
            (reply,) = c.get(page, epoch, flags=pc.NO_REDIRECT)
            assert reply.type == pc.PAGE


def redirects(c: pc.PageClient, page: int, epoch: int, n: int) -> collections.Counter:
    """Ask for the page n times, redirects allowed: how often each peer was named."""
    named: collections.Counter = collections.Counter()
    for _ in range(n):
        (reply,) = c.get(page, epoch, flags=0)
        assert reply.type == pc.REDIRECT and reply.epoch == epoch
        assert reply.aux2 == LOCALHOST and reply.flags == PORT0 + reply.aux  # the peer's own address
        named[reply.aux] += 1
    return named


def tell(c: pc.PageClient, page: int, version: int, *, dropped: bool = False) -> None:
    """A HAVE: the client got this version of the page elsewhere (from shared memory),
    or evicted the page. Waits until the driver handled it: a connection's messages are
    handled in order, so a reply to a GET (of a page no test looks at) comes after."""
    c.send_raw(pc.pack(pc.HAVE, page, version, 0, 1 if dropped else 0))
    (reply,) = c.get(SYNC_PAGE[0], version, flags=pc.NO_REDIRECT)
    assert reply.type == pc.PAGE


def test_a_page_held_by_1000_workers(pager, data):
    epoch, _ = stage(pager)
    hot = page_of(data)
    fetch_as(pager, range(PEERS), hot, epoch)
    assert holders(pager, hot) == list(range(PEERS))
    assert pager.stats()["driver"]["holder_bitmaps"] == 1  # only the hot page outgrew its entry

    asker = MAX_WORKERS - 1  # a worker id that holds nothing
    with pc.PageClient("127.0.0.1", pager.port, TOKEN, client_id=asker) as c:
        named = redirects(c, hot, epoch, 4000)
    # 4,000 redirects over 1,000 holders: two random choices (fewer outstanding redirects wins)
    # keep every holder near 4; one random choice would leave ~2 % of them unused.
    assert len(named) >= 990 and max(named.values()) <= 8
    # A redirected client is listed as a holder at once (a holder-to-be: a burst fans out
    # over a tree of peers); this one never fetches, so it says it dropped the page.
    assert asker in holders(pager, hot)
    with pc.PageClient("127.0.0.1", pager.port, TOKEN, client_id=asker) as c:
        tell(c, hot, epoch, dropped=True)

    with pc.PageClient("127.0.0.1", pager.port, TOKEN, client_id=7) as c:  # a holder itself
        assert 7 not in redirects(c, hot, epoch, 500)

    # Eviction notices: all but 5 drop it.
    for w in range(PEERS - 5):
        with pc.PageClient("127.0.0.1", pager.port, TOKEN, client_id=w) as c:
            tell(c, hot, epoch, dropped=True)
    assert holders(pager, hot) == [995, 996, 997, 998, 999]
    with pc.PageClient("127.0.0.1", pager.port, TOKEN, client_id=asker) as c:
        assert set(redirects(c, hot, epoch, 200)) == {995, 996, 997, 998, 999}
        # a redirect that failed (aux2 = peer + 1) drops that peer; the GET makes the asker one
        c.send_raw(pc.pack(pc.GET, hot, epoch, 1, pc.NO_REDIRECT, aux2=999 + 1))
        assert c.recv().type == pc.PAGE
    assert holders(pager, hot) == [995, 996, 997, 998, asker]

    # A lost worker: out of every page's holders, and never redirected to.
    lib.clamor_driver_drop_worker(998)
    assert holders(pager, hot) == [995, 996, 997, asker]
    with pc.PageClient("127.0.0.1", pager.port, TOKEN, client_id=asker) as c:
        assert set(redirects(c, hot, epoch, 100)) == {995, 996, 997}
    assert lib.clamor_driver_set_peer(998, b"127.0.0.1", PORT0 + 998) == 0  # back

    # Down to 3 holders the page's ids are inline again: its bitmap goes back to the pool.
    bitmaps = pager.stats()["driver"]["holder_bitmaps"]
    with pc.PageClient("127.0.0.1", pager.port, TOKEN, client_id=995) as c:
        tell(c, hot, epoch, dropped=True)
    assert pager.stats()["driver"]["holder_bitmaps"] == bitmaps - 1
    assert holders(pager, hot) == [996, 997, asker]
    with pc.PageClient("127.0.0.1", pager.port, TOKEN, client_id=asker) as c:
        assert set(redirects(c, hot, epoch, 100)) == {996, 997}


def test_holders_of_many_pages_and_invalidation(pager, data):
    data[: 8 * PAGE // 8] += 0.5  # a fresh start: every page but the sync page invalidated
    epoch, _ = stage(pager)
    first = page_of(data)
    # page first + i held by 3 ** i workers (1, 3, 9, 27, 81, 243): inline and bitmaps
    want = {first + i: list(range(0, PEERS, max(1, PEERS // 3**i)))[: 3**i] for i in range(6)}
    bitmaps = pager.stats()["driver"]["holder_bitmaps"]  # the sync page's, say
    for page, workers in want.items():
        fetch_as(pager, workers[:4], page, epoch)  # from the driver
        version = int(pager.page_stats(page, 1)["version"][0])
        for w in workers[4:]:
            with pc.PageClient("127.0.0.1", pager.port, TOKEN, client_id=w) as c:
                tell(c, page, version)  # got it from shared memory: a holder too
    counts, ids = pager.page_holders(first, 8)
    assert counts.tolist() == [len(want[first + i]) for i in range(6)] + [0, 0]
    offsets = np.r_[0, np.cumsum(counts, dtype=np.int64)]
    for i in range(6):
        assert ids[offsets[i] : offsets[i + 1]].tolist() == sorted(want[first + i])
    assert pager.stats()["driver"]["holder_bitmaps"] == bitmaps + 4  # the pages with 9, 27, 81 and 243
    cached = pager.cached_bytes(((first * PAGE, 6 * PAGE),))
    assert cached == {w: PAGE * sum(w in ws for ws in want.values()) for w in set().union(*want.values())}

    data[: 6 * PAGE // 8] += 1  # every held page written: all of them invalidated
    _, invalidated = stage(pager)
    assert set(invalidated) >= set(want)
    assert pager.page_holders(first, 8)[0].tolist() == [0] * 8
    assert pager.stats()["driver"]["holder_bitmaps"] == bitmaps


def test_a_burst_fans_out_over_holders_to_be(pager, data):
    """63 workers ask for a page that one holds, all before any of them has it (a burst at
    stage start): each is listed as a holder at its redirect, so the later ones are sent
    to the earlier ones, as a tree, instead of all to the first (a star on one uplink)."""
    data[7 * PAGE // 8 : 8 * PAGE // 8] += 0.25  # page 7 anew: no holders
    epoch, _ = stage(pager)
    page = page_of(data, 7)
    for w in range(64):  # no outstanding redirects from earlier tests
        assert lib.clamor_driver_set_peer(w, b"127.0.0.1", PORT0 + w) == 0
    fetch_as(pager, [0], page, epoch)
    named: collections.Counter = collections.Counter()
    for w in range(1, 64):
        with pc.PageClient("127.0.0.1", pager.port, TOKEN, client_id=w) as c:
            (reply,) = c.get(page, epoch, flags=0)
            assert reply.type == pc.REDIRECT and reply.aux < w  # to a holder listed before it
            named[reply.aux] += 1
    assert holders(pager, page) == list(range(64))
    assert named[0] <= 6 and max(named.values()) <= 6, named  # a star would be {0: 63}
    assert len(named) >= 16, named


def test_client_ids_past_the_limit_leave_no_trace(pager, data):
    epoch, _ = stage(pager)
    page = page_of(data, 6)
    version = int(pager.page_stats(page, 1)["version"][0])
    before = pager.page_holders(0, pager.used_pages())[1].tolist()
    for client in (MAX_WORKERS, MAX_WORKERS + 1, 5000, 2**31, pc.ANY_CLIENT):
        with pc.PageClient("127.0.0.1", pager.port, TOKEN, client_id=client) as c:
            (reply,) = c.get(page, epoch, flags=0)  # served, never redirected, never recorded
            assert reply.type == pc.PAGE
            tell(c, page, version)  # would make a worker a holder
            tell(c, page, version, dropped=True)
            c.send_raw(pc.pack(pc.GET, page, epoch, 1, pc.NO_REDIRECT, aux2=(client + 1) & 0xFFFFFFFF))
            assert c.recv().type == pc.PAGE
    assert pager.page_holders(0, pager.used_pages())[1].tolist() == before
    assert lib.clamor_driver_set_peer(MAX_WORKERS, b"127.0.0.1", 1) == -1
    assert lib.clamor_driver_set_peer(-1, b"127.0.0.1", 1) == -1
    lib.clamor_driver_drop_worker(MAX_WORKERS)  # ignored
    lib.clamor_driver_drop_worker(-1)
    with pytest.raises(Exception, match="1,024"):
        pager.worker_config(MAX_WORKERS, "127.0.0.1")


def test_a_cluster_over_the_limit_is_refused_before_any_worker_starts():
    with pytest.raises(ValueError, match=r"at most 1,024 workers.*page directory"):
        clamor.Cluster(workers=2000)
