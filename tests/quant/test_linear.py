"Quantized linear layers (chapter 22a): int4 packing, round-to-nearest, activation fake-quant, QuantLinear and its kernel slot."
import copy
import pytest, torch
import torch.nn as nn
import torch.nn.functional as F
from inferlab.engine.cpu_gemm import many_rows_matmul
from hypothesis import given, settings, strategies as st, HealthCheck
from inferlab.quant.linear import (QuantLinear, pack_int4, unpack_int4, parse_weight_format, quantize_weight,
    dequantize_codes, scales_per_column, padded_in_features, quantize_activation, cpu_kernels, cpu_packed_applies,
    cpu_packed_matmul, WEIGHT_FORMATS)

# ---- formats, packing, rounding

@settings(max_examples=50, deadline=None)
@given(st.integers(1, 5), st.integers(1, 40), st.integers(0, 2**31 - 1))
def test_int4_packing_round_trips(rows, half, seed):
    codes = torch.randint(-8, 8, (rows, 2 * half), generator=torch.Generator().manual_seed(seed), dtype=torch.int8)
    packed = pack_int4(codes)
    assert packed.dtype == torch.uint8 and packed.shape == (rows, half)
    assert torch.equal(unpack_int4(packed), codes)
    assert torch.equal(packed & 0xF, (codes[:, 0::2] + 8).to(torch.uint8))      # low nibble = even element

@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(["int8", "int8-tensor", "int8-g32", "int4-channel", "int4-g16", "int4-g32", "int4-g128"]),
       st.integers(1, 12), st.integers(1, 300), st.floats(1e-3, 1e3), st.integers(0, 2**31 - 1))
def test_rtn_error_is_at_most_half_a_step(fmt, n, k, mag, seed):
    spec = parse_weight_format(fmt)
    w = torch.randn(n, k, generator=torch.Generator().manual_seed(seed)) * mag
    codes, scale = quantize_weight(w, spec)
    assert codes.shape == (n, padded_in_features(k, spec)) and (codes[:, k:] == 0).all()
    deq = dequantize_codes(codes, scale, spec, k)
    step = scales_per_column(scale, spec, k)
    assert ((w - deq).abs() <= 0.5 * step * (1 + 2e-3) + 1e-30).all()

def test_fp8_weights_saturate_and_round_relatively():
    spec = parse_weight_format("fp8-tensor")
    w = torch.randn(16, 64) * 3
    codes, scale = quantize_weight(w, spec)
    assert codes.dtype == torch.float8_e4m3fn and not torch.isnan(codes.float()).any()
    deq = dequantize_codes(codes, scale, spec, 64)
    assert ((w - deq).abs() <= w.abs() * 2 ** -4 + scale * 2 ** -9).all()      # 3 mantissa bits; subnormal floor
    assert float(deq.abs().max()) == pytest.approx(float(w.abs().max()), rel=1e-6)   # the max maps to 448 exactly

def test_activation_fake_quant():
    x = torch.randn(7, 33) * torch.logspace(-2, 2, 33)
    q = quantize_activation(x, "int8")                                         # per token: row max survives exactly
    assert torch.allclose(q.abs().amax(-1), x.abs().amax(-1)) and ((q - x).abs() <= x.abs().amax(-1, keepdim=True) / 254 + 1e-6).all()
    assert torch.unique(quantize_activation(x, "int8-tensor") / (x.abs().max() / 127)).round().abs().max() <= 127
    assert quantize_activation(x.bfloat16(), "fp8").dtype == torch.bfloat16

# ---- QuantLinear

