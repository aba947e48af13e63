"""Every memcache case file, parsed whole, byte by byte and in random splits."""
import zlib

import pytest

from lanner.protocols import memcache
from lanner.protocols.memcache import MemcacheParser, ProtocolError, Quit, Shutdown
from tests.protocols.casefiles import case_id, chunkings, load, run

NAMESPACE = vars(memcache)
VALID = load("memcache", "valid", NAMESPACE)
INVALID = load("memcache", "invalid", NAMESPACE)


def test_case_files_exist():
    assert len(VALID) >= 60 and len(INVALID) >= 50


@pytest.mark.parametrize("case", VALID + INVALID, ids=case_id)
def test_case(case):
    for name, chunks in chunkings(case.data, seed=zlib.crc32(case.path.name.encode())):
        for eager in (False, True):
            got = run(MemcacheParser(), chunks, eager)
            assert got == case.expected, f"{case.title} [{name}, eager={eager}]"


@pytest.mark.parametrize("case", VALID + INVALID, ids=case_id)
def test_stopped_exactly_after_closing_results(case):
    parser = MemcacheParser()
    got = run(parser, [case.data], eager=False)
    closing = bool(got) and (isinstance(got[-1], (Quit, Shutdown))
                             or (isinstance(got[-1], ProtocolError) and got[-1].close))
    assert parser.stopped == closing
    if closing:
        parser.feed(b"get q\r\n")
        assert parser.next() is None and parser.buffered == 0


@pytest.mark.parametrize("case", INVALID, ids=case_id)
def test_invalid_cases_all_end_in_an_error_or_wait(case):
    got = run(MemcacheParser(), [case.data], eager=False)
    assert not got or any(isinstance(c, ProtocolError) for c in got)
