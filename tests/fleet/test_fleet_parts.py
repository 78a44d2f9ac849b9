"Fleet layer parts: the generic Pareto front, the shared GPU table, a replica's closed-form decode, the controller."
import random
import numpy as np
import pytest
from inferlab.model.hardware import GPUSpec, GPUS, H200, gpu_spec, ridge_point
from inferlab.fleet.des import EventLoop
from inferlab.fleet.replica import (ReplicaSpec, ReplicaState, replica_from_roofline, start_prefill, end_prefill,
                                    next_completion, end_decodes)
from inferlab.fleet.autoscale import Controller, TrafficBased, KPA, replay
from inferlab.fleet.sim import FleetSimulator, simulate
from inferlab.fleet.traffic import make_workload
from inferlab.fleet.tuning import pareto_front, pareto_mask


def _dominated(r, rows, minimize, maximize):
    "Brute force: some other row is at least as good everywhere and better somewhere."
    def better_eq(o): return all(o[k] <= r[k] for k in minimize) and all(o[k] >= r[k] for k in maximize)
    def strictly(o): return any(o[k] < r[k] for k in minimize) or any(o[k] > r[k] for k in maximize)
    return any(better_eq(o) and strictly(o) for o in rows if o is not r)

@pytest.mark.parametrize("objectives", [(["cost"], ["slo"]), (["tpot_ms"], ["tok_s"]), (["cost", "ttft"], ["slo"]), ([], ["slo", "tok_s"])])
def test_pareto_front_matches_definition(objectives):
    minimize, maximize = objectives
    rng = random.Random(0)
    for _ in range(300):
        rows = [{k: rng.randint(0, 5) for k in ("cost", "slo", "tpot_ms", "tok_s", "ttft")} for _ in range(rng.randint(0, 10))]
        front = pareto_front(rows, minimize, maximize)
        values = lambda r: tuple(r[k] for k in (*minimize, *maximize))
        expected = {values(r) for r in rows if not _dominated(r, rows, minimize, maximize)}
        assert {values(r) for r in front} == expected and len(front) == len(expected)   # one row per point
        first = [r[(minimize or maximize)[0]] for r in front]
        assert first == sorted(first, reverse=not minimize)

def test_pareto_mask_marks_exactly_the_non_dominated_rows():
    rng = random.Random(1)
    for _ in range(300):
        rows = [{k: rng.randint(0, 4) for k in ("a", "b", "c")} for _ in range(rng.randint(0, 12))]
        mask = pareto_mask(rows, ["c"], ["a", "b"])
        assert mask == [not _dominated(r, rows, ["c"], ["a", "b"]) for r in rows]     # ties all stay on
    with pytest.raises(ValueError, match="tok_s: row 1 has None"): pareto_mask([{"tok_s": 1}, {"tok_s": None}], maximize=["tok_s"])

def test_pareto_front_old_call_sites():
    # chapter 64's cost/SLO front and chapter 72's latency/throughput front, as before
    assert [p["cost"] for p in pareto_front([{"cost": 1, "slo": .5}, {"cost": 2, "slo": .4}, {"cost": 3, "slo": .9}],
                                            minimize=["cost"], maximize=["slo"])] == [1, 3]
    pts = [dict(tpot_ms=10, tok_s=100), dict(tpot_ms=12, tok_s=300), dict(tpot_ms=15, tok_s=250), dict(tpot_ms=20, tok_s=500)]
    assert [p["tok_s"] for p in pareto_front(pts, minimize=["tpot_ms"], maximize=["tok_s"])] == [100, 300, 500]
    with pytest.raises(ValueError, match="objective"): pareto_front(pts)

def test_one_gpu_table():
    assert GPUSpec() == H200 == GPUS["H200"] and (H200.mem_gbps, H200.bf16_tflops, H200.int8_tops) == (4800, 989, 1979)
    assert round(ridge_point(H200)) == 206
    for name, g in GPUS.items():         # the fleet's roofline presets read the same table, by name or by object
        assert replica_from_roofline(name) == replica_from_roofline(g) and gpu_spec(name) is g
    spec = replica_from_roofline("H100", "llama-3-8b")
    assert abs(spec.step.decode_a - (0.002 + 16.06e9 / (3.35e12 * 0.7))) < 1e-4 and spec.price_per_gpu_hour == 3.0
    with pytest.raises(ValueError, match="gpu: 'V100' unknown"): replica_from_roofline("V100")
    with pytest.raises(ValueError, match="memory_gb"): GPUSpec(memory_gb=0)

def test_closed_form_decode_against_steps():
    spec = replica_from_roofline("H100", "llama-3-8b")
    rng = np.random.default_rng(0)
    prompt, output = rng.integers(100, 1300, 6).tolist(), rng.integers(2, 300, 6).tolist()
    r = ReplicaState(spec, prompt, output)
    for i in range(6): r.admit(i)
    t = start_prefill(r, 0.0); end_prefill(r, t)
    assert not r.waiting                                                # 6 prompts fit the 8,192-token budget
    done_at = {}
    while r.dec:
        t = next_completion(r, t)
        for i in end_decodes(r, t): done_at[i] = t
    # step by step: every running sequence gains a token per step; the step time follows the live context
    left, ctx, exact = {i: output[i] - 1 for i in range(6)}, {i: prompt[i] for i in range(6)}, {}
    tt = spec.step.prefill_time(sum(prompt), sum(p * p for p in prompt))
    while left:
        tt += spec.step.decode_time(sum(ctx[i] for i in left), len(left))
        for i in list(left):
            ctx[i] += 1; left[i] -= 1
            if left[i] == 0: exact[i] = tt; del left[i]
    assert done_at.keys() == exact.keys()
    for i in exact: assert abs(done_at[i] / exact[i] - 1) < 0.005, (i, done_at[i], exact[i])
    assert r.n == 0 and r.kv == 0

def test_simulator_runs_on_the_des_event_loop():
    sim = FleetSimulator(make_workload("code", rate=5, duration=60, seed=1))
    r = sim.run()
    assert isinstance(sim.loop, EventLoop) and len(sim.loop) == 0 and r.events > 0
    assert r.completed == r.arrivals == len(r.workload)

def test_controller_is_replays_and_the_simulators():
    ctl = Controller(KPA(target=10, target_utilization=0.7), replicas=3, tick=2.0)
    assert ctl.span == 62.0
    ts, ns = replay(TrafficBased(0, 100, 60, 0, 10, 0.7), lambda t: 70.0, 30, start=1)
    assert ns[-1] == 10 and len(ts) == 30
    r = simulate(make_workload("conversation", rate=4, duration=300, seed=2), policy=TrafficBased(1, 8, 30, 60, 8, 0.7), replicas=1)
    assert r.arrivals == r.completed + r.rejected + r.in_flight and r.ts_billed.max() >= 1
