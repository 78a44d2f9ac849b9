"The server's speculation metrics follow the engine's counters, vLLM's names, position by position."
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
