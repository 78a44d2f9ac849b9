"""The NumPy decode step (chapter 15) against the torch path it replaces on CPU: same hidden states and K/V writes to
float32 rounding, for GQA, q/k norms with biases, sliding windows across block boundaries and ragged batches; and
the models and caches it must refuse."""
import pytest
import torch
from inferlab.model.config import ModelConfig, shipped_model_path
from inferlab.model.model import load_model
from inferlab.model.random_weights import random_model
from inferlab.model.sampling import SamplingParams
from inferlab.engine.llm_engine import LLMEngine, EngineConfig
from inferlab.llm import build_engine
from inferlab.engine.model_runner import NumpyDecoder, AttentionContext, prepare_batch

def decode_step_both_ways(eng):
    "Hidden states and written K/V of one decode-only step, through torch and through NumPy, from the same cache."
    batch = eng.scheduler.schedule()
    ids, pos, meta, _, _ = prepare_batch(batch, eng.config.block_size)
    assert meta.num_prefill_tokens == 0 and len(ids) == len(batch.seqs)
    cache = eng.runner.kv_cache
    saved = [t.clone() for t in cache.k + cache.v]
    with torch.inference_mode():
        h_torch = eng.runner.model.hidden_states(ids[None], pos, AttentionContext(cache, meta), check_ids=False)[0]
    kv_torch = [t.clone() for t in cache.k + cache.v]
    for t, s in zip(cache.k + cache.v, saved): t.copy_(s)
    h_np = eng.runner.numpy_decoder(ids, pos, meta)
    kv_err = max((a - b).abs().max().item() for a, b in zip(kv_torch, cache.k + cache.v))
    return h_torch, h_np, kv_err

def engine_in_decode(model, prompts, **cfg):
    "An engine whose next step is decode-only for every prompt."
    eng = LLMEngine(model, None, EngineConfig(**cfg))
    for p in prompts: eng.add_request(p, SamplingParams(temperature=0, max_tokens=64, ignore_eos=True))
    while any(s.num_computed_tokens < s.num_prompt_tokens for s in eng.requests.values()) or \
            any(s.num_output_tokens < 3 for s in eng.requests.values()):
        eng.step()
    return eng

def test_tiny_dense_matches_torch_path():
    model = load_model(dtype=torch.float32)
    eng = engine_in_decode(model, [list(range(5, 5 + n)) for n in (1, 15, 16, 17, 40, 70, 3)])
    h_torch, h_np, kv_err = decode_step_both_ways(eng)
    assert h_np.shape == h_torch.shape == (7, model.config.hidden_size)
    assert (h_np - h_torch).abs().max() < 1e-4 and kv_err < 1e-5
    assert (h_np - h_torch.roll(1, 0)).abs().max() > 0.1                 # ...and the check can tell rows apart

def test_qk_norm_bias_windows_match_torch_path():
    cfg = ModelConfig(architecture="Qwen3ForCausalLM", vocab_size=300, hidden_size=64, intermediate_size=96,
                      num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                      attention_bias=True, qk_norm=True, layer_windows=[None, 6, 9], max_position_embeddings=256)
    model = random_model(cfg, seed=3)
    for m in model.modules():            # random_model (init_weights) leaves norm weights and biases at 1: spread them
        if hasattr(m, "bias") and m.bias is not None: m.bias.data.normal_(0, 0.5)
    for name, p in model.named_parameters():
        if "norm" in name: p.data.uniform_(0.5, 1.5)
    eng = engine_in_decode(model, [list(range(1, 1 + n)) for n in (2, 9, 13, 30)], block_size=4)
    assert eng.runner.numpy_decoder is not None
    h_torch, h_np, kv_err = decode_step_both_ways(eng)
    assert (h_np - h_torch).abs().max() < 1e-4 and kv_err < 1e-5

def test_greedy_tokens_equal_with_and_without_numpy_path():
    model = load_model(dtype=torch.float32)
    prompts = [list(range(5, 5 + n)) for n in (4, 30, 77)]
    outs = []
    for use_numpy in (True, False):
        eng = LLMEngine(model, None, EngineConfig(max_num_seqs=4))
        if not use_numpy: eng.runner.numpy_decoder = None
        seqs = [eng.requests[eng.add_request(p, SamplingParams(temperature=0, max_tokens=48, ignore_eos=True))] for p in prompts]
        while eng.has_unfinished(): eng.step()
        outs.append([s.output_token_ids for s in seqs])
    assert outs[0] == outs[1]

@pytest.mark.parametrize("kw, reason", [(dict(kv_cache_dtype="fp8"), "quantized"),
                                        (dict(quantization="w8a8"), "no NumPy matmul")])
def test_refuses_what_it_cannot_run(kw, reason):
    eng = build_engine(load_model(dtype=torch.float32), None, **kw)
    assert eng.runner.numpy_decoder is None
    assert reason in NumpyDecoder.unsupported(eng.runner.model, eng.runner.kv_cache)
    with pytest.raises(ValueError, match="NumpyDecoder"): NumpyDecoder(eng.runner.model, eng.runner.kv_cache)

def test_refuses_moe_and_unpacked_models():
    moe = LLMEngine(load_model(shipped_model_path("tiny-moe"), dtype=torch.float32), None)
    assert moe.runner.numpy_decoder is None
    assert "MoE" in NumpyDecoder.unsupported(moe.runner.model, moe.runner.kv_cache)
    from inferlab.engine.model_runner import ModelRunner
    runner = ModelRunner(load_model(dtype=torch.float32), 8)                  # not packed: torch path only
    assert runner.numpy_decoder is None

def test_aux_layers_match_torch_path():
    "EAGLE-3's features (the residual stream entering chosen layers) agree between the NumPy and the torch path."
    model = load_model(dtype=torch.float32)
    eng = engine_in_decode(model, [list(range(5, 5 + n)) for n in (1, 17, 40)])
    batch = eng.scheduler.schedule()
    ids, pos, meta, _, _ = prepare_batch(batch, eng.config.block_size)
    cache = eng.runner.kv_cache
    saved = [t.clone() for t in cache.k + cache.v]
    with torch.inference_mode():
        h_t, aux_t = eng.runner.model.hidden_states(ids[None], pos, AttentionContext(cache, meta), check_ids=False,
                                                    aux_layers=(0, 2, 5))
    for t, s in zip(cache.k + cache.v, saved): t.copy_(s)
    h_n, aux_n = eng.runner.numpy_decoder(ids, pos, meta, aux_layers=(0, 2, 5))
    d = model.config.hidden_size
    assert aux_n.shape == (3, 3 * d) and (aux_n - aux_t[0]).abs().max() < 1e-4 and (h_n - h_t[0]).abs().max() < 1e-4
    with torch.inference_mode(): assert torch.equal(aux_t[0, :, :d], model.model.embed_tokens(ids))   # layer 0's input
    assert (aux_n[:, d:2 * d] - aux_n[:, 2 * d:]).abs().max() > 0.1      # the layers differ: the check can fail
