"""A failed write or fsync turns the batch's acknowledgements into errors (worker.py)."""
from lanner.ipc.messages import R_ITEM, R_OK, R_SERVER_ERROR, RF_CLOSE, pack_resp, unpack_resp
from lanner.server.worker import _fail_acks


def test_acks_become_server_errors_and_items_stay():
    replies = [(0, pack_resp(7, 1, R_OK, 0, 0, 0), b""),
               (1, pack_resp(8, 2, R_ITEM, 0, 0, 0), b"data")]
    out = _fail_acks(replies, "/q/jobs: write of 26 bytes failed: No space left on device")
    conn, req, status, flags, _, _ = unpack_resp(out[0][1], 0)
    assert (out[0][0], conn, req, status, flags) == (0, 7, 1, R_SERVER_ERROR, RF_CLOSE)
    assert out[0][2] == b"/q/jobs: write of 26 bytes failed: No space left on device"
    assert out[1] == replies[1]
