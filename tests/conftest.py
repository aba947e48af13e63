import pytest

from lanner.clock import FakeClock


@pytest.fixture
def clock():
    return FakeClock()
