"The server's speculation metrics follow the engine's counters, vLLM's names, position by position; a router's prefix-hit counters and the KV tiers' counters follow theirs."
import pytest
import torch
from inferlab.model.config import shipped_model_path
from inferlab.model.model import load_model
from inferlab.model.tokenizer import load_tokenizer
from inferlab.model.sampling import SamplingParams
from inferlab.engine.llm_engine import LLMEngine, EngineConfig
from inferlab.spec_decode.spec_decoder import add_speculation
from inferlab.serve.metrics import ServerMetrics

def test_speculation_metrics_follow_the_engine():
    path = shipped_model_path("tiny-dense")
    tok = load_tokenizer(path)
    engine = LLMEngine(load_model(path, dtype=torch.float32), tok, EngineConfig(max_num_seqs=2, num_kv_blocks=64))
    eng = add_speculation(engine, {"method": "ngram", "num_speculative_tokens": 4}, path)
    m = ServerMetrics("tiny")
    text = "def add(a, b):\n    return a + b\n\n\ndef add(a, b):\n    return a + b\n\n\n"
    for i in range(3): eng.add_request(text * 2, SamplingParams(temperature=0, max_tokens=48, ignore_eos=True))
    while eng.has_unfinished(): m.observe_step(eng, eng.step())
    s = eng.stats()
    def get(name, **labels):
        return m.registry.get_sample_value(f"inferlab:{name}_total", dict(model_name="tiny", **labels))
    assert s["num_drafts"] > 0 and s["num_accepted_tokens"] > 0
    assert get("spec_decode_num_drafts") == s["num_drafts"]
    assert get("spec_decode_num_draft_tokens") == s["num_draft_tokens"]
    assert get("spec_decode_num_accepted_tokens") == s["num_accepted_tokens"] == sum(s["num_accepted_tokens_per_pos"])
    per = [get("spec_decode_num_accepted_tokens_per_pos", position=str(j)) for j in range(s["num_speculative_tokens"])]
    assert per == s["num_accepted_tokens_per_pos"] and per[0] > 0
    assert get("spec_decode_draft_seconds") == s["draft_seconds"] > 0
    assert 1 + sum(per) / s["num_drafts"] == pytest.approx(s["mean_accepted_length"])

def _get(m, name, **labels):
    return m.registry.get_sample_value(f"inferlab:{name}_total", dict(model_name="tiny", **labels))

class _StatsOnly:
    def __init__(self, **s): self.s = dict(num_running=0, num_waiting=0, free_blocks=8, num_blocks=8,
                                           prefix_query_tokens=0, prefix_hit_tokens=0, **s)
    def stats(self): return dict(self.s)

def test_router_and_kv_tier_counters_are_exported_as_deltas():
    eng, m = _StatsOnly(), ServerMetrics("tiny")
    m.observe_step(eng, [])
    assert _get(m, "router_prefix_cache_queries") is None and _get(m, "kv_offload_hits", tier="host") is None
    for step in (1, 2):
        eng.s.update(router_prefix_query_tokens=700 * step, router_prefix_hit_tokens=400 * step,
                     kv_offload_disk_hits=3 * step, kv_offload_disk_misses=step, kv_offload_disk_loaded_bytes=10 * step,
                     kv_offload_disk_saved_bytes=20 * step, kv_offload_disk_load_seconds=0.5 * step,
                     kv_offload_disk_save_seconds=0.25 * step, kv_offload_disk_enabled=1)
        m.observe_step(eng, [])
    assert (_get(m, "router_prefix_cache_queries"), _get(m, "router_prefix_cache_hits")) == (1400, 800)
    want = dict(hits=6, misses=2, loaded_bytes=20, saved_bytes=40, load_seconds=1.0, save_seconds=0.5)
    assert {k: _get(m, f"kv_offload_{k}", tier="disk") for k in want} == want
    assert _get(m, "kv_offload_hits", tier="host") is None                     # only the tiers an engine reports
    eng.s.update(router_prefix_query_tokens=100, router_prefix_hit_tokens=0)   # a new router: its counters restart
    m.observe_step(eng, [])
    assert (_get(m, "router_prefix_cache_queries"), _get(m, "router_prefix_cache_hits")) == (1500, 800)

def test_router_counters_follow_a_data_parallel_dispatcher():
    "The real keys: a DataParallelEngine's dispatcher over two engines in this process, with the KV policy."
    from inferlab.parallel.engine import DataParallelEngine
    from inferlab.serve.kv_routing import RoutingPolicy
    path = shipped_model_path("tiny-dense")
    model, tok = load_model(path, dtype=torch.float32), load_tokenizer(path)
    dp = DataParallelEngine.__new__(DataParallelEngine)
    dp.replicas = [LLMEngine(model, tok, EngineConfig(num_kv_blocks=32)) for _ in range(2)]
    dp.tokenizer, dp.owner, dp.routing = tok, {}, RoutingPolicy()
    m, system = ServerMetrics("tiny"), list(range(100, 164))
    for q in ([1, 2], [3, 4], [5, 6]):
        dp.add_request(system + q, SamplingParams(max_tokens=2, temperature=0))
        while any(r.has_unfinished() for r in dp.replicas): m.observe_step(dp, [o for r in dp.replicas for o in r.step()])
    s = dp.stats()
    assert s["router_prefix_hit_tokens"] == 2 * 64 and s["router_prefix_query_tokens"] == 3 * 66
    assert _get(m, "router_prefix_cache_queries") == 3 * 66 and _get(m, "router_prefix_cache_hits") == 2 * 64

@pytest.mark.skipif("kv_offloading_size" not in {f.name for f in __import__("dataclasses").fields(EngineConfig)},
                    reason="EngineConfig has no kv_offloading_size in this tree")
def test_host_tier_counters_follow_the_engine():
    path = shipped_model_path("tiny-dense")
    eng = LLMEngine(load_model(path, dtype=torch.float32), load_tokenizer(path),
                    EngineConfig(num_kv_blocks=24, kv_offloading_size=0.01))
    m, sp = ServerMetrics("tiny"), SamplingParams(max_tokens=2, temperature=0)
    for p in (list(range(1, 200)), list(range(300, 500)), list(range(1, 200))):   # the third reloads evicted blocks
        eng.add_request(p, sp)
        while eng.has_unfinished(): m.observe_step(eng, eng.step())
    s = eng.stats()
    assert s["kv_offload_host_hits"] > 0
    for k in ("hits", "misses", "loaded_bytes", "saved_bytes", "load_seconds", "save_seconds"):
        assert _get(m, f"kv_offload_{k}", tier="host") == pytest.approx(s[f"kv_offload_host_{k}"]), k
