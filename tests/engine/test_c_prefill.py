"""Chapter 15i's prefill step in C against the model's torch path (the truth for every step that prefills): the same
hidden states and K/V writes within float32 roundings, for GQA, q/k norms, biases, chunked prompts with a cached
prefix and decode rows in the same step; the engine's greedy tokens at one thread; what keeps the torch path."""
import numpy as np
import pytest
import torch
from inferlab.model.model import load_model
from inferlab.model.sampling import SamplingParams
from inferlab.engine.llm_engine import LLMEngine, EngineConfig
from inferlab.engine.c_decode import _p
from inferlab.engine.c_flash import CFlashDecoder
from inferlab.engine.c_prefill import CPrefillDecoder, prefill_library
from test_c_decode import _qwen_like
from test_c_flash import _greedy, _prefix_prompts

needs_lib = pytest.mark.skipif(prefill_library()[0] is None, reason=f"no C library: {prefill_library()[1]}")

@pytest.fixture
def one_thread():
    saved = torch.get_num_threads()
    torch.set_num_threads(1)                         # the budget beside a busy neighbour: where this step runs
    yield
    torch.set_num_threads(saved)

@needs_lib
@pytest.mark.parametrize("n", [8, 100, 256, 5])
def test_fused_add_rms_norm_and_silu_and_mul_match_torch(n):
    lib, g = prefill_library()[0], torch.Generator().manual_seed(n)
    x, r, w = torch.randn(7, n, generator=g) * 3, torch.randn(7, n, generator=g), torch.rand(n, generator=g) + 0.5
    for res in (None, r):
        xc, out = x.clone().numpy(), np.empty((7, n), np.float32)
        lib.fused_add_rms_norm(_p(xc), _p(res.numpy()) if res is not None else None, _p(w.numpy()), _p(out), 7, n, 1e-5)
        xs = (x + res if res is not None else x).double()
        want = w.double() * xs * torch.rsqrt(xs.pow(2).mean(-1, keepdim=True) + 1e-5)
        assert np.allclose(xc, xs.float().numpy(), rtol=0, atol=0)                      # the residual, written back
        assert (torch.from_numpy(out).double() - want).abs().max() < 1e-5 * want.abs().max()
    gu, act = torch.randn(7, 2 * n, generator=g) * 4, np.empty((7, n), np.float32)
    lib.silu_and_mul(_p(gu.numpy()), _p(act), 7, n)
    want = torch.nn.functional.silu(gu[:, :n].double()) * gu[:, n:].double()
    assert (torch.from_numpy(act).double() - want).abs().max() < 1e-5 * want.abs().max()
    assert (torch.from_numpy(act).double() - want.roll(1, 1)).abs().max() > 0.1            # columns told apart

def _checked_run(model, prompts, **config):
    "Run `prompts`; at each step that prefills, C's hidden states and K/V writes against the torch path's."
    eng = LLMEngine(model, None, EngineConfig(**config))
    run, dec = eng.runner, eng.runner.numpy_decoder
    assert isinstance(dec, CPrefillDecoder) and dec.prefill_off is None
    step, seen = dec.prefill_step, []
    def both(ids, pos, meta):
        cache = run.kv_cache.k + run.kv_cache.v
        before = [t.clone() for t in cache]
        ref = run.hidden_states(ids, pos, meta)
        kv_ref = [t.clone() for t in cache]
        for t, s in zip(cache, before): t.copy_(s)
        got = step(ids, pos, meta)
        kv_err = max((a - b).abs().max().item() for a, b in zip(kv_ref, cache))
        seen.append(((got - ref).abs().max().item(), kv_err, meta.num_prefill_tokens, len(ids),
                     int((meta.prefill_seq_lens > meta.prefill_cu_seqlens_q.diff()).any())))
        assert (got - ref.roll(1, 0)).abs().max() > 0.01 or len(ids) == 1            # rows told apart
        return got
    dec.prefill_step = both
    for p in prompts: eng.add_request(p, SamplingParams(temperature=0, max_tokens=6, ignore_eos=True))
    while eng.has_unfinished(): eng.step()
    eng.check_idle()
    return seen

