"""Paged-attention kernels against their torch references, and the references against dense attention.

The Triton kernels run in Triton's interpreter on CPU tensors, which must be switched on before triton is first
imported; hence the environment variable before any other import. Shapes are tiny: the interpreter runs each
program in Python, ~1000x slower than torch.
"""
import os
os.environ["TRITON_INTERPRET"] = "1"

import pytest
import torch
triton = pytest.importorskip("triton")
from inferlab.model.layers import attention_mask, sdpa_reference
from inferlab.engine.paged_attention import (TorchAttention, store_kv_reference, paged_prefill_reference,
    paged_decode_reference, slots_from_block_table, prefill_plan, SPLIT_MIN_QUERIES)
from inferlab.engine.triton_attention import (TritonAttention, attention_backend, store_kv_triton, paged_prefill_triton,
    paged_decode_triton)
from inferlab.engine.triton_runtime import interpreter_ready
from inferlab.testing import make_paged_batch, dense_prefill as dense_attention

needs_interpreter = pytest.mark.skipif(not interpreter_ready(), reason="triton was imported before TRITON_INTERPRET=1")

TOL = 1e-3   # float32, kernel vs reference




def prefill_args(pb, scale): return (pb.q, pb.k_cache, pb.v_cache, pb.block_tables, pb.cu_seqlens_q, pb.seq_lens, scale)
def decode_args(pb, scale): return (pb.decode_q, pb.k_cache, pb.v_cache, pb.block_tables, pb.seq_lens, scale)


# ---------------------------------------------------------------- the references, against dense attention (no Triton)

@pytest.mark.parametrize("hq,hkv,bs,window", [(4, 4, 16, None), (6, 2, 16, 7), (8, 2, 32, None), (4, 1, 32, 40)])
def test_prefill_reference_vs_dense(hq, hkv, bs, window):
    pb = make_paged_batch([1, 32, 45, 70], q_lens=[1, 32, 9, 70], num_q_heads=hq, num_kv_heads=hkv, head_dim=32,
                          block_size=bs, seed=hq + bs)
    out = paged_prefill_reference(*prefill_args(pb, 0.3), window)
    assert out.shape == pb.q.shape and out.dtype == pb.q.dtype
    assert (out - dense_attention(pb, 0.3, window)).abs().max() < 1e-5


@pytest.mark.parametrize("hq,hkv", [(4, 4), (8, 4), (6, 2)])
def test_prefill_after_a_prefix_without_a_mask(hq, hkv):
    """On CPU a chunk of SPLIT_MIN_QUERIES new tokens or more after a cached prefix builds no mask: two flash passes
    merged by their log-sum-exps (`causal_after_prefix`) give dense attention's result; a shorter chunk keeps its
    mask. Lengths around the threshold, a prefix shorter and longer than the chunk, one sequence with none."""
    n = SPLIT_MIN_QUERIES
    pb = make_paged_batch([n + 40, 3 * n + 7, n - 1 + 50, n], q_lens=[n, n + 5, n - 1, n], num_q_heads=hq,
                          num_kv_heads=hkv, head_dim=32, block_size=16, seed=hq)
    plan = prefill_plan(pb.cu_seqlens_q, pb.seq_lens)
    assert [m is None for *_, m in plan] == [True, True, False, True]
    out = paged_prefill_reference(*prefill_args(pb, 0.3), plan=plan)
    assert (out - dense_attention(pb, 0.3)).abs().max() < 1e-5


@pytest.mark.parametrize("hq,hkv,bs,window", [(4, 4, 16, None), (6, 2, 16, 1), (6, 2, 16, 20), (8, 2, 32, 33)])
def test_decode_reference_vs_dense(hq, hkv, bs, window):
    lens = [1, 16, 32, 33, 50, 69]
    pb = make_paged_batch(lens, q_lens=[1] * len(lens), num_q_heads=hq, num_kv_heads=hkv, head_dim=64,
                          block_size=bs, seed=hq * bs)
    out = paged_decode_reference(*decode_args(pb, 0.125), window)
    assert out.shape == (len(lens), hq, 64)
    assert (out - dense_attention(pb, 0.125, window)).abs().max() < 1e-5


