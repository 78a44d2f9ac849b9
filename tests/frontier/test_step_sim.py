"""The step-level simulator against what can be computed by hand or by queueing theory: one request alone, an
M/D/1 prefill queue, token conservation, and the three modes' ordering of inter-token latency."""
import numpy as np
import pytest
from inferlab.fleet.des import md1_sojourn
from inferlab.fleet.replica import StepTimeModel
from inferlab.frontier.step_sim import SimEngine, SimRequest, mixed_workload, simulate, step_seconds, summarize_sim

STEP = StepTimeModel(0.002, 1e-5, 1e-9, 0.004, 1e-7, 2e-5)

def test_one_request_alone_is_one_prefill_then_decodes():
    (r,) = simulate(STEP, [(1.0, 300, 5)])
    assert r.times[0] - 1.0 == pytest.approx(STEP.prefill_time(300, 300 ** 2))
    want = [STEP.decode_time(300 + k, 1) for k in range(1, 5)]          # each decode sees one more context token
    assert np.diff(r.times) == pytest.approx(want)

def test_chunked_prefill_splits_the_prompt_and_keeps_the_attention_sum():
    (r,) = simulate(STEP, [(0.0, 1000, 1)], max_num_batched_tokens=256)
    chunks = [256, 256, 256, 232]
    starts = np.cumsum([0] + chunks[:-1])
    want = sum(step_seconds(STEP, c, (s + c) ** 2 - s ** 2, 0, 0) for s, c in zip(starts, chunks))
    assert r.times[0] == pytest.approx(want)
    assert sum((s + c) ** 2 - s ** 2 for s, c in zip(starts, chunks)) == 1000 ** 2

def test_prefill_only_queue_is_md1():
    "One-token requests of one length, one per step, Poisson arrivals: the prefill engine is an M/D/1 queue."
    lam, d = 4.0, STEP.prefill_time(400, 400 ** 2)
    rng = np.random.default_rng(0)
    arrivals = np.cumsum(rng.exponential(1 / lam, 40_000))
    reqs = simulate(STEP, [(a, 400, 1) for a in arrivals], max_num_batched_tokens=400, enable_chunked_prefill=False)
    mean_ttft = np.mean([r.times[0] - r.arrival for r in reqs])
    assert mean_ttft == pytest.approx(md1_sojourn(lam, d), rel=0.05)

def test_every_token_comes_out_once_in_every_mode():
    work = mixed_workload(n=120, rate=20, short=(8, 64), long=(1500, 3000), long_fraction=0.2, output=12, seed=1)
    for kw in (dict(), dict(enable_chunked_prefill=False), dict(mode="disaggregated", transfer_s=lambda p: 1e-3)):
        reqs = simulate(STEP, work, max_num_seqs=16, **kw)
        assert all(len(r.times) == r.output and r.computed == r.prompt for r in reqs)
        assert all(np.all(np.diff(r.times) > 0) and r.times[0] > r.arrival for r in reqs)

def test_long_prefills_raise_the_aggregated_itl_tail_only():
    work = mixed_workload(n=300, rate=30, short=(8, 64), long=(3000, 4000), long_fraction=0.1, output=32, seed=2)
    agg = summarize_sim(simulate(STEP, work, enable_chunked_prefill=False, max_num_batched_tokens=4096))
    chunk = summarize_sim(simulate(STEP, work, max_num_batched_tokens=256))
    dis = summarize_sim(simulate(STEP, work, mode="disaggregated", max_num_batched_tokens=4096))
    assert max(dis["p999_itl_ms"], chunk["p999_itl_ms"]) < agg["p999_itl_ms"] / 3
    assert dis["median_itl_ms"] <= chunk["median_itl_ms"] * 1.05     # no chunk steps on the decode engine
    assert agg["p999_itl_ms"] > 0.8 * STEP.prefill_time(3000, 3000 ** 2) * 1e3     # a whole long prefill in one step

def test_bad_input_names_the_parameter():
    with pytest.raises(ValueError, match="mode"): simulate(STEP, [(0, 1, 1)], mode="split")
    with pytest.raises(ValueError, match="requests"): simulate(STEP, [(0, 0, 1)])
