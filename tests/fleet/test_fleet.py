"Fleet layer (chapters 6x): queueing-theory validation, conservation under outages, autoscalers, presets, CLI."
import io, contextlib, json, math
import numpy as np
import pytest
from inferlab.fleet.des import erlang_c, erlang_c_wait, md1_sojourn
from inferlab.fleet.traffic import make_workload, compare_to_azure, Workload
from inferlab.fleet.replica import ReplicaSpec, StepTimeModel, replica_from_roofline, fit_step_time
from inferlab.fleet.autoscale import TrafficBased, KPA, HPA, RayServe, MetricWindow, initial_state
from inferlab.fleet.sim import simulate, queueing_check, FleetSimulator, Cluster, Pool, Outage
from inferlab.fleet.results import REJECT_REASONS
from inferlab.fleet.multicloud import default_clusters, regional_workload, siloed, unified, compare
from inferlab.fleet.cli import main

W = MetricWindow.constant

def test_erlang_c_vectors():
    assert abs(erlang_c(2, 1.5, 1) - 0.642857) < 1e-6 and abs(erlang_c_wait(2, 1.5, 1) - 1.285714) < 1e-6
    assert abs(erlang_c(8, 6, 1) - 0.356981) < 1e-6 and abs(erlang_c_wait(8, 6, 1) - 0.178491) < 1e-6
    assert md1_sojourn(0.5, 1.0) == 1.5

@pytest.mark.parametrize("c,lam", [(2, 1.5), (8, 6.0)])
def test_fleet_matches_erlang_c(c, lam):
    # eight seeded runs of 250k requests: the fleet as an M/M/c queue (batch 1, exponential service)
    q = queueing_check(c, lam, n=250_000, seeds=range(8))
    print(f"c={c}: fleet Wq {q['wq']:.4f} vs Erlang C {erlang_c_wait(c, lam, 1):.4f}; Little {q['little']:.4f}")
    assert abs(q["wq"] / erlang_c_wait(c, lam, 1) - 1) < 0.02
    assert abs(q["little"] - 1) < 0.01

def test_fleet_matches_md1():
    q = queueing_check(1, 0.5, 1.0, n=200_000, seeds=range(2), deterministic=True)
    assert abs(q["sojourn"] / 1.5 - 1) < 0.02 and abs(q["little"] - 1) < 0.01

def _conserved(r):
    return r.arrivals == r.completed + r.rejected + r.in_flight

@pytest.mark.parametrize("retry", [True, False])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_conservation_under_outage(seed, retry):
    w = make_workload("code", rate=25, duration=400, seed=seed)
    spec = replica_from_roofline("H100", "llama-3-8b", max_num_seqs=16, provision_s=10)
    clusters = [Cluster("a", capacity=4), Cluster("b", capacity=3, price_per_hour=5.0)]
    pool = Pool("p", ("a", "b"), KPA(target=6, target_utilization=0.7, min_scale=1, max_scale=7), 3)
    # the outage hits mid-run and never ends; stop the clock early so requests are still in flight
    r = FleetSimulator(w, spec, pools=[pool], clusters=clusters, outages=[Outage("a", 100 + 50 * seed)],
                       queue_timeout=30, max_queue=400, horizon=380, retry_on_failure=retry).run()
    assert _conserved(r) and r.arrivals == (w.t <= 380).sum() < len(w)
    assert r.in_flight > 0 and r.end == 380          # the clock stopped with requests still arriving
    reasons = r.rejected_by_reason()
    assert sum(reasons.values()) == r.rejected
    if retry: assert r.retries > 0 and reasons["replica_failure"] == 0
    else: assert reasons["replica_failure"] > 0
    # every completed request has first-token <= done, both after arrival
    ok = r.status == 1
    assert np.all(r.ttft_t[ok] >= w.t[ok] - 1e-9) and np.all(r.done_t[ok] >= r.ttft_t[ok] - 1e-9)

