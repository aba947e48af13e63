"""A replaced worker is announced ready (its "worker N ready" line) only after every surviving
peer has heard its `peer_up` (server/peernews.py), so a client acting on that line is never
told "worker N is restarting"."""
import signal

import pytest

from tests.helpers import start_server, wait_for
from tests.server.conftest import Client
from tests.server.test_local import clients_on, queue_of, replaced, worker_procs

pytestmark = pytest.mark.integration


def test_a_routed_request_right_after_the_ready_line_reaches_the_replacement(tmp_path):
    """Worker 1 is killed; the survivor (worker 0) is stopped once it acknowledged the death,
    so the replacement's peer_up waits in its socket.  The supervisor says the replacement is
    up but not ready until worker 0, resumed, acknowledged the peer_up; a request routed
    through worker 0 right after the ready line reaches worker 1.  Before, the ready line came
    as soon as the replacement said ready, while worker 0 still counted it as restarting."""
    h = start_server(tmp_path, workers=2)
    try:
        q = queue_of(1)
        w = Client(h.connect())
        assert w.ask(b"set %s 0 0 1\r\nx\r\n" % q) == b"STORED\r\n"
        w.close()
        # worker 0's client, no request yet (one to worker 1 might hand it over to worker 1)
        [c] = clients_on(h, 0, 1)
        survivor, victim = worker_procs(h)
        victim.send_signal(signal.SIGKILL)
        # the replacement is forked only after the survivor acknowledged the death
        assert wait_for(lambda: replaced(h, victim)), h.log()
        survivor.send_signal(signal.SIGSTOP)
        try:
            assert wait_for(lambda: "worker 1 up;" in h.log() or h.log().count("worker 1 ready") >= 2,
                            timeout=20), h.log()
            assert "worker 1 up;" in h.log(), h.log()      # its peers are told before it is ready
        finally:
            survivor.send_signal(signal.SIGCONT)
        assert wait_for(lambda: h.log().count("worker 1 ready") >= 2, timeout=20), h.log()
        log = h.log()
        assert log.index("worker 1 up;") < log.rindex("worker 1 ready"), log
        assert c.ask(b"get %s\r\n" % q, b"END\r\n") == b"VALUE %s 0 1\r\nx\r\nEND\r\n" % q
        c.close()
    finally:
        assert h.stop() == 0
