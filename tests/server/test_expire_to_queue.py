"""expire_to_queue (reference §5.2) when the target queue lives on another worker.

Kestrel moves an expired item inside one process, so a client that saw `get src` come back
empty finds the item in the target at once.  With the target on another worker the move is a
message between workers; this holds the server to Kestrel's order in every layout.  (A move
while the target's worker is down: tests/engine/test_worker_loop.py.)
"""
import time

import pytest

from lanner.queues.placement import worker_of
from tests.helpers import LAYOUTS, start_server
from tests.server.conftest import Client

pytestmark = pytest.mark.integration

MAX_AGE_MS = 60


def cross_pairs(n: int) -> list[tuple[str, str]]:
    """`n` (source, target) name pairs whose queues are on different workers of two, half of
    them each way."""
    pairs, want = [], 0
    i = 0
    while len(pairs) < n:
        src, dst = f"xs{i}", f"xd{i}"
        i += 1
        if worker_of(src, 2) == want and worker_of(dst, 2) != want:
            pairs.append((src, dst))
            want ^= 1
    return pairs


def config_for(pairs) -> str:
    return "".join(f'[queues.{s}]\nexpire_to_queue = "{d}"\nmax_age = "{MAX_AGE_MS}ms"\n'
                   for s, d in pairs)


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_a_client_finds_the_moved_item_right_after_the_source_came_back_empty(tmp_path, layout):
    pairs = cross_pairs(8)
    h = start_server(tmp_path, layout=layout, config=config_for(pairs))
    try:
        for rnd in range(3):
            conns = [Client(h.connect()) for _ in pairs]
            for (src, _), c in zip(pairs, conns):
                assert c.ask(b"set %s 0 0 2\r\n%02d\r\n" % (src.encode(), rnd)) == b"STORED\r\n"
            time.sleep(2 * MAX_AGE_MS / 1000)       # the items' own max_age runs out
            for (src, dst), c in zip(pairs, conns):
                assert c.ask(b"get %s\r\n" % src.encode(), b"END\r\n") == b"END\r\n"
                got = c.ask(b"get %s\r\n" % dst.encode(), b"END\r\n")
                assert got == b"VALUE %s 0 2\r\n%02d\r\nEND\r\n" % (dst.encode(), rnd), (src, dst, rnd)
            for c in conns:
                c.close()
    finally:
        assert h.stop() == 0

