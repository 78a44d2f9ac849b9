"The owner of the CPU thread pools: per-step sizes, restoring them, and quieting OpenBLAS's idle workers."
import os
import numpy as np
import pytest
import torch
from threadpoolctl import ThreadpoolController
from inferlab.engine import cpu_threads
from inferlab.engine.cpu_threads import CpuThreads, quiet_blas_workers, BLAS_SPIN_EXPONENT

def openblas(blas): return [l for l in blas.lib_controllers if l.internal_api == "openblas"
                            and getattr(l, "threading_layer", "") == "pthreads"]

def test_step_sizes_the_pools_and_gives_them_back():
    t = CpuThreads(interval=60.0)
    saved = (torch.get_num_threads(), [l.get_num_threads() for l in t.blas.lib_controllers])
    with t.step(decode=True):
        assert t.current == (1, t.budget) and torch.get_num_threads() == 1
    with pytest.raises(RuntimeError):
        with t.step(decode=False):
            assert t.current == (t.budget, 1)
            raise RuntimeError("a failing step")
    assert (torch.get_num_threads(), [l.get_num_threads() for l in t.blas.lib_controllers]) == saved

def test_quiet_blas_workers_once_per_library_and_blas_still_right():
    blas = ThreadpoolController().select(user_api="blas")
    if not openblas(blas): pytest.skip("NumPy's BLAS here is not a pthreads OpenBLAS")
    assert quiet_blas_workers(blas, force=True) == [l.filepath for l in openblas(blas)]
    assert os.environ["OPENBLAS_THREAD_TIMEOUT"] == str(BLAS_SPIN_EXPONENT) and quiet_blas_workers(blas) == []
    a, b = np.random.default_rng(0).random((300, 300)), np.random.default_rng(1).random((300, 300))
    assert np.allclose(a @ b, (torch.from_numpy(a) @ torch.from_numpy(b)).numpy())   # workers start again
    assert [l.get_num_threads() for l in openblas(blas)] == [l.num_threads for l in openblas(blas)]

def test_quiet_blas_workers_keeps_the_users_setting(monkeypatch):
    blas = ThreadpoolController().select(user_api="blas")
    monkeypatch.setattr(cpu_threads, "_USER_TIMEOUT", "30")
    monkeypatch.setenv("OPENBLAS_THREAD_TIMEOUT", "30")
    assert quiet_blas_workers(blas) == [] and os.environ["OPENBLAS_THREAD_TIMEOUT"] == "30"

@pytest.mark.parametrize("bad", [3, 31, 2.5, "22", True])
def test_quiet_blas_workers_refuses_an_exponent_openblas_would_not_take(bad):
    with pytest.raises(ValueError, match="exponent: OpenBLAS accepts 4..30"):
        quiet_blas_workers(ThreadpoolController().select(user_api="blas"), bad)

def test_first_budget_counts_whoever_runs_now(monkeypatch):
    "Before its first interval is measured, the owner sizes itself by the other threads running at that instant."
    from inferlab.engine import cpu_threads
    for now, want in ((None, "max"), (0, "max"), (10 ** 6, 1)):
        monkeypatch.setattr(cpu_threads, "running_elsewhere", lambda now=now: now)
        t = cpu_threads.CpuThreads()
        assert t.budget == (t.max_threads if want == "max" else want)

def test_running_elsewhere_sees_a_busy_process():
    from inferlab.engine.cpu_threads import running_elsewhere
    from inferlab.frontier.bench import BusyLoad
    if running_elsewhere() is None: pytest.skip("no /proc")
    with BusyLoad(1):
        seen = [running_elsewhere() for _ in range(20)]
    assert max(seen) >= 1                                   # the busy loop is running or ready, every instant
