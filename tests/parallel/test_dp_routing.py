"Data-parallel replicas take requests by a routing policy (chapters 44 and 58a); host/disk KV tiers are refused with more than one rank."
import dataclasses
import pytest
import torch
from inferlab.engine.block_manager import chain_hashes
from inferlab.engine.llm_engine import EngineConfig, LLMEngine
from inferlab.llm import LLM, build_engine
from inferlab.model.model import load_model
from inferlab.model.sampling import SamplingParams
from inferlab.model.tokenizer import load_tokenizer
from inferlab.parallel.engine import DataParallelEngine
from inferlab.serve.kv_routing import RoutingPolicy

GREEDY = SamplingParams(max_tokens=3, temperature=0)
SYSTEM = list(range(100, 196))                                     # 96 tokens: 6 blocks of 16

def drain(eng):
    while eng.has_unfinished(): eng.step()

@pytest.fixture(scope="module")
def parts():
    return load_model("tiny-dense", dtype=torch.float32), load_tokenizer("tiny-dense")

def dispatcher(parts, routing) -> DataParallelEngine:
    "The dispatching half of a DataParallelEngine over two engines in this process (no ranks, no processes)."
    dp = DataParallelEngine.__new__(DataParallelEngine)
    dp.replicas = [LLMEngine(parts[0], parts[1], EngineConfig(num_kv_blocks=64)) for _ in range(2)]
    dp.tokenizer, dp.owner, dp.routing = parts[1], {}, routing
    return dp

def step_all(dp):
    while any(r.has_unfinished() for r in dp.replicas):
        for r in dp.replicas: r.step()

def place(dp) -> int:
    "Busy replica 0 with an unrelated request, the system prompt to replica 1, both done; then the follow-up."
    dp.add_request(list(range(500, 540)), GREEDY)
    dp.add_request(SYSTEM + [7, 8], GREEDY)
    assert dp.replicas[1].block_manager.num_cached_blocks(chain_hashes(SYSTEM, 16)) == 0   # not computed yet
    step_all(dp)
    rid = dp.add_request(SYSTEM + [11, 12, 13], GREEDY)
    return dp.replicas.index(dp.owner[rid])

@pytest.mark.parametrize("mode,want", [("kv", 1), ("least_loaded", 0), ("round_robin", 0)])
def test_the_follow_up_goes_where_the_policy_says(parts, mode, want):
    dp = dispatcher(parts, RoutingPolicy(mode))
    assert place(dp) == want
    step_all(dp)
    s = dp.stats()
    assert s["router_prefix_query_tokens"] == 40 + 98 + 99
    assert s["router_prefix_hit_tokens"] == s["prefix_hit_tokens"] == (96 if want == 1 else 0)

def test_without_a_policy_the_fewest_requests_take_it(parts):
    dp = dispatcher(parts, None)
    assert place(dp) == 0 and "router_prefix_query_tokens" not in dp.stats()

def test_a_rejected_request_is_not_counted_by_the_router(parts):
    dp = dispatcher(parts, RoutingPolicy())
    with pytest.raises(ValueError, match="max_tokens"): dp.add_request([1, 2, 3], SamplingParams(max_tokens=10**6))
    assert dp.routing.stats()["router_prefix_query_tokens"] == 0 and dp.owner == {}

def test_load_counts_waiting_blocks(parts):
    """Replica 1 runs 3 one-block requests (3 blocks in use, 3 requests); replica 0 has two 96-token prompts waiting
    (no block yet, 12 needed). Counting blocks in use alone would pick replica 0; with the waiting ones, replica 1."""
    dp = dispatcher(parts, RoutingPolicy())
    for i in range(3): dp.replicas[1].add_request([9 + i], SamplingParams(max_tokens=50, temperature=0))
    dp.replicas[1].step()
    dp.replicas[0].add_request(list(range(1, 97)), GREEDY); dp.replicas[0].add_request(list(range(2, 98)), GREEDY)
    bm0, bm1 = dp.replicas[0].block_manager, dp.replicas[1].block_manager
    assert (bm0.num_blocks - bm0.num_free_blocks, bm1.num_blocks - bm1.num_free_blocks) == (0, 3)
    rid = dp.add_request(list(range(3, 99)), GREEDY)
    assert dp.owner[rid] is dp.replicas[1]

def test_dp2_sends_a_shared_prefix_back_to_its_replica(no_stray_processes):
    want = LLM("tiny-dense", dtype="float32").generate([SYSTEM + [11, 12, 13]], GREEDY)[0].token_ids
    with LLM("tiny-dense", dtype="float32", data_parallel_size=2) as llm:         # router_mode="kv" by default
        eng = llm.engine
        assert eng.routing.mode == "kv" and eng.routing.weight == 1.0
        eng.add_request(list(range(500, 540)), GREEDY)
        first = eng.add_request(SYSTEM + [7, 8], GREEDY)
        holder = eng.replicas.index(eng.owner[first])
        drain(eng)
        rid = eng.add_request(SYSTEM + [11, 12, 13], GREEDY)
        assert eng.replicas.index(eng.owner[rid]) == holder == 1
        out = {}
        while eng.has_unfinished():
            out |= {o.request_id: o for o in eng.step() if o.finished}
        s = eng.stats()
        assert out[rid].token_ids == want and out[rid].metrics.num_cached_tokens == 96
        assert s["router_prefix_hit_tokens"] == 96 and s["replicas"][1]["prefix_hit_tokens"] == 96
        eng.reset_prefix_cache()
        assert all(r.block_manager.num_cached_blocks(chain_hashes(SYSTEM, 16)) == 0 for r in eng.replicas)
        eng.routing = RoutingPolicy("round_robin")                                # a policy can be swapped
        assert [eng.replicas.index(eng.owner[eng.add_request(SYSTEM, GREEDY)]) for _ in range(3)] == [0, 1, 0]
        drain(eng)
    with LLM("tiny-dense", dtype="float32", data_parallel_size=2, router_mode="least_loaded",
             kv_overlap_score_weight=2.5) as llm:
        assert (llm.engine.routing.mode, llm.engine.routing.weight) == ("least_loaded", 2.5)

def test_bad_router_mode_fails_before_any_process(no_stray_processes):
    with pytest.raises(ValueError, match="^router_mode: 'nearest' is not a routing policy; valid: kv, round_robin, "
                                         "least_loaded$"):
        build_engine("tiny-dense", data_parallel_size=2, router_mode="nearest")

@pytest.mark.skipif(not {"kv_offloading_size", "kv_offloading_dir"} <= {f.name for f in dataclasses.fields(EngineConfig)},
                    reason="EngineConfig has no KV offloading fields in this tree")
@pytest.mark.parametrize("par", [dict(tensor_parallel_size=2), dict(data_parallel_size=2)], ids=["tp2", "dp2"])
@pytest.mark.parametrize("tier", [dict(kv_offloading_size=1.0), dict(kv_offloading_dir="kv-disk")], ids=["host", "disk"])
def test_kv_tiers_are_refused_with_more_than_one_rank(par, tier, tmp_path, no_stray_processes):
    tier = {k: str(tmp_path / v) if k == "kv_offloading_dir" else v for k, v in tier.items()}
    name = next(iter(tier))
    with pytest.raises(ValueError, match=f"^{name}: host/disk KV tiers with tensor_parallel_size="
                                         f"{par.get('tensor_parallel_size', 1)}, data_parallel_size="
                                         f"{par.get('data_parallel_size', 1)}: a tier copies whole blocks"):
        LLM("tiny-dense", dtype="float32", **par, **tier)
    assert not (tmp_path / "kv-disk").exists()                                   # nothing was started or written
