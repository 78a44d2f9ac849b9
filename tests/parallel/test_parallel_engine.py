"Parallel = serial: TP, EP, TP+EP and attention DP give the single process's greedy tokens and logits (issue 15)."
import pytest
import torch
from parallel_helpers import random_checkpoint, prompts
from inferlab.engine.interface import check_engine
from inferlab.llm import LLM
from inferlab.model.model import load_model
from inferlab.model.sampling import SamplingParams
from inferlab.parallel.collectives import run_spmd
from inferlab.parallel.tensor_parallel import tp_logits

GREEDY = SamplingParams(max_tokens=12, temperature=0)

_REF = {}
def single(path, ps):
    "The single-process engine's greedy tokens (computed once per model and prompt set)."
    key = (path, str(ps))
    if key not in _REF: _REF[key] = [o.token_ids for o in LLM(path, dtype="float32").generate(ps, GREEDY)]
    return _REF[key]

def parallel(path, ps, **kw):
    with LLM(path, dtype="float32", **kw) as llm:
        check_engine(llm.engine)                         # the data-parallel and tensor-parallel engines alike
        outs = llm.generate(ps, GREEDY)
        if kw.get("data_parallel_size", 1) > 1: _duplicate_id_refused(llm.engine, ps[0])
    assert all(o.error is None for o in outs), [o.error for o in outs if o.error][:1]
    return [o.token_ids for o in outs]

def _duplicate_id_refused(eng, prompt):
    "A request id in flight on one replica is refused before any replica sees the second copy."
    eng.add_request(prompt, GREEDY, "dup")
    with pytest.raises(ValueError, match="request_id: 'dup' is already in flight"): eng.add_request(prompt, GREEDY, "dup")
    assert sum("dup" in r.requests for r in eng.replicas) == 1
    while eng.has_unfinished(): eng.step()

def logits_error(path, ids, fn, *args) -> float:
    ref = load_model(path, dtype=torch.float32, device="cpu")
    with torch.inference_mode(): want = ref(torch.tensor([ids]))[0]
    got = run_spmd(fn, 2, path, ids, *args)
    return max(((g[0] if isinstance(g, tuple) else g) - want).abs().max().item() for g in got)

@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    "Random Llama (6 q heads: 3 per rank) and Qwen2 (q/k/v bias), each with one KV head for two ranks (replicated)."
    root = tmp_path_factory.mktemp("ckpt")
    return {
        "llama-kv1": random_checkpoint(root / "llama", architecture="LlamaForCausalLM", hidden_size=96, intermediate_size=160,
                                       num_hidden_layers=2, num_attention_heads=6, num_key_value_heads=1, head_dim=16),
        "qwen2-kv1-bias": random_checkpoint(root / "qwen2", architecture="Qwen2ForCausalLM", hidden_size=64,
                                            intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                                            num_key_value_heads=1, head_dim=16, attention_bias=True),
    }

def test_tp2_tiny_dense_equals_single_process(no_stray_processes):
    ps = prompts(100)
    want, got = single("tiny-dense", ps), parallel("tiny-dense", ps, tensor_parallel_size=2)
    assert sum(a == b for a, b in zip(want, got)) == 100    # (logits: chapter 41 asserts them for tiny-dense)

@pytest.mark.parametrize("name", ["llama-kv1", "qwen2-kv1-bias"])
def test_tp2_random_checkpoints_equal_single_process(checkpoints, name, no_stray_processes):
    path, ps = checkpoints[name], prompts(100, seed=1)
    want, got = single(path, ps), parallel(path, ps, tensor_parallel_size=2)
    assert sum(a == b for a, b in zip(want, got)) == 100
    assert logits_error(path, ps[3], tp_logits) < 1e-4

@pytest.mark.parametrize("kw", [dict(tensor_parallel_size=2, enable_expert_parallel=True),      # TP attention + EP MoE
                                dict(tensor_parallel_size=2),                                  # TP everything
                                dict(data_parallel_size=2, enable_expert_parallel=True)],      # attention DP + EP
                         ids=["tp-attention-ep-moe", "tp-moe", "attention-dp-ep"])
def test_tiny_moe_parallel_equals_single_process(kw, no_stray_processes):
    ps = prompts(100, seed=2)
    want, got = single("tiny-moe", ps), parallel("tiny-moe", ps, **kw)
    assert sum(a == b for a, b in zip(want, got)) == 100    # (logits: chapter 42 asserts them for EP and DP + EP)

def test_bad_parallel_configs_fail_before_spawning(no_stray_processes):
    with pytest.raises(ValueError, match="tensor_parallel_size: 3 does not divide num_attention_heads=8"):
        LLM("tiny-dense", tensor_parallel_size=3)
    with pytest.raises(ValueError, match="enable_expert_parallel: .* dense model"):
        LLM("tiny-dense", tensor_parallel_size=2, enable_expert_parallel=True)
    with pytest.raises(ValueError, match="quantization: .nvfp4. with tensor_parallel_size > 1"):
        LLM("tiny-dense", tensor_parallel_size=2, quantization="nvfp4")
    with pytest.raises(ValueError, match="tensor_parallel_size: must be an integer"):
        LLM("tiny-dense", tensor_parallel_size=0)
    with pytest.raises(ValueError, match="enable_expert_parallel: 3 ranks do not divide num_experts=8"):
        LLM("tiny-moe", data_parallel_size=3, enable_expert_parallel=True)
