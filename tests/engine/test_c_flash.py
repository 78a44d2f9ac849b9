"""Chapter 15h's prefill attention in C: float32 rounding of the float64 answer on paged caches (chunks with a cached
prefix, several sequences, grouped-query heads), bits that do not depend on the chunk, the thread count or the
scratch cap, chapter 13's path for what the C does not take, and the engine's greedy tokens through it."""
import numpy as np
import pytest
import torch
from inferlab.model.model import load_model
from inferlab.model.sampling import SamplingParams
from inferlab.engine import llm_engine
from inferlab.engine.llm_engine import LLMEngine, EngineConfig
from inferlab.engine.paged_attention import paged_prefill_reference, gather_kv
from inferlab.engine.c_rows import CRowsDecoder
from inferlab.engine.c_flash import (CFlashAttention, CFlashDecoder, flash_library, flash_flops, flash_threads,
                                     FLASH_SPREAD_FLOPS)

needs_lib = pytest.mark.skipif(flash_library()[0] is None, reason=f"no C library: {flash_library()[1]}")

def _paged(lens, news, H, Hkv, D, bs=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    nb = sum(-(-L // bs) for L in lens) + 3
    kc, vc = torch.randn(nb, bs, Hkv, D, generator=g), torch.randn(nb, bs, Hkv, D, generator=g)
    free, width, tables = torch.randperm(nb, generator=g).tolist(), max(-(-L // bs) for L in lens), []
    for L in lens:
        t = [free.pop() for _ in range(-(-L // bs))]; tables.append(t + [-1] * (width - len(t)))
    cu = torch.tensor([0, *np.cumsum(news)], dtype=torch.int32)
    return (2 * torch.randn(sum(news), H, D, generator=g), kc, vc, torch.tensor(tables, dtype=torch.int32), cu,
            torch.tensor(lens, dtype=torch.int32))

def _exact(q, kc, vc, tables, cu, lens, scale):
    out = torch.empty(q.shape, dtype=torch.float64)
    for i, L in enumerate(lens.tolist()):
        s, e = int(cu[i]), int(cu[i + 1])
        G = q.shape[1] // kc.shape[2]
        k = gather_kv(kc, tables[i], L).double().repeat_interleave(G, 1)
        v = gather_kv(vc, tables[i], L).double().repeat_interleave(G, 1)
        sc = torch.einsum("nhd,lhd->hnl", q[s:e].double(), k) * scale
        future = torch.arange(L)[None, :] > torch.arange(L - (e - s), L)[:, None]
        out[s:e] = torch.einsum("hnl,lhd->nhd", sc.masked_fill(future, float("-inf")).softmax(-1), v)
    return out

@needs_lib
@pytest.mark.parametrize("lens,news,H,Hkv,D", [([37], [37], 8, 4, 32), ([100, 5, 70], [100, 5, 20], 8, 4, 32),
                                               ([300], [7], 12, 4, 64), ([1], [1], 4, 2, 16), ([65], [65], 2, 2, 48),
                                               ([129, 64, 200], [60, 64, 1], 8, 2, 128), ([24, 25], [24, 25], 6, 1, 32)])
def test_float32_rounding_of_the_exact_answer(lens, news, H, Hkv, D):
    q, kc, vc, bt, cu, sl = _paged(lens, news, H, Hkv, D, seed=len(lens) + D)
    exact = _exact(q, kc, vc, bt, cu, sl, D ** -0.5)
    torch_err = (paged_prefill_reference(q, kc, vc, bt, cu, sl, D ** -0.5).double() - exact).abs().max().item()
    be = CFlashAttention(None)
    outs = [be.flash_prefill(q, kc, vc, bt, cu, sl, D ** -0.5, threads) for threads in (1, 2, 3)]
    assert (outs[0].double() - exact).abs().max().item() < 4 * torch_err + 1e-6
    assert torch.equal(outs[0], outs[1]) and torch.equal(outs[0], outs[2])             # any thread count: same bits
    assert (outs[0] - outs[0].roll(1, 0)).abs().max() > 0.01 or len(news) == 1 == news[0]  # rows told apart

@needs_lib
def test_a_chunks_bits_are_the_whole_prompts():
    q, kc, vc, bt, cu, sl = _paged([300], [300], 8, 4, 32, seed=1)
    be = CFlashAttention(None)
    whole = be.flash_prefill(q, kc, vc, bt, cu, sl, 0.2)
    for lo in (1, 63, 64, 65, 250, 299):
        part = be.flash_prefill(q[lo:], kc, vc, bt, torch.tensor([0, 300 - lo], dtype=torch.int32), sl, 0.2)
        assert torch.equal(part, whole[lo:]), lo
    # and the same sequence beside others in one call
    q2, kc2, vc2, bt2, cu2, sl2 = _paged([300, 90], [300, 90], 8, 4, 32, seed=1)
    kc2[bt2[0, :19].long()], vc2[bt2[0, :19].long()] = kc[bt[0].long()], vc[bt[0].long()]
    q2[:300] = q
    assert torch.equal(be.flash_prefill(q2, kc2, vc2, bt2, cu2, sl2, 0.2)[:300], whole)

@needs_lib
def test_scratch_cap_groups_sequences_with_the_same_bits():
    q, kc, vc, bt, cu, sl = _paged([100, 5, 70, 33], [100, 5, 20, 1], 8, 4, 32, seed=2)
    small, big = CFlashAttention(None, max_floats=1000), CFlashAttention(None)
    assert torch.equal(small.flash_prefill(q, kc, vc, bt, cu, sl, 0.2), big.flash_prefill(q, kc, vc, bt, cu, sl, 0.2))
    assert small.scratch.size == 128 * 4 * 32 * 2 and big.scratch.size == (128 + 64 + 128 + 64) * 4 * 32 * 2

@needs_lib
def test_what_the_c_does_not_take_is_chapter_13s_path():
    q, kc, vc, bt, cu, sl = _paged([70], [40], 8, 4, 32, seed=3)
    be = CFlashAttention(None)
    ref = lambda **kw: paged_prefill_reference(q, kc, vc, bt, cu, sl, 0.2, **kw)
    assert not torch.equal(be.prefill(q, kc, vc, bt, cu, sl, 0.2), ref())              # C: other sums, close
    assert (be.prefill(q, kc, vc, bt, cu, sl, 0.2) - ref()).abs().max() < 1e-5
    assert torch.equal(be.prefill(q, kc, vc, bt, cu, sl, 0.2, window=16), ref(window=16))
    s = torch.full((4,), 0.05)
    codes = (kc / 0.05).round().clamp(-127, 127).to(torch.int8), (vc / 0.05).round().clamp(-127, 127).to(torch.int8)
    assert torch.equal(be.prefill(q, *codes, bt, cu, sl, 0.2, k_scale=s, v_scale=s),
                       paged_prefill_reference(q, *codes, bt, cu, sl, 0.2, k_scale=s, v_scale=s))
    assert "multiple of 16" in be.flash_off(q[..., :24], kc) and "bfloat16" in be.flash_off(q.bfloat16(), kc)
    assert be.flash_off(q, kc) is None

def _greedy(prompts, decoder, threads=1, **config):
    saved, saved_threads = llm_engine.CPrefillDecoder, torch.get_num_threads()
    llm_engine.CPrefillDecoder, _ = decoder, torch.set_num_threads(threads)
    try:
        eng = LLMEngine(load_model(dtype=torch.float32), None, EngineConfig(**config))
        assert type(eng.runner.numpy_decoder) is decoder
        ids = [eng.add_request(p, SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)) for p in prompts]
        out = {}
        while eng.has_unfinished(): out |= {o.request_id: o.token_ids for o in eng.step() if o.finished}
        eng.check_idle()
        return [out[i] for i in ids], eng
    finally: llm_engine.CPrefillDecoder, _ = saved, torch.set_num_threads(saved_threads)

def _prefix_prompts():
    "Real-text prompts, three sharing a 200-token prefix, and a config whose KV budget preempts: (prompts, config)."
    from inferlab.frontier.bench import corpus_token_ids
    ids = corpus_token_ids(30_000)
    shared = ids[:200]                                    # a cached prefix for the later requests
    prompts = [ids[1000 + 600 * i:1000 + 600 * i + 40 + 90 * i] for i in range(5)] + [shared + ids[5000 + 50 * i:
               5000 + 50 * i + 30] for i in range(3)]
    return prompts, dict(max_num_seqs=4, max_num_batched_tokens=96, enable_prefix_caching=True, num_kv_blocks=28)

@needs_lib
@pytest.mark.parametrize("threads", [1, 2])
def test_engine_greedy_tokens_match_chapter_13s_prefill(threads):
    prompts, config = _prefix_prompts()
    flash, eng = _greedy(prompts, CFlashDecoder, threads, **config)
    assert eng.runner.attention.name == "torch+c+flash"
    st = eng.stats()
    assert st["preemptions"] > 0 and st["prefix_hit_tokens"] > 0        # the KV budget preempts; the prefix is reused
    assert flash == _greedy(prompts, CRowsDecoder, threads, **config)[0]


def test_flash_flops_counts_each_querys_keys():
    cu, lens = torch.tensor([0, 3, 4, 10], dtype=torch.int32), torch.tensor([3, 9, 6], dtype=torch.int32)
    keys = sum(p + 1 for L, n in ((3, 3), (9, 1), (6, 6)) for p in range(L - n, L))       # causal: position p sees p + 1
    assert flash_flops(cu, lens, 12, 64) == keys * 4 * 12 * 64

@pytest.mark.parametrize("flops,budget,cores,want", [(FLASH_SPREAD_FLOPS, 1, 2, 2), (FLASH_SPREAD_FLOPS - 1, 1, 2, 1),
                                                    (1e12, 2, 2, 2), (1e12, 1, 1, 1), (1e12, 3, 2, 3), (0, 2, 4, 2)])
def test_flash_threads_spreads_only_big_calls_past_the_budget(flops, budget, cores, want):
    assert flash_threads(flops, budget, cores) == want

@needs_lib
def test_backend_gives_a_big_call_every_core_and_a_small_one_the_budget(monkeypatch):
    be, seen = CFlashAttention(None), []
    be.cores = 2
    monkeypatch.setattr(CFlashAttention, "flash_prefill", lambda self, *a: seen.append(a[-1]) or torch.zeros(1))
    saved = torch.get_num_threads()
    torch.set_num_threads(1)                                         # a step's budget beside a busy neighbour
    try:
        for news, L in ((8, 64), (2048, 4096)):                      # 4 MFLOP; 2,048 queries after 2,048: 6.4 GFLOP
            q, kc = torch.zeros(news, 8, 32), torch.zeros(L // 16, 16, 4, 32)
            cu, lens = torch.tensor([0, news], dtype=torch.int32), torch.tensor([L], dtype=torch.int32)
            be.prefill(q, kc, kc, torch.arange(L // 16, dtype=torch.int32)[None], cu, lens, 0.2)
    finally: torch.set_num_threads(saved)
    assert seen == [1, 2]
