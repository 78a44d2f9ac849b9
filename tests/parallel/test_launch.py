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
    worker = llm.engine.workers[0]
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
