"The routing policies of chapter 58a: Dynamo's KV cost by hand, ties, round-robin and least-loaded order, softmax sampling, the hit counters, KV events, the workload."
import math
import pytest
from inferlab.engine.block_manager import BlockManager, chain_hashes
from inferlab.engine.sequence import Sequence
from inferlab.model.tokenizer import load_tokenizer
from inferlab.serve.kv_routing import (ROUTER_MODES, ReplicaLoad, RoutingPolicy, apply_kv_events, format_rows,
                                       shared_prefix_workload)

def test_kv_cost_by_hand():
    loads = [ReplicaLoad(2, 10), ReplicaLoad(5, 5), ReplicaLoad(8, 9)]            # Dynamo's documented example
    assert [RoutingPolicy().cost(l, 10) for l in loads] == [18, 10, 11]
    assert RoutingPolicy().choose(loads, 10) == 1
    heavy = RoutingPolicy(kv_overlap_score_weight=4)                            # 4 × (10 - overlap) + active
    assert [heavy.cost(l, 10) for l in loads] == [42, 25, 17] and heavy.choose(loads, 10) == 2
    assert [RoutingPolicy(kv_overlap_score_weight=0).cost(l, 10) for l in loads] == [10, 5, 9]
    assert RoutingPolicy().cost(ReplicaLoad(12, 3), 10.5) == 3                  # more cached than asked: no negative
    assert RoutingPolicy().cost(ReplicaLoad(0, 0), 100 / 16) == 6.25            # fractional blocks, as Dynamo's

def test_ties_go_to_fewer_requests_then_the_lower_index():
    p = RoutingPolicy()
    assert p.choose([ReplicaLoad(0, 4, 3), ReplicaLoad(0, 4, 1), ReplicaLoad(0, 4, 1)], 2) == 1
    assert p.choose([ReplicaLoad(0, 4, 1), ReplicaLoad(0, 4, 1)], 2) == 0
    assert p.choose([ReplicaLoad(0, 5, 0), ReplicaLoad(0, 4, 9)], 2) == 1       # the cost first, whatever the count

def test_round_robin_and_least_loaded():
    rr = RoutingPolicy("round_robin")
    loads = [ReplicaLoad(9, 0), ReplicaLoad(0, 100), ReplicaLoad(0, 0)]
    assert [rr.choose(loads, 9) for _ in range(7)] == [0, 1, 2, 0, 1, 2, 0]      # blind to cache and load
    assert rr.choose(loads[:2], 9) == 1                                          # (the 8th call) modulo the replicas
    ll = RoutingPolicy("least_loaded")
    assert ll.choose([dict(num_requests=2, free_blocks=50), dict(num_requests=1, free_blocks=1)]) == 1
    assert ll.choose([dict(num_requests=1, free_blocks=5), dict(num_requests=1, free_blocks=9)]) == 1
    assert ll.choose([dict(num_requests=1, free_blocks=9, overlap_blocks=0), dict(num_requests=1, free_blocks=9,
                                                                               overlap_blocks=40)]) == 0

@pytest.mark.parametrize("kw,match", [
    (dict(router_mode="random"), r"^router_mode: 'random' is not a routing policy; valid: kv, round_robin, least_loaded$"),
    (dict(kv_overlap_score_weight=-0.5), r"^kv_overlap_score_weight: must be a number >= 0, got -0.5$"),
    (dict(kv_overlap_score_weight=float("nan")), r"^kv_overlap_score_weight: must be a number >= 0"),
    (dict(kv_overlap_score_weight=True), r"^kv_overlap_score_weight: must be a number >= 0, got True$"),
    (dict(router_temperature=float("inf")), r"^router_temperature: must be a number >= 0")])
def test_bad_settings_are_refused_by_name(kw, match):
    with pytest.raises(ValueError, match=match): RoutingPolicy(**kw)

def test_no_replica_is_an_error():
    with pytest.raises(ValueError, match="^loads: there is no replica"): RoutingPolicy().choose([], 3)