def test_references_notice_a_wrong_block_table():
    """The dense check can fail: a table with two blocks swapped (causal prefill sees other keys first) or a block
    replaced by a spare one (decode reads garbage) changes the output."""
    pb = make_paged_batch([40], q_lens=[40], num_q_heads=2, num_kv_heads=2, block_size=16)
    swapped = pb.block_tables.clone(); swapped[0, [0, 1]] = swapped[0, [1, 0]]
    spare = pb.block_tables.clone()
    spare[0, 1] = min(set(range(pb.k_cache.shape[0])) - set(pb.block_tables[0].tolist()))   # a block it does not own
    ok = paged_prefill_reference(*prefill_args(pb, 0.3))
    assert (ok - dense_attention(pb, 0.3)).abs().max() < 1e-5
    bad = paged_prefill_reference(pb.q, pb.k_cache, pb.v_cache, swapped, pb.cu_seqlens_q, pb.seq_lens, 0.3)
    assert (bad - ok).abs().max() > 1e-2
    bad = paged_decode_reference(pb.decode_q, pb.k_cache, pb.v_cache, spare, pb.seq_lens, 0.3)
    assert (bad - ok[-1:]).abs().max() > 1e-2


def test_reference_dtypes_and_backend_choice_on_cpu():
    be = attention_backend("cpu")                                     # chosen once; CPU: the torch reference
    assert type(be) is TorchAttention and type(attention_backend("cpu", "triton")) is TritonAttention
    with pytest.raises(ValueError, match="attention_backend"): attention_backend("cpu", "flash")
    pb = make_paged_batch([5, 20], q_lens=[5, 3], num_q_heads=4, num_kv_heads=2, block_size=16, dtype=torch.bfloat16)
    out = be.prefill(*prefill_args(pb, 0.2))
    assert out.dtype == torch.bfloat16 and torch.equal(out, paged_prefill_reference(*prefill_args(pb, 0.2)))
    assert (out.float() - dense_attention(pb, 0.2)).abs().max() < 2e-2
    assert torch.equal(be.decode(*decode_args(pb, 0.2)), paged_decode_reference(*decode_args(pb, 0.2)))


def test_store_kv_reference_skips_minus_one():
    kc, vc = torch.zeros(3, 4, 2, 8), torch.zeros(3, 4, 2, 8)
    k, v = torch.randn(4, 2, 8), torch.randn(4, 2, 8)
    TorchAttention().store_kv(k, v, kc, vc, torch.tensor([11, -1, 0, 5]))
    assert torch.equal(kc.view(-1, 2, 8)[[11, 0, 5]], k[[0, 2, 3]]) and torch.equal(vc.view(-1, 2, 8)[5], v[3])
    assert kc.count_nonzero() == 3 * 16


# ---------------------------------------------------------------- Triton kernels (interpreter) against the references

# (q heads, kv heads, block size, head dim, window, splits): GQA 1, 2, 3 and 4; block sizes 16 and 32; head dims 32,
# 64 and 128; windows on and off; split-K 1, 2 and 3.
DECODE_CASES = [(2, 2, 16, 64, None, 1), (4, 2, 32, 128, 20, 1), (3, 1, 16, 32, None, 3), (4, 1, 32, 64, 5, 2),
                (8, 2, 16, 128, None, 2), (2, 2, 32, 32, 33, 1)]


@needs_interpreter
@pytest.mark.parametrize("hq,hkv,bs,d,window,splits", DECODE_CASES)
def test_decode_kernel(hq, hkv, bs, d, window, splits):
    lens = [1, bs, 45, 69]                                            # length 1, exactly one block, ragged
    pb = make_paged_batch(lens, q_lens=[1] * 4, num_q_heads=hq, num_kv_heads=hkv, head_dim=d, block_size=bs,
                          seed=d + bs)
    ref = paged_decode_reference(*decode_args(pb, d ** -0.5), window)
    out = paged_decode_triton(*decode_args(pb, d ** -0.5), window, num_splits=splits, block_n=32)
    assert out.shape == ref.shape and out.dtype == ref.dtype
    assert (out - ref).abs().max() < TOL


# (q heads, kv heads, block size, head dim, window, seq lens, query lens): cached prefixes (queries only on the last
# part), full prefills, a 1-token sequence, lengths that are exact block multiples.
PREFILL_CASES = [(2, 2, 16, 64, None, [37, 32, 1], [5, 32, 1]), (4, 2, 32, 128, 9, [64, 37, 5], [20, 37, 2]),
                 (4, 1, 16, 32, None, [69, 16], [69, 3]), (3, 1, 32, 64, 16, [50, 33], [50, 1])]


