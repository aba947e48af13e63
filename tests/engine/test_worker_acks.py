"""A failed write or fsync turns the replies of the requests it undid into errors (worker.py)."""
import errno

from lanner.ipc.messages import R_ITEM, R_OK, R_SERVER_ERROR, RF_CLOSE, RF_MORE, pack_resp, unpack_resp
from lanner.errors import describe_os_error
from lanner.server.commit import _fail_requests
from lanner.storage.journal.files import JournalError


def test_failed_requests_become_server_errors_and_others_stay():
    replies = [(0, pack_resp(7, 1, R_OK, 0, 0, 0), b""),
               (1, pack_resp(8, 2, R_ITEM, 0, 0, 0), b"data"),
               (0, pack_resp(7, 2, R_ITEM, RF_MORE, 0, 0), b"m1"),
               (0, pack_resp(7, 2, R_ITEM, RF_MORE, 0, 0), b"m2"),
               (0, pack_resp(9, 1, R_OK, 0, 0, 0), b"")]
    seen = set()
    out = list(replies)
    _fail_requests(out, {(0, 7, 1), (0, 7, 2)}, b"write failed: No space left on device", seen)
    assert len(out) == 4                    # the monitor's second item is dropped after its error
    conn, req, status, flags, _, _ = unpack_resp(out[0][1], 0)
    assert (out[0][0], conn, req, status, flags) == (0, 7, 1, R_SERVER_ERROR, RF_CLOSE)
    assert out[0][2] == b"write failed: No space left on device"
    assert out[1] == replies[1]
    assert unpack_resp(out[2][1], 0)[:3] == (7, 2, R_SERVER_ERROR)
    assert out[3] == replies[4]
    # the same request in a later list (held replies) stays dropped
    later = [replies[3]]
    _fail_requests(later, {(0, 7, 2)}, b"x", seen)
    assert later == []


def test_a_journal_failure_is_described_without_its_path():
    e = JournalError("/srv/lanner/queues/jobs", "write of 26 bytes failed: No space left on device",
                     errno.ENOSPC)
    assert describe_os_error(e, "jobs") == "write of 26 bytes failed: No space left on device (queue 'jobs')"
