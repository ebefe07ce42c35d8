import pytest

from lamina.engine import Engine, FakeClock


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(1_700_000_000_000)


@pytest.fixture
def open_engine(tmp_path, clock):
    """Opens engines on one data directory; closes whatever is still open at the end."""
    opened: list[Engine] = []

    def _open(**options) -> Engine:
        options.setdefault("clock", clock)
        engine = Engine.open(tmp_path / "data", **options)
        opened.append(engine)
        return engine

    yield _open
    for engine in opened:
        engine.close()


@pytest.fixture
def engine(open_engine) -> Engine:
    return open_engine()
