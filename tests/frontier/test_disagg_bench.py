"""The served benchmark's harness: a real `inferlab serve` per mode, alternating repeats, metrics scraped, the
server stopped (never left behind); a server that cannot start is a clear error, not a hang."""
import os
import pytest
from inferlab.model.tokenizer import load_tokenizer
from inferlab.serve.bench import serve_requests
from inferlab.fleet.replica import StepTimeModel
from inferlab.frontier.disagg_bench import bench_modes, median_rows, served, sim_modes

def _servers() -> int:
    "This process's live `inferlab serve` children, from /proc."
    n = 0
    for d in filter(str.isdigit, os.listdir("/proc")):
        try: stat, cmd = open(f"/proc/{d}/stat").read(), open(f"/proc/{d}/cmdline").read()
        except OSError: continue
        fields = stat.rsplit(")", 1)[1].split()
        n += fields[1] == str(os.getpid()) and fields[0] != "Z" and "\0serve\0" in cmd
    return n

def test_bench_modes_alternates_and_reads_metrics():
    before = _servers()
    reqs = serve_requests(load_tokenizer(), 6, seed=0, prompt_len=(16, 32), output_len=(4, 0, 4, 4))
    modes = {"a": ["--max-num-batched-tokens", "64"], "b": ["--max-num-seqs", "2"]}
    seen = []                                           # servers alive when each row is logged: none, each was stopped
    rows = bench_modes(reqs, modes, repeats=2, request_rate=20, log=lambda line: seen.append(_servers()))
    assert [(r["repeat"], r["mode"]) for r in rows] == [(0, "a"), (0, "b"), (1, "b"), (1, "a")]
    assert all(r["failed"] == 0 and r["kv_bytes"] == 0 and r["output_throughput"] > 0 for r in rows)
    med = median_rows(rows)
    assert set(med) == {"a", "b"} and med["a"]["p99_itl_ms"] >= med["a"]["median_itl_ms"] > 0
    assert seen == [before] * 4 and _servers() == before

def test_a_server_that_cannot_start_is_an_error():
    with pytest.raises(RuntimeError, match="exited"):
        with served(["--max-num-seqs", "0"]): pass

def test_sim_modes_on_the_same_requests():
    reqs = serve_requests(load_tokenizer(), 30, seed=1, prompt_len=(16, 64), long=(0.2, 1100, 1500))
    res = sim_modes(StepTimeModel(0.002, 1e-5, 1e-9, 0.004, 1e-7, 2e-5), reqs, 5.0, transfer_s_per_token=1e-6)
    assert set(res) == {"aggregated", "chunked-256", "1P1D"}
    assert res["1P1D"]["p999_itl_ms"] < res["aggregated"]["p999_itl_ms"]
