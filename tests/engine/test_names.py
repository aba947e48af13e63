"""lanner.queues.names: the one place that decides which queue names are legal (issue 11,
defect 7: names that passed validation but failed on disk)."""
from __future__ import annotations

import os

import pytest

from lanner.queues.names import LONGEST_SUFFIX, MAX_FILE_NAME_BYTES, validate_queue_name

LATIN = "\xe9"          # the byte 0xE9 a client sent: two bytes on disk (UTF-8 C3 A9)


@pytest.mark.parametrize("name", ["a", "jobs+client1", "x" * MAX_FILE_NAME_BYTES,
                                  LATIN * (MAX_FILE_NAME_BYTES // 2), "with space", "UPPER",
                                  "a-b_c", "+child", "\x80\xff", "cmdlog2", "CMDLOG"])
def test_legal_queue_names(name):
    validate_queue_name(name)


@pytest.mark.parametrize("name, reason", [
    ("", "empty"), ("x" * 256, "too long"), ("a/b", "illegal"), ("a\\b", "illegal"), ("a.b", "illegal"),
    ("a~b", "illegal"), ("~~", "illegal"), ("a\x00", "illegal"), ("a\x1f", "illegal"), ("a\x7f", "illegal"),
    ("a\nb", "illegal"), ("\u0100", "above U+00FF"),
    # on disk: 237-255 ASCII bytes cannot take the journal's suffixes (main: they never rotated)
    ("x" * (MAX_FILE_NAME_BYTES + 1), "too long for a journal file name"),
    ("x" * 255, "too long for a journal file name"),
    # 128-255 bytes of 0x80-0xFF are 256-510 bytes on disk (main: ENAMETOOLONG and the path)
    (LATIN * 128, "too long for a journal file name"),
    (LATIN * (MAX_FILE_NAME_BYTES // 2 + 1), "too long for a journal file name"),
    ("cmdlog", "reserved"),
])
def test_illegal_queue_names(name, reason):
    with pytest.raises(ValueError) as e:
        validate_queue_name(name)
    assert reason in str(e.value)


def test_the_longest_legal_name_takes_every_journal_suffix(tmp_path):
    """The limit is the real one: the longest legal name with the longest suffix is a file."""
    for name in ("x" * MAX_FILE_NAME_BYTES, LATIN * (MAX_FILE_NAME_BYTES // 2)):
        for suffix in ("", ".1700000000000", ".1700000000000.pack", "~~1700000000000",
                       "~~1700000000000.tmp"):
            assert len(suffix) <= LONGEST_SUFFIX
            open(tmp_path / (name + suffix), "wb").close()
    with pytest.raises(OSError):
        open(tmp_path / ("x" * (MAX_FILE_NAME_BYTES + 1) + ".1700000000000.pack"), "wb")
    assert len(os.listdir(tmp_path)) == 10


def test_command_log_queues_may_have_dots_and_long_names():
    validate_queue_name("email.send", allow_dots=True)
    validate_queue_name("x" * 255, allow_dots=True)
    validate_queue_name(LATIN * 255, allow_dots=True)
    validate_queue_name("cmdlog", allow_dots=True)
    for bad in ("a/b", "a\\b", "a~b", "a\x01", "", "x" * 256):
        with pytest.raises(ValueError):
            validate_queue_name(bad, allow_dots=True)