def test_temperature_samples_the_softmax_of_rescaled_costs():
    p = RoutingPolicy(router_temperature=0.5, seed=3)
    loads = [ReplicaLoad(0, 0), ReplicaLoad(0, 5), ReplicaLoad(0, 10)]           # rescaled: 0, 0.5, 1
    n = 30000
    draws = [p.choose(loads, 1) for _ in range(n)]
    w = [math.exp(-x / 0.5) for x in (0, 0.5, 1)]
    for i in range(3): assert abs(draws.count(i) / n - w[i] / sum(w)) < 0.012
    same = RoutingPolicy(router_temperature=1.0, seed=0)
    draws = [same.choose([ReplicaLoad(), ReplicaLoad()], 1) for _ in range(4000)]   # equal costs: uniform
    assert abs(draws.count(0) / 4000 - 0.5) < 0.04
    assert RoutingPolicy(router_temperature=0.0).choose(loads, 1) == 0             # 0: the argmin, deterministic

def test_counters():
    p = RoutingPolicy()
    assert p.stats() == dict(router_prefix_query_tokens=0, router_prefix_hit_tokens=0, router_prefix_hit_rate=0.0)
    p.count(100, 64); p.count(60, 0)
    assert p.stats() == dict(router_prefix_query_tokens=160, router_prefix_hit_tokens=64, router_prefix_hit_rate=0.4)

def test_kv_events_follow_a_pool_through_stores_and_evictions():
    pool, held = BlockManager(8, 16), set()
    pool.events = []
    def report():
        ev, pool.events = pool.events, []
        return {k: [e.hash.hex() for e in ev if e.kind == k] for k in ("stored", "removed")}
    for ids in (list(range(100, 170)), list(range(400, 528)), list(range(100, 170))):
        s = Sequence(ids, None, str(len(ids))); pool.allocate(s); s.num_computed_tokens = s.num_tokens
        pool.cache_computed_blocks(s); pool.free(s)
        apply_kv_events(held, report())
        assert held == set(pool.cached)                                          # after every report
    pool.reset_prefix_cache(); apply_kv_events(held, report())
    assert held == set() == set(pool.cached)

def test_kv_events_order_and_missing_keys():
    h = [bytes([i]) * 16 for i in range(3)]
    held = {h[0], h[1]}
    assert apply_kv_events(held, None) == {h[0], h[1]}                          # a report without events
    assert apply_kv_events(held, {"stored": [h[2].hex()]}) == {h[0], h[1], h[2]}
    apply_kv_events(held, {"removed": [h[1].hex()], "stored": [h[1].hex()]})     # evicted, then stored again
    assert h[1] in held
    apply_kv_events(held, {"removed": [h[0].hex(), "00" * 16]})                  # an unknown hash: nothing to drop
    assert held == {h[1], h[2]}

def test_shared_prefix_workload():
    tok = load_tokenizer("tiny-dense")
    a, b = shared_prefix_workload(tok), shared_prefix_workload(tok)
    assert a == b and len(a) == 24 and len({tuple(p) for p in a}) == 24          # seeded, distinct
    heads = {}
    for p in a: heads.setdefault(tuple(p[:500]), []).append(p)
    assert len(heads) == 8 and all(len(v) == 3 for v in heads.values())
    first = [list(heads).index(tuple(p[:500])) for p in a]
    assert first != sorted(first)                                                # interleaved, not grouped
    assert shared_prefix_workload(tok, seed=1) != a
    assert len(shared_prefix_workload(tok, 2, 5, (100, 120))) == 10

def test_format_rows():
    row = dict(router_mode="kv", router_hit_rate=0.525, engine_hit_rate=0.525, prefilled_tokens=8321, ttft_p50_ms=34.1,
               ttft_p90_ms=195.4, ttft_mean_ms=90.3, output_tokens_per_s=84.3)
    lines = format_rows([row]).splitlines()
    assert len(lines) == 2 and lines[1].split() == ["kv", "52.5%", "52.5%", "8321", "34.1ms", "195.4ms", "90.3ms",
                                                     "84.3"]
    assert ROUTER_MODES == ("kv", "round_robin", "least_loaded")
