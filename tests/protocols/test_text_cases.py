"""Every text-protocol case file, parsed whole, byte by byte and in random splits."""
import zlib

import pytest

from lanner.protocols import text
from lanner.protocols.text import ProtocolError, Quit, TextParser
from tests.protocols.casefiles import case_id, chunkings, load, run

NAMESPACE = vars(text)
VALID = load("text", "valid", NAMESPACE)
INVALID = load("text", "invalid", NAMESPACE)


def test_case_files_exist():
    assert len(VALID) >= 50 and len(INVALID) >= 5


@pytest.mark.parametrize("case", VALID + INVALID, ids=case_id)
def test_case(case):
    for name, chunks in chunkings(case.data, seed=zlib.crc32(case.path.name.encode())):
        for eager in (False, True):
            got = run(TextParser(), chunks, eager)
            assert got == case.expected, f"{case.title} [{name}, eager={eager}]"


@pytest.mark.parametrize("case", VALID + INVALID, ids=case_id)
def test_stopped_exactly_after_closing_results(case):
    parser = TextParser()
    got = run(parser, [case.data], eager=False)
    closing = bool(got) and isinstance(got[-1], (Quit, ProtocolError))
    assert parser.stopped == closing
