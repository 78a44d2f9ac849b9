import os
os.environ.setdefault("MPLBACKEND", "Agg")
import torch
# Without CUDA, Triton kernels can only run in Triton's interpreter, chosen before triton is first imported
# (transformers and the engine import it): set it here, before any test module is collected.
if not torch.cuda.is_available(): os.environ.setdefault("TRITON_INTERPRET", "1")

# pytest-xdist runs several workers on the machine's cores: each gets its share of them, as a serving process beside
# neighbours would. Every worker using every core oversubscribes the machine, and OpenMP threads that spin waiting for
# each other made the reference generate of tests/engine 15x slower than alone (124 s instead of 8 s).
_workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
if _workers > 1:
    _share = str(max(1, len(os.sched_getaffinity(0)) // _workers))
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"): os.environ[var] = _share   # children too
    torch.set_num_threads(int(_share))
    from threadpoolctl import threadpool_limits
    threadpool_limits(int(_share))
