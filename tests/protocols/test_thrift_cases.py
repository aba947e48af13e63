"""Every thrift case file (framed TBinaryProtocol requests written by the `thrift` package),
parsed whole, byte by byte and in random splits, like the memcache and text cases.

Case files may use two matchers besides the protocol's own classes: `Stop()` for any
ProtocolError (the connection closes; the reason is free text) and `Bad(method, seqid, type)`
for a BadCall whose message is free text (PROTOCOL_ERROR details)."""
import zlib

import pytest

from lanner.protocols import thrift
from lanner.protocols.thrift import BadCall, ProtocolError, ThriftParser
from tests.protocols.casefiles import case_id, chunkings, load, run


class Stop:
    def __eq__(self, other) -> bool:
        return isinstance(other, ProtocolError) and bool(other.reason)

    def __repr__(self) -> str:
        return "Stop()"


class Bad:
    def __init__(self, method: str, seqid: int, exc_type: int) -> None:
        self.key = (method, seqid, exc_type)

    def __eq__(self, other) -> bool:
        return isinstance(other, BadCall) and (other.method, other.seqid, other.exc_type) == self.key \
            and bool(other.message)

    def __repr__(self) -> str:
        return "Bad%r" % (self.key,)


NAMESPACE = {**vars(thrift), "Stop": Stop, "Bad": Bad}
VALID = load("thrift", "valid", NAMESPACE)
INVALID = load("thrift", "invalid", NAMESPACE)


def test_case_files_exist():
    assert len(VALID) >= 20 and len(INVALID) >= 10


@pytest.mark.parametrize("case", VALID + INVALID, ids=case_id)
def test_case(case):
    for name, chunks in chunkings(case.data, seed=zlib.crc32(case.path.name.encode())):
        for eager in (False, True):
            got = run(ThriftParser(), chunks, eager)
            assert got == case.expected, f"{case.title} [{name}, eager={eager}]"


@pytest.mark.parametrize("case", VALID + INVALID, ids=case_id)
def test_stopped_exactly_after_a_protocol_error(case):
    parser = ThriftParser()
    got = run(parser, [case.data], eager=False)
    assert parser.stopped == (bool(got) and isinstance(got[-1], ProtocolError))
    if parser.stopped:
        parser.feed(b"\x00\x00\x00\x01\x00")
        assert parser.next() is None and parser.buffered == 0


@pytest.mark.parametrize("case", VALID, ids=case_id)
def test_valid_cases_yield_no_errors(case):
    got = run(ThriftParser(), [case.data], eager=False)
    assert got and not any(isinstance(c, (ProtocolError, BadCall)) for c in got)
