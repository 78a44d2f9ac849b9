"""Chapter 15g's matmul for decode steps of 9 to 24 rows: the bits of chapter 15f's `gemv` at any row and thread count,
float32 rounding of the float64 product, the routes around it, and the engine's one-thread steps through it (the same
greedy tokens as torch's path, each LM-head row the bits of its own one-row product, quantized layers left alone)."""
import numpy as np
import pytest
import torch
from inferlab.model.model import load_model
from inferlab.model.sampling import SamplingParams
from inferlab.engine.llm_engine import LLMEngine, EngineConfig
from inferlab.engine.model_runner import prepare_batch, few_rows_matmul
from inferlab.engine.c_decode import CDecoder, _p
from inferlab.engine.c_step import step_library
from inferlab.engine import c_rows
from inferlab.engine.c_rows import CRowsDecoder, rows_library, rows_matmul, ROWS_C_MAX

needs_lib = pytest.mark.skipif(rows_library()[0] is None or step_library()[0] is None,
                               reason=f"no C library: {rows_library()[1] or step_library()[1]}")

@needs_lib
@pytest.mark.parametrize("M,K,N", [(9, 256, 4096), (13, 300, 67), (24, 704, 256), (11, 6, 16), (1, 37, 33),
                                   (31, 64, 4096), (64, 2048, 48)])                # 31, 64: the packed pieces
def test_kernel_has_the_one_call_steps_bits(M, K, N):
    rng = np.random.default_rng(M * K + N)
    x, w = rng.standard_normal((M, K), dtype=np.float32), rng.standard_normal((K, N), dtype=np.float32)
    ref = np.empty((M, N), np.float32)
    step_library()[0].gemv(_p(x), M, K, _p(w), N, None, _p(ref), 1)
    for threads in (1, 2, 3):
        y = np.full((M, N), np.nan, np.float32)
        rows_library()[0].rows_gemm(_p(x), M, K, _p(w), N, _p(y), threads)
        assert np.array_equal(y, ref), threads
    exact = x.astype(np.float64) @ w
    assert np.abs(ref - exact).max() < 1e-5 * K ** 0.5 * np.abs(exact).max()

@needs_lib
def test_routes_by_rows(monkeypatch):
    rng = np.random.default_rng(0)
    w = rng.standard_normal((64, 80), dtype=np.float32)
    for M in (1, 8, 9, 30, ROWS_C_MAX, ROWS_C_MAX + 1, 90):
        x = rng.standard_normal((M, 64), dtype=np.float32)
        y = rows_matmul(x, w)
        assert y.shape == (M, 80) and np.abs(y - x.astype(np.float64) @ w).max() < 1e-4
        if M <= 8: assert np.array_equal(y, few_rows_matmul(x, w))
    x = rng.standard_normal((12, 64), dtype=np.float32)
    monkeypatch.setattr(c_rows, "rows_library", lambda: (None, "no C compiler"))           # no C: oneDNN's GEMM
    assert np.allclose(rows_matmul(x, w), x @ w, atol=1e-4)

def _engine(model, n=12, threads=1, max_tokens=12):
    "An engine with `n` greedy requests, prefilled, on `threads` threads from now on (the caller restores them)."
    torch.set_num_threads(threads)
    eng = LLMEngine(model, None, EngineConfig(max_num_seqs=n))
    for i in range(n): eng.add_request(list(range(5 + i, 9 + 3 * i)), SamplingParams(temperature=0, max_tokens=max_tokens,
                                                                                    ignore_eos=True))
    return eng

def _greedy(eng):
    out = {}
    while eng.has_unfinished(): out |= {o.request_id: o.token_ids for o in eng.step() if o.finished}
    eng.check_idle()
    return [out[k] for k in sorted(out)]

@needs_lib
@pytest.mark.parametrize("quant", [None, "w8a16"])
def test_one_thread_steps_match_torch_path(quant):
    from inferlab.quant.presets import quantize_model
    model, saved = load_model(dtype=torch.float32), torch.get_num_threads()
    model = quantize_model(model, quant) if quant else model
    try:
        one = _engine(model, threads=1)
        dec = one.runner.numpy_decoder
        assert isinstance(dec, CRowsDecoder) and dec.step_off is None and not dec.takes(12, 2)
        assert dec.takes(12, 1) == (quant is None)                 # int8 layers: larger steps keep torch's path
        if quant is None:
            one.step()                                                                    # the prefill
            ids, pos, meta, _, _ = prepare_batch(one.scheduler.schedule(), one.config.block_size)
            cache = one.runner.kv_cache
            kv = [t.clone() for t in cache.k + cache.v]
            h = dec(ids, pos, meta)                                                       # 12 rows, one thread
            for t, s in zip(cache.k + cache.v, kv): t.copy_(s)
            h_ref = CDecoder(one.runner.model, cache)(ids, pos, meta)                     # 15d's matmuls
            assert (h - h_ref).abs().max() < 1e-4 and (h - h.roll(1, 0)).abs().max() > 0.01
            assert torch.equal(dec.head(h), torch.cat([dec.head(r[None]) for r in h]))
        ours = [_greedy(_engine(model, n, threads=1)) for n in (12, 40)]                # 40: the packed pieces
        torch_path = [_greedy(_engine(model, n, threads=2)) for n in (12, 40)]           # oneDNN's steps
    finally: torch.set_num_threads(saved)
    assert ours == torch_path and [len(o) for o in ours] == [12, 40]