@needs_interpreter
@pytest.mark.parametrize("hq,hkv,bs,d,window,lens,q_lens", PREFILL_CASES)
def test_prefill_kernel(hq, hkv, bs, d, window, lens, q_lens):
    pb = make_paged_batch(lens, q_lens=q_lens, num_q_heads=hq, num_kv_heads=hkv, head_dim=d, block_size=bs, seed=d)
    ref = paged_prefill_reference(*prefill_args(pb, d ** -0.5), window)
    out = paged_prefill_triton(*prefill_args(pb, d ** -0.5), window, block_m=16, block_n=16)
    assert out.shape == ref.shape and (out - ref).abs().max() < TOL


@needs_interpreter
def test_prefill_kernel_default_tiles_and_strided_q():
    "Default tile sizes; q a strided view of a fused qkv tensor, as a model runner may pass it."
    pb = make_paged_batch([40, 7], q_lens=[30, 7], num_q_heads=4, num_kv_heads=2, head_dim=32, block_size=16)
    qkv = torch.zeros(pb.q.shape[0], 8, 32); qkv[:, :4] = pb.q
    q = qkv[:, :4]                                                     # [37, 4, 32], stride(0) = 256
    assert not q.is_contiguous()
    out = paged_prefill_triton(q, *prefill_args(pb, 0.2)[1:], None)
    assert (out - paged_prefill_reference(*prefill_args(pb, 0.2))).abs().max() < TOL


@needs_interpreter
@pytest.mark.parametrize("dtype,tol", [(torch.float16, 4e-3), (torch.bfloat16, 3e-2)])
def test_kernels_16bit(dtype, tol):
    pb = make_paged_batch([1, 16, 45], q_lens=[1, 9, 20], num_q_heads=4, num_kv_heads=2, head_dim=64, block_size=16,
                          dtype=dtype)
    out = paged_prefill_triton(*prefill_args(pb, 0.125))
    assert out.dtype == dtype and (out.float() - paged_prefill_reference(*prefill_args(pb, 0.125)).float()).abs().max() < tol
    out = paged_decode_triton(*decode_args(pb, 0.125), num_splits=2)
    assert out.dtype == dtype and (out.float() - paged_decode_reference(*decode_args(pb, 0.125)).float()).abs().max() < tol


@needs_interpreter
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_store_kv_kernel(dtype):
    kc, vc = torch.randn(5, 16, 2, 32).to(dtype), torch.randn(5, 16, 2, 32).to(dtype)
    kc2, vc2 = kc.clone(), vc.clone()
    k, v = torch.randn(6, 2, 32).to(dtype), torch.randn(6, 2, 32).to(dtype)
    slots = torch.tensor([3, -1, 17, 79, 40, -1])
    store_kv_reference(k, v, kc, vc, slots); store_kv_triton(k, v, kc2, vc2, slots)
    assert torch.equal(kc, kc2) and torch.equal(vc, vc2)


@needs_interpreter
def test_store_then_attend_through_the_kernels():
    "A chunk written by the store kernel after a cached prefix, then read by both attention kernels."
    pb = make_paged_batch([45], q_lens=[45], num_q_heads=4, num_kv_heads=2, head_dim=32, block_size=16)
    kc, vc = pb.k_cache.clone(), pb.v_cache.clone()
    new = slots_from_block_table(pb.block_tables[0], torch.arange(30, 45), 16)
    kc.view(-1, 2, 32)[new] = 0; vc.view(-1, 2, 32)[new] = 0
    store_kv_triton(pb.k_dense[0][30:], pb.v_dense[0][30:], kc, vc, new)
    cu = torch.tensor([0, 15], dtype=torch.int32)
    out = paged_prefill_triton(pb.q[30:], kc, vc, pb.block_tables, cu, pb.seq_lens, 0.2)
    assert (out - dense_attention(pb, 0.2)[30:]).abs().max() < TOL
    dec = paged_decode_triton(pb.q[44:], kc, vc, pb.block_tables, pb.seq_lens, 0.2)
    assert (dec - out[-1:]).abs().max() < TOL


# tools/gpu_check.py's run of these kernels (tiny shapes in the interpreter): tests/test_tools_gpu_check.py

