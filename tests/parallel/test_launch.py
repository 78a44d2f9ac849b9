"torchrun launches (1 node × 2, 2 nodes × 1 on loopback) give the spawned engine's tokens; a killed worker is an error."
import json, os, signal, subprocess, sys, threading, time
from pathlib import Path
import pytest
from parallel_helpers import prompts
from inferlab.llm import LLM
from inferlab.model.sampling import SamplingParams
from inferlab.parallel.collectives import free_port

SCRIPT = Path(__file__).with_name("torchrun_generate.py")
TORCHRUN = Path(sys.executable).with_name("torchrun")

@pytest.fixture(scope="module")
def spawned():
    ps = prompts(24, seed=5)
    with LLM("tiny-dense", dtype="float32", tensor_parallel_size=2) as llm:
        return ps, [o.token_ids for o in llm.generate(ps, SamplingParams(max_tokens=12, temperature=0))]

def _run(cmds: list[list[str]], tmp_path) -> list[dict]:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    procs = [subprocess.Popen(c, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for c in cmds]
    try:
        logs = [p.communicate(timeout=180)[0] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None: p.kill(); p.wait()
    assert all(p.returncode == 0 for p in procs), "\n".join(logs)[-3000:]
    return [json.loads((tmp_path / f"out.json.{r}").read_text()) for r in range(2)]

def _check(results, want):
    for res in results:                                 # every rank returns rank 0's outputs
        assert res["tokens"] == want
        assert res["second"][3] == [[], "error"]        # token ids outside the vocabulary: refused on rank 0, reported to all
    assert results[0]["second"] == results[1]["second"]
    assert results[0]["engine"] == "SpmdLeader" and results[1]["engine"] == "FollowerEngine", results[1]["engine"]

def test_torchrun_one_node_two_processes(spawned, tmp_path, no_stray_processes):
    ps, want = spawned
    (tmp_path / "p.json").write_text(json.dumps(ps))
    cmd = [str(TORCHRUN), "--nproc-per-node", "2", "--master-addr", "127.0.0.1", "--master-port", str(free_port()),
           str(SCRIPT), "p.json", "out.json"]
    _check(_run([cmd], tmp_path), want)

def test_torchrun_two_nodes_one_process_each(spawned, tmp_path, no_stray_processes):
    ps, want = spawned
    (tmp_path / "p.json").write_text(json.dumps(ps))
    port = str(free_port())
    cmds = [[str(TORCHRUN), "--nnodes", "2", "--node-rank", str(n), "--nproc-per-node", "1", "--master-addr",
             "127.0.0.1", "--master-port", port, str(SCRIPT), "p.json", "out.json"] for n in (0, 1)]
    _check(_run(cmds, tmp_path), want)

def test_killed_worker_is_an_error_within_30s(no_stray_processes):
    llm = LLM("tiny-dense", dtype="float32", tensor_parallel_size=2)
    worker = llm.engine.runner.workers[0]
    threading.Timer(1.5, os.kill, (worker.pid, signal.SIGKILL)).start()
    t0 = time.monotonic()
    with pytest.raises(RuntimeError, match=r"worker rank 1 \(pid \d+\) exited with code -9"):
        llm.generate(prompts(64, seed=6), SamplingParams(max_tokens=300, temperature=0, ignore_eos=True))
    took = time.monotonic() - t0
    assert 1.5 < took < 30, took
    with pytest.raises(RuntimeError, match="cannot continue"):      # the engine stays failed, it does not hang
        llm.generate("hello", SamplingParams(max_tokens=2))
    llm.shutdown()
    assert not worker.is_alive()

def _script(tmp_path, body: str) -> subprocess.CompletedProcess:
    (tmp_path / "script.py").write_text(body)
    return subprocess.run([sys.executable, "script.py"], cwd=tmp_path, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})

def test_unguarded_script_fails_at_once_naming_the_guard(tmp_path, no_stray_processes):
    t0 = time.monotonic()
    run = _script(tmp_path, "from inferlab.llm import LLM\nllm = LLM('tiny-dense', tensor_parallel_size=2)\n"
                            "print(llm.generate('def f(')[0].text)\n")
    took = time.monotonic() - t0
    assert run.returncode == 1 and took < 15, (took, run.stderr[-2000:])
    assert 'script.py:2 runs at the script\'s top level' in run.stderr and 'if __name__ == "__main__":' in run.stderr

def test_worker_that_fails_to_load_ends_the_launch_with_its_error(monkeypatch, no_stray_processes):
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(Path(__file__).with_name("failing_worker")),
                                                      os.environ.get("PYTHONPATH", "")]))
    t0 = time.monotonic()
    with pytest.raises(RuntimeError, match=r"(?s)worker rank 1 failed while starting.*rank 1's copy is truncated"):
        LLM("tiny-dense", dtype="float32", tensor_parallel_size=2)
    assert time.monotonic() - t0 < 15
    from inferlab.parallel.engine import backend_threads
    import torch.distributed as dist
    assert not dist.is_initialized() and backend_threads() == []

def test_a_dropped_parallel_llm_gives_back_its_workers_and_group(no_stray_processes):
    import gc
    import torch.distributed as dist
    from inferlab.parallel.engine import backend_threads
    first = LLM("tiny-dense", dtype="float32", tensor_parallel_size=2)
    workers = list(first.engine.runner.workers)
    want = first.generate(["def add(a, b):"], SamplingParams(max_tokens=8, temperature=0))[0].token_ids
    del first; gc.collect()
    assert not any(p.is_alive() for p in workers) and not dist.is_initialized() and backend_threads() == []
    second = LLM("tiny-dense", dtype="float32", tensor_parallel_size=2)     # the same process, a new group
    assert second.generate(["def add(a, b):"], SamplingParams(max_tokens=8, temperature=0))[0].token_ids == want
    second.shutdown(); second.shutdown()                                   # idempotent

def test_exit_with_a_live_parallel_llm_is_clean(tmp_path, no_stray_processes):
    run = _script(tmp_path, "import os\nfrom inferlab.llm import LLM\nif __name__ == '__main__':\n"
                            "    llm = LLM('tiny-dense', dtype='float32', tensor_parallel_size=2)\n"
                            "    llm.generate('def f(', {'max_tokens': 4})\n"
                            "    print(*[p.pid for p in llm.engine.runner.workers])\n")     # exits with the LLM alive
    assert run.returncode == 0, run.stderr[-2000:]
    assert "terminate called" not in run.stderr
    for pid in map(int, run.stdout.split()):
        with pytest.raises(ProcessLookupError): os.kill(pid, 0)               # the worker went with it
