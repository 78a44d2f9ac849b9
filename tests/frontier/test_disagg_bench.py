"""The served benchmark's harness: a real `inferlab serve` per mode, alternating repeats, metrics scraped, the
server stopped (never left behind); a server that cannot start is a clear error, not a hang."""
import contextlib, os
from types import SimpleNamespace
import pytest
from inferlab.model.tokenizer import load_tokenizer
from inferlab.serve.bench import serve_requests
from inferlab.fleet.replica import StepTimeModel
import inferlab.frontier.disagg_bench as db
from inferlab.frontier.disagg_bench import served, sim_modes

def _servers() -> int:
    "This process's live `inferlab serve` children, from /proc."
    n = 0
    for d in filter(str.isdigit, os.listdir("/proc")):
        try: stat, cmd = open(f"/proc/{d}/stat").read(), open(f"/proc/{d}/cmdline").read()
        except OSError: continue
        fields = stat.rsplit(")", 1)[1].split()
        n += fields[1] == str(os.getpid()) and fields[0] != "Z" and "\0serve\0" in cmd
    return n

def test_bench_modes_alternates_the_order(monkeypatch):
    "A B, then B A: drift on the machine falls on every mode alike (the servers faked: the order is the point)."
    started = []
    @contextlib.contextmanager
    def fake_served(args): started.append(args[0]); yield "http://fake", None
    monkeypatch.setattr(db, "served", fake_served)
    monkeypatch.setattr(db, "benchmark", lambda base, reqs, **kw: SimpleNamespace(results=[]))
    monkeypatch.setattr(db, "scrape", lambda base, name: 0.0)
    monkeypatch.setattr(db, "summarize", lambda run: dict(failed=0, **{k: 1.0 for k in db.KEYS}))
    rows = db.bench_modes([([1], 1)] * 3, {"a": ["A"], "b": ["B"]}, repeats=3, log=None)
    assert [(r["repeat"], r["mode"]) for r in rows] == [(0, "a"), (0, "b"), (1, "b"), (1, "a"), (2, "a"), (2, "b")]
    assert started == ["A", "B", "B", "A", "A", "B"]
    assert set(db.median_rows(rows)) == {"a", "b"}

def test_bench_modes_against_a_real_server():
    "One real `inferlab serve`: the figures come back, /metrics is read, and the server is gone when its row is."
    before, seen = _servers(), []
    reqs = serve_requests(load_tokenizer(), 6, seed=0, prompt_len=(16, 32), output_len=(4, 0, 4, 4))
    rows = db.bench_modes(reqs, {"a": ["--max-num-batched-tokens", "64"]}, repeats=1, request_rate=20,
                          log=lambda line: seen.append(_servers()))
    (r,) = rows
    assert r["failed"] == 0 and r["kv_bytes"] == 0 and r["output_throughput"] > 0 and r["p99_itl_ms"] >= r["median_itl_ms"] > 0
    assert seen == [before] and _servers() == before

def test_a_server_that_cannot_start_is_an_error():
    with pytest.raises(RuntimeError, match="exited"):
        with served(["--max-num-seqs", "0"]): pass

def test_sim_modes_on_the_same_requests():
    reqs = serve_requests(load_tokenizer(), 30, seed=1, prompt_len=(16, 64), long=(0.2, 1100, 1500))
    res = sim_modes(StepTimeModel(0.002, 1e-5, 1e-9, 0.004, 1e-7, 2e-5), reqs, 5.0, transfer_s_per_token=1e-6)
    assert set(res) == {"aggregated", "chunked-256", "1P1D"}
    assert res["1P1D"]["p999_itl_ms"] < res["aggregated"]["p999_itl_ms"]