def test_conservation_multicloud_and_rejections():
    w = regional_workload(6.0, 900.0, seed=3)
    res = compare(w, replica_from_roofline("H100", "llama-3-8b", max_num_seqs=32, provision_s=30),
                  TrafficBased(1, 4, 60, 120, 16, 0.7), default_clusters(3, 2),
                  outages=[Outage("aws/us-east-1", 200, 500)], queue_timeout=30)
    for s, r in res.values(): assert _conserved(r)
    assert res["unified pool"][0]["slo_attainment"] > res["silos"][0]["slo_attainment"]
    # too long for any KV cache, and a full queue
    tiny = ReplicaSpec(kv_capacity_tokens=1000, max_num_seqs=1)
    w2 = Workload(np.arange(50) * 0.01, np.full(50, 400), np.full(50, 400))
    w2.prompt[0] = 5000
    r = simulate(w2, tiny, replicas=1, max_queue=5)
    assert _conserved(r) and r.rejected_by_reason()["too_long"] == 1 and r.rejected_by_reason()["queue_full"] > 0

def test_deterministic():
    a = simulate(make_workload("conversation", rate=10, duration=200, seed=4), replicas=2,
                 policy=TrafficBased(1, 5, 30, 60, 8, 0.7))
    b = simulate(make_workload("conversation", rate=10, duration=200, seed=4), replicas=2,
                 policy=TrafficBased(1, 5, 30, 60, 8, 0.7))
    assert np.array_equal(a.done_t, b.done_t, equal_nan=True) and a.cost() == b.cost()

@pytest.mark.parametrize("name", ["conversation", "code"])
def test_presets_match_azure(name):
    for f, q, sim, ref, err in compare_to_azure(make_workload(name, duration=20_000, seed=1), name):
        if q in (50, 90): assert abs(err) < 0.10, (f, q, sim, ref)

def test_traffic_based_cases():
    tb = TrafficBased(0, 100, 60, 0, 10, 0.7)
    assert [tb.decide(initial_state(1), W(c, 100), 100)[0] for c in (35, 36, 7, 0.1, 0)] == [5, 6, 1, 1, 0]
    d = TrafficBased(0, 100, 60, 300, 10, 0.7)
    _, st = d.decide(initial_state(5), W(7, 0), 0)
    assert d.decide(st, W(7, 299), 299)[0] == 5 and d.decide(st, W(7, 300), 300)[0] == 1

def test_kpa_panic_cases():
    k = KPA(target=10, target_utilization=0.7)
    win = lambda stable, panic, now: MetricWindow.of({**{now - i: stable for i in range(6, 60)}, **{now - i: panic for i in range(6)}})
    n, st = k.decide(initial_state(10), win(40, 140, 100), 100)
    assert n == 20 and st["panic_time"] == 100
    n, st = k.decide({**st, "current": 20, "ready": 20}, win(40, 40, 130), 130)
    assert n == 20                                      # no scale-down while panicking
    n, st = k.decide({**st, "current": 20, "ready": 20}, win(40, 40, 161), 161)
    assert n == 10 and st["panic_time"] is None         # exit panic, at most halved
    n, _ = k.decide(initial_state(3), win(21, 21, 0), 0)
    assert n == 3                                       # ceil(21/7)=3, 3/3 < 2: no panic
    assert KPA(target=10, target_utilization=0.7, max_scale=5).decide(initial_state(1), win(700, 700, 0), 0)[0] == 5

def test_hpa_cases():
    h = HPA(target_utilization=0.5, capacity=10, min_replicas=2, max_replicas=50)
    assert h.decide(initial_state(4), W(20, 0), 0)[0] == 4          # exactly on target
    assert h.decide(initial_state(4), W(21.9, 0), 0)[0] == 4        # ratio 1.095: inside tolerance
    assert h.decide(initial_state(4), W(30, 0), 0)[0] == 6          # ceil(4 * 1.5)
    assert h.decide(initial_state(10), W(0, 0), 0)[0] == 10         # a down recommendation of 2 waits 300 s...
    _, st = h.decide(initial_state(10), W(50, 0), 0)
    assert h.decide({**st, "current": 10}, W(0, 301), 301)[0] == 2  # ...then drops to min_replicas