@needs_lib
def test_qk_norm_bias_gqa_chunks_and_decode_rows_match_the_torch_path(one_thread):
    model = _qwen_like(layer_windows=None, intermediate_size=100)          # 100: SwiGLU's last 4 columns padded
    seen = _checked_run(model, [list(range(1, 1 + n)) for n in (2, 9, 13, 30, 41)], block_size=4,
                        max_num_batched_tokens=20, max_num_seqs=3)
    assert max(h for h, *_ in seen) < 1e-4 and max(kv for _, kv, *_ in seen) < 1e-5
    assert any(T > P for *_, P, T, _ in seen) and any(prefix for *_, prefix in seen)   # decode rows; a later chunk

@needs_lib
def test_tiny_dense_steps_match_the_torch_path(one_thread):
    from inferlab.frontier.bench import corpus_token_ids
    ids = corpus_token_ids(20_000)
    seen = _checked_run(load_model(dtype=torch.float32), [ids[700 * i:700 * i + 60 + 80 * i] for i in range(4)],
                        max_num_batched_tokens=128, max_num_seqs=4)
    assert max(h for h, *_ in seen) < 1e-4 and max(kv for _, kv, *_ in seen) < 1e-5

@needs_lib
def test_engine_greedy_tokens_at_one_thread_match_the_torch_prefill(monkeypatch):
    calls, step = [], CPrefillDecoder.prefill_step
    monkeypatch.setattr(CPrefillDecoder, "prefill_step", lambda self, *a: calls.append(1) or step(self, *a))
    prompts, config = _prefix_prompts()
    ours, eng = _greedy(prompts, CPrefillDecoder, 1, **config)
    st = eng.stats()
    assert calls and st["preemptions"] > 0 and st["prefix_hit_tokens"] > 0   # the KV budget preempts; a prefix reused
    assert ours == _greedy(prompts, CFlashDecoder, 1, **config)[0]

@needs_lib
def test_what_keeps_the_torch_path():
    def off(model, **config): return LLMEngine(model, None, EngineConfig(**config)).runner.numpy_decoder.prefill_off
    assert off(_qwen_like(layer_windows=[None, 6, None])) == "layer 1: sliding window 6"
    assert off(_qwen_like(head_dim=24, layer_windows=None)) == "head_dim 24 is not a multiple of 16"
    from inferlab.quant.presets import quantize_model
    assert "float32 K-major" in off(quantize_model(load_model(dtype=torch.float32), "w8a16"))
    dec = LLMEngine(load_model(dtype=torch.float32), None, EngineConfig()).runner.numpy_decoder
    assert dec.prefill_off is None and dec.takes(500, 1, prefill=True)
    assert not dec.takes(500, 2, prefill=True) and not dec.takes(500, 1, (1, 3), prefill=True)
    assert dec.takes(500, 1) == CFlashDecoder.takes(dec, 500, 1) and dec.takes(3, 2)    # decode steps: 15h's rule

@needs_lib
def test_buffers_grow_to_the_largest_step_and_are_reused():
    run = LLMEngine(load_model(dtype=torch.float32), None, EngineConfig()).runner
    dec = run.numpy_decoder
    assert run.attention is dec.flash_attn                     # one flash backend (one scratch) for both paths
    a = dec.buffers(40)
    assert [b.shape for b in a] == [(40, 256), (40, 256), (40, 256), (40, 704)]
    b = dec.buffers(12)
    assert all(np.shares_memory(x, y) for x, y in zip(a, b)) and dec.buf_rows == 40
    c = dec.buffers(100)
    assert dec.buf_rows == 100 and not np.shares_memory(a[0], c[0])
