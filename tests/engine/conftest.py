"""Fixtures shared by the in-process storage tests."""
import os

import pytest

from lanner.storage.writer import Writer


@pytest.fixture
def writer():
    """A worker's writer thread (storage/writer.py) whose wake-ups go into a pipe nobody reads."""
    r, w = os.pipe()
    wr = Writer(w)
    yield wr
    wr.close()
    os.close(r)
    os.close(w)