def test_ray_serve_cases():
    rs = RayServe(min_replicas=1, max_replicas=20, target_ongoing_requests=2, upscale_delay_s=3, downscale_delay_s=5, interval=1.0)
    assert rs.desired_replicas(8, 2) == 4 and rs.desired_replicas(1, 4) == 1 and rs.desired_replicas(100, 4) == 20
    st = initial_state(2)
    outs = []
    for t in range(5):
        n, st = rs.decide(st, W(8, t), t); outs.append(n); st = {**st, "current": n, "ready": n}
    assert outs == [2, 2, 2, 4, 4]                      # applied on the 4th consecutive tick (> 3/1)
    st = initial_state(4); outs = []
    for t in range(8):
        n, st = rs.decide(st, W(2, t), t); outs.append(n); st = {**st, "current": n, "ready": n}
    assert outs[:5] == [4] * 5 and outs[5] == 1         # 6th down-tick (> 5/1)

def test_step_time_fit_table():
    truth = StepTimeModel(0.01, 3e-5, 0, 0.007, 5e-8, 3e-5)
    rows = [{"kind": "prefill", "num_tokens": n, "sum_sq_len": n * n, "step_time_s": truth.prefill_time(n, n * n)} for n in (100, 500, 1000, 4000)]
    rows += [{"kind": "decode", "context_tokens": b * 1000, "batch_size": b, "step_time_s": truth.decode_time(b * 1000, b)} for b in (1, 8, 32, 128)]
    fit, mape = fit_step_time(rows)
    assert abs(fit.decode_a - 0.007) < 1e-9 and mape["decode"] < 1e-6

def test_cli_runs_and_validates():
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["simulate", "--traffic", "code", "--rate", "20", "--policy", "kpa", "--duration", "120", "--json"]) == 0
    s = json.loads(out.getvalue())
    assert s["requests"] == s["completed"] + s["rejected"] + s["in_flight"] > 0
    for pol in ("fixed", "traffic", "hpa", "ray"):
        with contextlib.redirect_stdout(io.StringIO()):
            assert main(["--policy", pol, "--duration", "60", "--rate", "3"]) == 0
    err = io.StringIO()
    with contextlib.redirect_stderr(err): assert main(["--concurrency-target", "0"]) == 2
    assert "--concurrency-target" in err.getvalue()

from hypothesis import given, settings, strategies as st

@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000), rate=st.floats(1, 40), cap_a=st.integers(0, 4), cap_b=st.integers(1, 4),
       start=st.floats(0, 200), length=st.floats(1, 400), policy=st.sampled_from(["kpa", "traffic", "hpa", "ray", None]),
       retry=st.booleans(), max_queue=st.integers(0, 200), horizon=st.floats(50, 500))
def test_conservation_property(seed, rate, cap_a, cap_b, start, length, policy, retry, max_queue, horizon):
    w = make_workload("code", rate=rate, duration=300, seed=seed)
    pol = {"kpa": KPA(target=4, target_utilization=0.7, min_scale=0, max_scale=6),
           "traffic": TrafficBased(0, 6, 30, 30, 4, 0.7),
           "hpa": HPA(capacity=4, max_replicas=6),
           "ray": RayServe(min_replicas=0, max_replicas=6, target_ongoing_requests=3, upscale_delay_s=4, downscale_delay_s=10),
           None: None}[policy]
    spec = ReplicaSpec(max_num_seqs=8, kv_capacity_tokens=60_000, provision_s=5, image_pull_s=1, weight_load_s=1)
    clusters = [Cluster("a", capacity=cap_a), Cluster("b", capacity=cap_b, price_per_hour=4.0)]
    r = FleetSimulator(w, spec, pools=[Pool("p", ("a", "b"), pol, 1)], clusters=clusters,
                       outages=[Outage("b", start, start + length)], queue_timeout=20, max_queue=max_queue,
                       horizon=horizon, retry_on_failure=retry).run()
    assert r.arrivals == r.completed + r.rejected + r.in_flight == (w.t <= horizon).sum()
    assert r.cost() >= 0 and np.all(r.replicas[:, 1] >= r.replicas[:, 0])
