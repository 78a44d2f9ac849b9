"""`inferlab sweep`: the grid spans every knob, rows carry every field, a rerun skips what is done, the top-20 KL is
a KL, bad options exit 2. (Chapter 76 runs real configurations; here the measurement is faked where it costs.)"""
import json, math
import numpy as np
import pytest
import inferlab.frontier.sweep as sw
from inferlab.cli import main
from inferlab.llm import build_engine

def test_grid_spans_every_knob():
    "The default grid turns every knob but data parallelism; the factorial grid crosses the techniques, DP included."
    g, f = sw.default_grid(), sw.factorial_grid()
    assert len(g) == 48 == len({sw.config_key(c) for c in g})
    one_process = [k for k in sw.KNOBS if k != "data_parallel_size"]
    for k in one_process: assert len({json.dumps(c[k], sort_keys=True) for c in g}) > 1, k
    assert all(set(c) == set(one_process) for c in g) and all(set(c) == set(sw.KNOBS) for c in f)
    assert len(f) == 58 and {c["data_parallel_size"] for c in f} == {1, 2} and min(map(sw.techniques, f)) == 2

def test_top20_kl_is_the_renormalized_kl():
    rng = np.random.default_rng(0)
    lp = rng.normal(size=20); lq = lp + rng.normal(scale=0.3, size=20)
    ref, test = dict(enumerate(lp)), dict(enumerate(lq))
    p, q = np.exp(lp) / np.exp(lp).sum(), np.exp(lq) / np.exp(lq).sum()
    assert sw.top20_kl(ref, test) == pytest.approx(float((p * np.log(p / q)).sum()))
    assert sw.top20_kl(ref, ref) == pytest.approx(0, abs=1e-12)
    assert sw.top20_kl(ref, {0: 0.0, 99: -1.0}) > 3 * sw.top20_kl(ref, test)   # tokens test never listed get its floor

def test_sweep_is_resumable(tmp_path, monkeypatch):
    calls = []
    def fake(config):
        calls.append(config); return dict(config=config, output_throughput=1.0)
    monkeypatch.setattr(sw, "measure_config", fake)
    monkeypatch.setattr(sw, "evaluator", lambda *a, **k: fake)
    out, g = tmp_path / "r.jsonl", sw.default_grid((4, 8))[:5]
    assert len(sw.sweep(g[:3], out, build_engine, progress=False)) == 3
    assert len(sw.sweep(g, out, build_engine, progress=False)) == 2 and calls == g[:3] + g[3:]
    assert [json.loads(l)["config"] for l in out.read_text().splitlines()] == g

def test_run_workload_times_every_request():
    eng = build_engine(None, max_num_seqs=4)
    wl = [(list(range(5, 25)), 6), (list(range(30, 40)), 1), (list(range(50, 90)), 9)]
    r = sw.run_workload(eng, wl, slo_ttft=60.0, slo_tpot=60.0)
    assert r["output_throughput"] == pytest.approx(16 / r["wall_s"])
    assert 0 < r["ttft_p50"] <= r["ttft_p99"] and 0 < r["tpot_p50"] <= r["tpot_p99"] and r["itl_p99"] > 0
    assert r["goodput"] == pytest.approx(3 / r["wall_s"])                   # every request meets a 60 s SLO


def test_run_workload_at_a_rate_times_from_arrival():
    from inferlab.serve.bench import arrival_times
    eng = build_engine(None, max_num_seqs=4)
    wl = [(list(range(5, 25)), 4), (list(range(30, 40)), 3), (list(range(50, 90)), 5)]
    r = sw.run_workload(eng, wl, slo_ttft=60.0, slo_tpot=60.0, request_rate=5.0, seed=3)
    assert r["request_rate"] == 5.0 and len(r["requests"]) == 3 and [q[2] for q in r["requests"]] == [4, 3, 5]
    assert r["wall_s"] >= arrival_times(3, 5.0, 1.0, 3)[-1]                 # the last request was sent on schedule
    assert all(0 < q[0] < 1.0 for q in r["requests"])                       # TTFT from each one's arrival, not the start
    assert sw.goodput(r, 60.0, 60.0) == r["goodput"] == pytest.approx(3 / r["wall_s"])
    assert sw.goodput(r, 0.0, 60.0) == 0.0 and sw.goodput(r, 60.0, 0.0) == 0.0   # re-scored under SLOs nothing meets
    off = sw.run_workload(build_engine(None, max_num_seqs=4), wl)
    assert off["request_rate"] is None and off["wall_s"] < r["wall_s"]

@pytest.mark.parametrize("args, message", [(["--batch-sizes", "4,x"], "--batch-sizes"), (["--num-prompts", "0"], "--num-prompts"),
                                           (["--request-rate", "0"], "--request-rate")])
def test_bad_options_exit_2(capsys, tmp_path, args, message):
    assert main(["sweep", "--out", str(tmp_path / "r.jsonl"), *args]) == 2 and message in capsys.readouterr().err
