import pytest
from hypothesis import settings

from lamina.engine import Engine, FakeClock

# The suite (and CI) draws the same examples on every run, so a pass or a failure is
# reproducible and a discrepancy found while exploring never makes CI flaky. To look for new
# ones: ``LAMINA_MODEL_EXAMPLES=3000 python -m pytest tests/engine -k Model
# --hypothesis-profile=explore`` (random examples; failures kept in .hypothesis/ and replayed
# first).
settings.register_profile("suite", derandomize=True, database=None)
settings.register_profile("explore", print_blob=True)
settings.load_profile("suite")


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
