"""Reply order and the close rule, in process: every reply earned before the command that closes
the connection is written, in order, then that command's error line, then the close (issue 11,
defect 2); nothing after it is taken."""
from __future__ import annotations

import pytest
from thrift.protocol import TBinaryProtocol
from thrift.Thrift import TMessageType, TType
from thrift.transport import TTransport

from lanner.fronts.text import TextConn
from lanner.fronts.thrift import ThriftConn
from lanner.ipc import messages as m
from lanner.perf.thrift_client import write_collection, write_field
from tests.fronts.harness import Rig


@pytest.fixture
def rig(tmp_path):
    r = Rig(tmp_path)
    yield r
    r.close()


def held_then_released(rig, client, data: bytes) -> bytes:
    """Send `data` while the worker holds its requests: nothing may be written or closed yet.
    Then let the worker answer and return everything the client gets."""
    w = rig.worker()
    w.hold = True
    client.send(data)
    rig.run()
    assert w.held, "the first command should be waiting for its worker"
    assert client.read() == b""
    assert not client.closed
    w.hold = False
    w.release()
    rig.run()
    return client.read()


@pytest.mark.parametrize("data, expected", [
    # the trigger: the item is removed, so its VALUE must reach the client
    (b"get jobs\r\nget jobs/t=abc\r\n", b"VALUE jobs 0 5\r\nhello\r\nEND\r\nCLIENT_ERROR bad t= value: t=abc\r\n"),
    # set, then an illegal name
    (b"set q 0 0 1\r\na\r\nset a/b 0 0 1\r\nb\r\n", b"STORED\r\nCLIENT_ERROR Queue name contains"),
    # a bad data chunk (3 declared, 5 sent): the STORED of the first 3 bytes comes first
    (b"set q 0 0 3\r\nhello\r\n", b"STORED\r\nCLIENT_ERROR empty command line\r\n"),
    # quit after a get: the VALUE, then the close, silently
    (b"get jobs\r\nquit\r\n", b"VALUE jobs 0 5\r\nhello\r\nEND\r\n"),
    # several earned replies, in order, across a pipeline
    (b"get jobs\r\nset q 0 0 1\r\nx\r\nget nothing\r\nfoo\r\n",
     b"VALUE jobs 0 5\r\nhello\r\nEND\r\nSTORED\r\nEND\r\nCLIENT_ERROR unknown command: foo\r\n"),
])
def test_memcache_earned_replies_come_before_the_error_and_the_close(rig, data, expected):
    rig.worker().queues["jobs"].append(b"hello")
    c = rig.connect()
    got = held_then_released(rig, c, data)
    assert got.startswith(expected), got
    assert got.count(b"\r\n") == expected.count(b"\r\n") + (0 if expected.endswith(b"\r\n") else 1)
    assert c.closed


def test_nothing_after_the_closing_command_is_taken(rig):
    c = rig.connect()
    w = rig.worker()
    w.queues["jobs"].extend([b"a", b"b"])
    held_then_released(rig, c, b"get jobs\r\nget /open\r\nget jobs\r\n")
    assert [r.queue for r in w.seen if r.op == m.OP_GET] == ["jobs"]
    assert list(w.queues["jobs"]) == [b"b"]


def test_a_closing_worker_reply_that_arrives_first_is_still_written_last(rig):
    """The fake worker refuses flush_all_expired with a closing CLIENT_ERROR; its answer
    arrives before the get's, but the get's VALUE is written first."""
    c = rig.connect()
    w = rig.worker()
    w.queues["jobs"].append(b"hello")
    w.hold = True
    c.send(b"get jobs\r\nflush_all_expired\r\n")
    rig.run()
    first, second = w.held
    w.held = [second]
    w.release()                    # the error comes back first ...
    rig.run()
    assert c.read() == b"" and not c.closed
    w.held = [first]
    w.release()                    # ... but is written after the earlier VALUE
    rig.run()
    assert c.read().startswith(b"VALUE jobs 0 5\r\nhello\r\nEND\r\nCLIENT_ERROR fake worker")
    assert c.closed


def test_disconnect_is_sent_when_the_connection_closes(rig):
    c = rig.connect()
    held_then_released(rig, c, b"get jobs/open\r\nbogus\r\n")
    assert c.conn.id in rig.worker().disconnects


@pytest.mark.parametrize("data, expected", [
    (b"put q:\nx\n\nget a/b\n", b"+1\n-Queue name contains"),
    (b"put q:\nx\n\nquit\n", b"+1\n"),
    (b"get jobs\nmonitor jobs abc\n", b":hello\n-"),
])
def test_text_earned_replies_come_before_the_close(rig, data, expected):
    rig.worker().queues["jobs"].append(b"hello")
    c = rig.connect(TextConn)
    got = held_then_released(rig, c, data)
    assert got.startswith(expected), got
    assert c.closed


# ----------------------------------------------------------------------------- thrift

def thrift_call(method: str, seqid: int, write_args) -> bytes:
    buf = TTransport.TMemoryBuffer()
    tr = TTransport.TFramedTransport(buf)
    p = TBinaryProtocol.TBinaryProtocol(tr)
    p.writeMessageBegin(method, TMessageType.CALL, seqid)
    p.writeStructBegin("args")
    write_args(p)
    p.writeFieldStop()
    p.writeStructEnd()
    p.writeMessageEnd()
    tr.flush()
    return buf.getvalue()


def put_args(queue: bytes, items: list[bytes]):
    def w(p):
        write_field(p, TType.STRING, 1, queue)
        write_collection(p, TType.LIST, 2, TType.STRING, items)
    return w


def test_thrift_reply_comes_before_the_close_of_an_unframeable_message(rig):
    c = rig.connect(ThriftConn)
    put = thrift_call("put", 7, put_args(b"q", [b"a", b"b"]))
    got = held_then_released(rig, c, put + b"\xff\xff\xff\xff")     # then a negative frame length
    assert len(got) > 4 and got[4:8] == b"\x80\x01\x00\x02"         # a REPLY ...
    assert got.endswith(b"\x00\x00\x00\x02\x00")                    # ... of put = 2, then STOP
    assert c.closed
    assert list(rig.worker().queues["q"]) == [b"a", b"b"]


def test_text_closes_when_the_worker_says_so(rig):
    """A worker failure that rolled the connection's open reads back (RF_CLOSE) closes a text
    connection too, after the replies before it; one that did not (no RF_CLOSE) keeps it."""
    w = rig.worker()
    w.queues["jobs"].append(b"hello")
    w.failures[m.OP_SET] = (m.R_SERVER_ERROR, 0, b"disk trouble (queue 'q')")
    c = rig.connect(TextConn)
    assert c.ask(b"put q:\nx\n\n") == b"-disk trouble (queue 'q')\n" and not c.closed
    w.failures[m.OP_SET] = (m.R_SERVER_ERROR, m.RF_CLOSE, b"No space left on device (queue 'q')")
    got = held_then_released(rig, c, b"get jobs\nput q:\nx\n\nget jobs\n")
    assert got == b":hello\n-No space left on device (queue 'q')\n"
    assert c.closed


def test_thrift_requests_carry_f_thrift(rig):
    c = rig.connect(ThriftConn)
    held_then_released(rig, c, thrift_call("put", 1, put_args(b"q", [b"a"])))
    assert all(r.flags & m.F_THRIFT for r in rig.worker().seen)
