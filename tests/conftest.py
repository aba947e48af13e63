import pytest

from engine.clock import FakeClock


@pytest.fixture
def clock():
    return FakeClock()
