"The no-stray-processes fixture of the parallel tests."
import multiprocessing
import pytest
from parallel_helpers import children

@pytest.fixture
def no_stray_processes():
    before = set(children())
    yield
    for p in multiprocessing.active_children(): p.join(timeout=5)
    assert set(children()) - before == set(), "a worker process outlived its test"