def test_decode_reference_grouping_matches_one_group():
    "decode_plan's length groups (at most 2x padding) give the same attention as one padded group."
    from inferlab.engine.paged_attention import paged_decode_reference, decode_plan
    from inferlab.testing import make_paged_batch
    b = make_paged_batch([3, 700, 70, 16, 250, 1, 33], num_q_heads=4, num_kv_heads=2, head_dim=32, block_size=16)
    q = b.q[b.cu_seqlens_q[1:].long() - 1]                                    # the last query of each sequence
    grouped = decode_plan(b.block_tables, b.seq_lens, 16)
    assert len(grouped) > 2
    one = decode_plan(b.block_tables, b.seq_lens, 16, max_waste=float("inf"))
    assert len(one) == 1
    a = paged_decode_reference(q, b.k_cache, b.v_cache, b.block_tables, b.seq_lens, 0.17, plan=grouped)
    c = paged_decode_reference(q, b.k_cache, b.v_cache, b.block_tables, b.seq_lens, 0.17, plan=one)
    assert (a - c).abs().max() < 1e-5


# -- quantized KV blocks (fp8 E4M3, int8) with per-head scales, and this step's fresh K/V in full precision ---------
def quantize_pool(pb, dtype):
    "The batch's pool as 8-bit codes with one float32 scale per KV head (amax x 2 headroom, as the engine calibrates)."
    from inferlab.engine.paged_attention import kv_quantize, kv_scale
    nb, bs, h, d = pb.k_cache.shape
    ks, vs = kv_scale(pb.k_cache, dtype), kv_scale(pb.v_cache, dtype)
    kc = kv_quantize(pb.k_cache.view(-1, h, d), ks, dtype).view(nb, bs, h, d)
    vc = kv_quantize(pb.v_cache.view(-1, h, d), vs, dtype).view(nb, bs, h, d)
    return kc, vc, ks, vs

@needs_interpreter
@pytest.mark.parametrize("dtype", [torch.int8, torch.float8_e4m3fn])
@pytest.mark.parametrize("fresh", [False, True])
@pytest.mark.parametrize("window,splits", [(None, 1), (None, 2), (9, 1)])
def test_decode_kernel_quantized_kv(dtype, fresh, window, splits):
    pb = make_paged_batch([37, 5, 16], [1, 1, 1], num_q_heads=4, num_kv_heads=2, head_dim=32, seed=5)
    kc, vc, ks, vs = quantize_pool(pb, dtype)
    last = pb.cu_seqlens_q[1:].long() - 1
    kn = torch.stack([k[-1] for k in pb.k_dense]) if fresh else None     # [B, kv_heads, head_dim]
    vn = torch.stack([v[-1] for v in pb.v_dense]) if fresh else None
    args = (pb.q[last], kc, vc, pb.block_tables, pb.seq_lens, 32 ** -0.5, window, ks, vs, kn, vn)
    ref = paged_decode_reference(*args[:7], None, *args[7:])
    out = paged_decode_triton(*args, num_splits=splits, block_n=16)
    assert (out - ref).abs().max() < TOL
    if fresh:                                                            # the fresh keys changed something
        assert (ref - paged_decode_reference(*args[:7], None, ks, vs)).abs().max() > 1e-4

@needs_interpreter
@pytest.mark.parametrize("dtype", [torch.int8, torch.float8_e4m3fn])
@pytest.mark.parametrize("fresh", [False, True])
@pytest.mark.parametrize("window", [None, 6])
def test_prefill_kernel_quantized_kv(dtype, fresh, window):
    pb = make_paged_batch([21, 7, 33], [5, 7, 16], num_q_heads=4, num_kv_heads=2, head_dim=32, seed=6)
    kc, vc, ks, vs = quantize_pool(pb, dtype)
    cu = pb.cu_seqlens_q.tolist()
    kn = torch.cat([k[len(k) - (cu[i + 1] - cu[i]):] for i, k in enumerate(pb.k_dense)]) if fresh else None
    vn = torch.cat([v[len(v) - (cu[i + 1] - cu[i]):] for i, v in enumerate(pb.v_dense)]) if fresh else None
    args = (pb.q, kc, vc, pb.block_tables, pb.cu_seqlens_q, pb.seq_lens, 32 ** -0.5, window, ks, vs, kn, vn)
    ref = paged_prefill_reference(*args)
    out = paged_prefill_triton(*args, block_m=16, block_n=16)
    assert (out - ref).abs().max() < TOL
    if fresh: assert (ref - paged_prefill_reference(*args[:10])).abs().max() > 1e-4
