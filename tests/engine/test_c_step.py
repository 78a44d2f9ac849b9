"""Chapter 15f's one-call decode step against chapter 15d's per-layer step: the same hidden states, K/V writes and
greedy tokens, for GQA, q/k norms, biases, sliding windows and a verification's rows; the same bits at any thread
count; the few-row matmul against a float64 product; quantized models keep 15d's step."""
import numpy as np
import pytest
import torch
from inferlab.model.model import load_model
from inferlab.model.sampling import SamplingParams
from inferlab.engine.llm_engine import LLMEngine, EngineConfig
from inferlab.engine.model_runner import prepare_batch
from inferlab.engine.c_decode import CDecoder, _p
from inferlab.engine.c_step import CStepDecoder, step_library
from test_c_decode import _engine, _qwen_like

needs_lib = pytest.mark.skipif(step_library()[0] is None, reason=f"no C library: {step_library()[1]}")

def _step(eng, threads=(1, 2)):
    "One decode step through the one call at each thread count and through 15d, from the same cache: (hs, kvs)."
    ids, pos, meta, _, _ = prepare_batch(eng.scheduler.schedule(), eng.config.block_size)
    cache, dec = eng.runner.kv_cache, eng.runner.numpy_decoder
    saved, hs, kvs = [t.clone() for t in cache.k + cache.v], [], []
    before = torch.get_num_threads()
    for fn, n in [(dec, t) for t in threads] + [(lambda *a: CDecoder.__call__(dec, *a), 1)]:
        for t, s in zip(cache.k + cache.v, saved): t.copy_(s)
        torch.set_num_threads(n)
        try: hs.append(fn(ids, pos, meta))
        finally: torch.set_num_threads(before)
        kvs.append([t.clone() for t in cache.k + cache.v])
    return hs, kvs

def _close(hs, kvs):
    *ours, ref = hs
    assert all(torch.equal(ours[0], h) for h in ours[1:])                    # bits: not the thread count's
    assert (ours[0] - ref).abs().max() < 1e-4
    assert len(ref) == 1 or (ours[0] - ref.roll(1, 0)).abs().max() > 0.01   # the check tells rows apart
    assert max((a - b).abs().max().item() for a, b in zip(kvs[0], kvs[-1])) < 1e-5

@needs_lib
def test_default_engine_takes_one_call_on_tiny_dense():
    eng = _engine(load_model(dtype=torch.float32), [list(range(5, 5 + n)) for n in (1, 15, 16, 17, 40, 70, 3)])
    dec = eng.runner.numpy_decoder
    assert isinstance(dec, CStepDecoder) and dec.step_off is None and dec.uses_blas is False
    _close(*_step(eng))
    h = torch.randn(3, dec.head_w.shape[0])
    assert torch.allclose(dec.head(h), dec.lm_head(h), atol=1e-4)           # the logits' matmul in C

@needs_lib
@pytest.mark.parametrize("rows", [1, 4, 8, 9])                 # 9: more rows than its buffers, 15d's step
def test_qk_norm_bias_windows_gqa(rows):
    eng = _engine(_qwen_like(), [list(range(1, 1 + n)) for n in (2, 9, 13, 30, 5, 7, 11, 3, 6)[:rows]], block_size=4)
    assert eng.runner.numpy_decoder.step_off is None
    _close(*_step(eng))

@needs_lib
def test_verification_rows_and_greedy_tokens_match_15d():
    "A verification's rows of one sequence read each other's keys: the step writes them all before any attention."
    from inferlab.llm import LLM
    prompts = ["def read_text(path):", "import os\n\ndef list_files(path):", "class Stack:\n    def push(self"]
    outs = []
    for off in (None, "forced off for the test"):
        llm = LLM("tiny-dense", dtype="float32", speculative_config={"method": "ngram", "num_speculative_tokens": 4})
        assert isinstance(llm.engine.runner.numpy_decoder, CStepDecoder)
        llm.engine.runner.numpy_decoder.step_off = off
        outs.append([o.token_ids for o in llm.generate(prompts, SamplingParams(temperature=0, max_tokens=40))])
    assert outs[0] == outs[1]