@pytest.mark.parametrize("fmt", [f for f in WEIGHT_FORMATS if f != "mxfp8_e5m2"] + [None])
def test_quantlinear_equals_reference_dequant_matmul(fmt):
    torch.manual_seed(0)
    lin = nn.Linear(200, 48)                                                   # K = 200: not a multiple of 32, 64, 128
    q = QuantLinear.from_linear(lin, fmt)
    x = torch.randn(2, 3, 200)
    ref = torch.nn.functional.linear(x, q.dequantize(), lin.bias)
    assert torch.allclose(q(x), ref, atol=1e-5)
    rel_rms = ((q.dequantize() - lin.weight).pow(2).mean() / lin.weight.pow(2).mean()).sqrt()
    assert rel_rms < {4: 0.2, 6: 0.08}.get(q.spec.bits, 0.05), (fmt, rel_rms)
    qa = QuantLinear.from_linear(lin, fmt, activations="int8")
    assert torch.allclose(qa(x), torch.nn.functional.linear(quantize_activation(x, "int8"), q.dequantize(), lin.bias), atol=1e-5)

@pytest.mark.parametrize("fmt", ["int8", "int4-g32", "int4-g128"])
def test_cpu_kernel_path_matches_reference(fmt):
    if not cpu_kernels()["int8" if fmt == "int8" else "int4"]: pytest.skip("no working CPU kernel in this torch")
    torch.manual_seed(1)
    lin = nn.Linear(704, 96)                                                   # K padded to 768 for g128
    q = QuantLinear.from_linear(lin, fmt).to(torch.bfloat16)
    x = torch.randn(1, 704).bfloat16()
    assert cpu_packed_applies(x, q) and not cpu_packed_applies(torch.randn(64, 704).bfloat16(), q)
    assert not cpu_packed_applies(x.float(), q)
    ref = x.float() @ q.dequantize().t() + lin.bias
    assert q.kernel is cpu_packed_matmul and torch.equal(q(x), cpu_packed_matmul(x, q))
    assert torch.allclose(q(x).float(), ref, rtol=2e-2, atol=3e-2)
    q.kernel = None                                                            # this layer only: the reference
    assert torch.allclose(q(x).float(), ref, rtol=2e-2, atol=3e-2)
    assert torch.equal(q(x), F.linear(x, q.dequantize().bfloat16(), q.bias))

def test_to_dtype_keeps_codes_and_scales():
    lin = nn.Linear(64, 32)
    for fmt in ["fp8", "int4-g32", "nvfp4"]:
        q = QuantLinear.from_linear(lin, fmt)
        before = {k: v.clone() for k, v in q.state_dict().items() if k != "bias"}
        qb = q.to(torch.bfloat16)
        assert qb.compute_dtype == torch.bfloat16 and qb.bias.dtype == torch.bfloat16 and qb.weight.dtype == torch.bfloat16
        for k, v in before.items(): assert qb.state_dict()[k].dtype == v.dtype and torch.equal(qb.state_dict()[k], v)


def test_kernel_slot_is_per_layer_and_falls_back():
    lin = nn.Linear(64, 32)
    a, b = QuantLinear.from_linear(lin, "int8"), QuantLinear.from_linear(lin, "int8")
    assert not hasattr(QuantLinear, "use_kernel") and not hasattr(QuantLinear, "kernel")   # no class-wide switch
    x = torch.randn(3, 64)
    calls = []
    a.kernel = lambda x, layer: calls.append(layer) or None                    # declines: the reference runs
    assert torch.equal(a(x), many_rows_matmul(x, a.dequantize().t(), lin.bias)) and calls == [a]   # chapter 14a's GEMM
    assert torch.allclose(a(x), F.linear(x, a.dequantize(), lin.bias), atol=1e-6)
    a.kernel = lambda x, layer: torch.full((*x.shape[:-1], layer.out_features), 7.0)
    assert (a(x) == 7).all() and b.kernel is cpu_packed_matmul and not (b(x) == 7).all()
    c = copy.deepcopy(a).to(torch.bfloat16)                                    # the slot survives copies and moves
    assert (c(x.bfloat16()) == 7).all()
    assert QuantLinear(64, 32, "int8", codes=torch.zeros(32, 64, dtype=torch.int8), scale=torch.ones(32), kernel=None).kernel is None
