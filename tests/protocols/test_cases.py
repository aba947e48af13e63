"""Every protocol case file (memcache, text and thrift), parsed whole, byte by byte and in random
splits.  The three protocols share one set of checks, so a property proved for one parser is
proved for all; what differs between them (the parser, which result closes the connection, a
probe to feed after it) is declared once per protocol in PROTOCOLS.

The thrift cases (framed TBinaryProtocol requests written by the `thrift` package) may use two
matchers besides the protocol's own classes: `Stop()` for any ProtocolError (the connection
closes; the reason is free text) and `Bad(method, seqid, type)` for a BadCall whose message is
free text (PROTOCOL_ERROR details)."""
import zlib
from dataclasses import dataclass
from typing import Callable

import pytest

from lanner.protocols import memcache, text, thrift
from tests.protocols.casefiles import case_id, chunkings, load, run


class Stop:
    def __eq__(self, other) -> bool:
        return isinstance(other, thrift.ProtocolError) and bool(other.reason)

    def __repr__(self) -> str:
        return "Stop()"


class Bad:
    def __init__(self, method: str, seqid: int, exc_type: int) -> None:
        self.key = (method, seqid, exc_type)

    def __eq__(self, other) -> bool:
        return isinstance(other, thrift.BadCall) and (other.method, other.seqid, other.exc_type) == self.key \
            and bool(other.message)

    def __repr__(self) -> str:
        return "Bad%r" % (self.key,)


@dataclass
class Protocol:
    parser: type
    namespace: dict
    min_valid: int
    min_invalid: int
    closes: Callable[[object], bool]     # does this result end the connection?
    probe: bytes                         # a request fed after closing must not be parsed


PROTOCOLS = {
    "memcache": Protocol(memcache.MemcacheParser, vars(memcache), 60, 50,
                         lambda r: isinstance(r, (memcache.Quit, memcache.Shutdown))
                         or (isinstance(r, memcache.ProtocolError) and r.close), b"get q\r\n"),
    "text": Protocol(text.TextParser, vars(text), 50, 5,
                     lambda r: isinstance(r, (text.Quit, text.ProtocolError)), b"get q\r\n"),
    "thrift": Protocol(thrift.ThriftParser, {**vars(thrift), "Stop": Stop, "Bad": Bad}, 20, 10,
                       lambda r: isinstance(r, thrift.ProtocolError), b"\x00\x00\x00\x01\x00"),
}
CASES = {(name, kind): load(name, kind, proto.namespace)
         for name, proto in PROTOCOLS.items() for kind in ("valid", "invalid")}


def params(*kinds: str, protocols=tuple(PROTOCOLS)) -> list:
    return [pytest.param(PROTOCOLS[name], case, id=f"{name}/{case_id(case)}")
            for name in protocols for kind in kinds for case in CASES[name, kind]]


@pytest.mark.parametrize("name", PROTOCOLS)
def test_case_files_exist(name):
    proto = PROTOCOLS[name]
    assert len(CASES[name, "valid"]) >= proto.min_valid and len(CASES[name, "invalid"]) >= proto.min_invalid


@pytest.mark.parametrize("proto, case", params("valid", "invalid"))
def test_case(proto, case):
    for name, chunks in chunkings(case.data, seed=zlib.crc32(case.path.name.encode())):
        for eager in (False, True):
            got = run(proto.parser(), chunks, eager)
            assert got == case.expected, f"{case.title} [{name}, eager={eager}]"


@pytest.mark.parametrize("proto, case", params("valid", "invalid"))
def test_stopped_exactly_after_closing_results(proto, case):
    parser = proto.parser()
    got = run(parser, [case.data], eager=False)
    closing = bool(got) and proto.closes(got[-1])
    assert parser.stopped == closing
    if closing:
        parser.feed(proto.probe)
        assert parser.next() is None and parser.buffered == 0


@pytest.mark.parametrize("proto, case", params("invalid", protocols=("memcache",)))
def test_invalid_cases_all_end_in_an_error_or_wait(proto, case):
    got = run(proto.parser(), [case.data], eager=False)
    assert not got or any(isinstance(c, memcache.ProtocolError) for c in got)


@pytest.mark.parametrize("proto, case", params("valid", protocols=("thrift",)))
def test_valid_cases_yield_no_errors(proto, case):
    got = run(proto.parser(), [case.data], eager=False)
    assert got and not any(isinstance(c, (thrift.ProtocolError, thrift.BadCall)) for c in got)