@needs_lib
@pytest.mark.parametrize("M,K,N", [(1, 256, 4096), (3, 37, 67), (8, 64, 1000), (5, 30, 9), (2, 6, 16)])
def test_gemv_against_float64_and_its_own_bits(M, K, N):
    lib, rng = step_library()[0], np.random.default_rng(M * K + N)
    x, w = rng.standard_normal((M, K), dtype=np.float32), rng.standard_normal((K, N), dtype=np.float32)
    bias = rng.standard_normal(N, dtype=np.float32)
    def gemv(x, threads):
        y = np.full((x.shape[0], N), np.nan, np.float32)
        lib.gemv(_p(x), x.shape[0], K, _p(w), N, _p(bias), _p(y), threads)
        return y
    y1, y2 = gemv(x, 1), gemv(x, 2)
    ref = x.astype(np.float64) @ w + bias
    assert np.abs(y1 - ref).max() < 1e-5 * np.abs(ref).max()
    assert np.array_equal(y1, y2) and all(np.array_equal(gemv(x[m:m + 1], 2), y1[m:m + 1]) for m in range(M))

@needs_lib
def test_int8_model_takes_one_call_and_int4_keeps_15d_step():
    from inferlab.quant.presets import quantize_model
    fp32 = load_model(dtype=torch.float32)
    eng = _engine(quantize_model(fp32, "w8a16"), [list(range(5, 5 + n)) for n in (1, 15, 40, 3)])
    dec = eng.runner.numpy_decoder
    assert dec.step_off is None and dec.uses_blas is False
    assert isinstance(dec.head, torch.nn.Module)                             # an int8 lm_head keeps its kernel
    _close(*_step(eng))                                                        # int8 rows read in the step
    w4 = LLMEngine(quantize_model(fp32, "w4a16"), None, EngineConfig()).runner.numpy_decoder
    assert isinstance(w4, CStepDecoder) and "layer 0" in w4.step_off

@needs_lib
@pytest.mark.parametrize("aux", [(0, 3, 5), (4, 1), (2, 9)])   # 9: past the last layer, 15d's (NumPy) step
def test_eagle3_features_through_one_call(aux, monkeypatch):
    "EAGLE-3's per-layer features (`aux_layers`) from the one call: chapter 15's NumPy layout and values, layer 0 exact."
    eng = _engine(load_model(dtype=torch.float32), [list(range(5, 5 + n)) for n in (3, 17, 40)])
    ids, pos, meta, _, _ = prepare_batch(eng.scheduler.schedule(), eng.config.block_size)
    cache, dec = eng.runner.kv_cache, eng.runner.numpy_decoder
    saved, out, fell_back = [t.clone() for t in cache.k + cache.v], [], []
    reference = CDecoder.__call__
    monkeypatch.setattr(CDecoder, "__call__", lambda *a: fell_back.append(1) or reference(*a))   # 15d's (NumPy) step
    for fn in (dec, lambda *a: reference(dec, *a)):
        for t, s in zip(cache.k + cache.v, saved): t.copy_(s)
        out.append(fn(ids, pos, meta, aux))
    (h, a), (h_ref, a_ref) = out
    n, kept = h.shape[1], [l for l in sorted(set(aux)) if l < len(dec.layers)]
    assert len(fell_back) == (len(kept) < len(set(aux)))                    # the one call, unless a layer is past L
    assert a.shape == a_ref.shape == (3, n * len(kept)) and (h - h_ref).abs().max() < 1e-4
    assert (a - a_ref).abs().max() < 1e-4
    if kept[0] == 0: assert torch.equal(a[:, :n], a_ref[:, :n])            # the embeddings, copied exactly
    assert len(kept) == 1 or (a[:, -n:] - a[:, :n]).abs().max() > 0.01     # the layers' features differ
