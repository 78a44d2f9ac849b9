"""Quantized-matmul kernels (chapter 24) against their torch references, and the references against `QuantLinear`
(chapter 22a's storage formats), so that every kernel is tied to the real format.

The Triton kernels run in Triton's interpreter on CPU tensors, which must be switched on before triton is first
imported; hence the environment variable before any other import. Shapes are tiny (M <= 16, N <= 64, K <= 256): the
interpreter runs each program in Python, ~1000x slower than torch.
"""
import os
os.environ["TRITON_INTERPRET"] = "1"

import pytest
import torch
import torch.nn as nn
triton = pytest.importorskip("triton")
from inferlab.engine.triton_runtime import interpreter_ready
from inferlab.quant.block_formats import NVFP4Tensor, nvfp4_dequantize
from inferlab.quant.linear import QuantLinear, cpu_kernels, cpu_packed_applies, cpu_packed_matmul, quantize_activation
from inferlab.model.hardware import GPUSpec
from inferlab.quant.kernels import (bits_per_weight, decode_tokens_per_s, ridge_batch, linear_time_s,
    quantize_per_token, int8_matmul_int32, w4a16_matmul_reference, w4a16_matmul_triton, w8a8_matmul_reference,
    w8a8_matmul_triton, w8a16_matmul_reference, w8a16_matmul_triton, fp8_matmul_reference, fp8_matmul_triton,
    nvfp4_matmul_reference, nvfp4_matmul_triton, quant_matmul, quant_matmul_kind, use_gpu_kernels)

needs_interpreter = pytest.mark.skipif(not interpreter_ready(), reason="triton was imported before TRITON_INTERPRET=1")

TOL = 1e-5          # float32: max |kernel - reference| / max |reference|


def layer(weights, N, K, activations=None, seed=0, bias=False) -> QuantLinear:
    "A QuantLinear made by round-to-nearest from a random linear layer with a few loud input channels."
    g = torch.Generator().manual_seed(seed)
    lin = nn.Linear(K, N, bias=bias)
    with torch.no_grad():
        lin.weight.copy_(torch.randn(N, K, generator=g) * 0.05)
        lin.weight[:, ::37] *= 8
        if bias: lin.bias.copy_(torch.randn(N, generator=g))
    return QuantLinear.from_linear(lin, weights, activations)


def inputs(M, K, seed=1, dtype=torch.float32):
    return torch.randn(M, K, generator=torch.Generator().manual_seed(seed)).to(dtype)


def rel_err(a, b) -> float: return ((a.float() - b.float()).abs().max() / b.float().abs().max()).item()


def reference(q: QuantLinear, x):
    "The chapter's reference for `q`'s format, from its buffers."
    kind = quant_matmul_kind(q)
    if kind == "w4a16": return w4a16_matmul_reference(x, q.qweight, q.scale, q.spec.group_size)
    if kind == "w8a8": return w8a8_matmul_reference(x, q.qweight, q.scale)
    if kind == "w8a16": return w8a16_matmul_reference(x, q.qweight, q.scale)
    return nvfp4_matmul_reference(x, q.qweight, q.scale, q.tensor_scale)


def triton_kernel(q: QuantLinear, x, **tiles):
    kind = quant_matmul_kind(q)
    if kind == "w4a16": return w4a16_matmul_triton(x, q.qweight, q.scale, q.spec.group_size, **tiles)
    if kind == "w8a8": return w8a8_matmul_triton(x, q.qweight, q.scale, **tiles)
    if kind == "w8a16": return w8a16_matmul_triton(x, q.qweight, q.scale, **tiles)
    return nvfp4_matmul_triton(x, q.qweight, q.scale, q.tensor_scale, **tiles)


FORMATS = [("int4-g32", None), ("int4-g128", None), ("int8", None), ("fp8", None), ("fp8-tensor", None),
           ("nvfp4", None), ("int8", "int8")]

# ------------------------------------------------------------- the references, against QuantLinear (no Triton)

@pytest.mark.parametrize("weights,act", FORMATS)
@pytest.mark.parametrize("M,N,K", [(1, 64, 256), (7, 48, 200), (3, 40, 65)])
def test_reference_matches_quantlinear(weights, act, M, N, K):
    q = layer(weights, N, K, act)
    x = inputs(M, K)
    ref, ql = reference(q, x), q(x)
    if act is None: assert torch.equal(ref, ql)             # the same dequantize-then-F.linear, bit for bit
    else: assert rel_err(ref, ql) < 1e-6                    # integer sum then scales vs fake-quant floats
    x3 = inputs(2 * M * 3, K).view(2, 3 * M, K)              # [batch, tokens, K]
    assert reference(q, x3).shape == (2, 3 * M, N) and rel_err(reference(q, x3), q(x3)) < 1e-6


@pytest.mark.parametrize("weights", ["int8", "int4-g32", "int4-g128"])
def test_reference_vs_cpu_packed_kernels(weights):
    "QuantLinear on CPU takes PyTorch's packed weight-only kernels for bf16 decode rows; they agree with the reference."
    q = layer(weights, 64, 256)
    x = inputs(1, 256, dtype=torch.bfloat16)
    if not cpu_packed_applies(x, q): pytest.skip(f"no PyTorch CPU kernel for {weights} here: {cpu_kernels()}")
    assert rel_err(q(x), reference(q, x)) < 2e-2          # two bf16 computations (1 bf16 ulp = 0.4%)


def test_per_token_quantization_and_exact_int_matmul():
    x = inputs(5, 200)
    xq, xs = quantize_per_token(x)
    assert xq.dtype == torch.int8 and xs.shape == (5,)
    assert torch.equal(xq.float() * xs[:, None], quantize_activation(x, "int8"))
    g = torch.Generator().manual_seed(0)
    a = torch.randint(-128, 128, (3, 5000), dtype=torch.int8, generator=g)
    b = torch.randint(-128, 128, (4, 5000), dtype=torch.int8, generator=g)
    a[:, :] = -128; b[0, :] = -128                          # 5000 * 2^14 = 8.2e7 > 2^24: float32 alone would round
    assert torch.equal(int8_matmul_int32(a, b), (a.long() @ b.long().t()).int())


def nvfp4_every_code(N=16, K=256):
    "NVFP4 buffers holding every byte (all E2M1 pairs) and every finite E4M3 scale code 0..126."
    qweight = (torch.arange(N * K // 2) % 256).to(torch.uint8).view(N, K // 2)
    scale = (torch.arange(N * K // 16) % 127).to(torch.uint8).view(N, K // 16)
    return qweight, scale, torch.tensor([0.01])


def test_nvfp4_reference_matches_block_formats_on_every_code():
    qweight, scale, ts = nvfp4_every_code()
    x = inputs(3, 256)
    w = nvfp4_dequantize(NVFP4Tensor(qweight, scale, ts.reshape(()), (16, 256)))    # chapter 21's decoder
    want = x @ w.t()                        # MKL's sums; the reference's GEMM (chapter 14a) sums in another order
    assert torch.allclose(nvfp4_matmul_reference(x, qweight, scale, ts), want, rtol=1e-6, atol=1e-6 * want.abs().max())


# ------------------------------------------------------------------ the Triton kernels, against the references

CASES = [(1, 64, 256), (5, 48, 200), (16, 40, 96)]     # M = 1; K not a multiple of the tile; N not a multiple of 64

@needs_interpreter
@pytest.mark.parametrize("weights,act", FORMATS)
@pytest.mark.parametrize("M,N,K", CASES)
def test_triton_matches_reference(weights, act, M, N, K):
    q = layer(weights, N, K, act)
    x = inputs(M, K)
    err = rel_err(triton_kernel(q, x), reference(q, x))
    assert err < TOL, f"{weights} {act}: {err:.1e}"


@needs_interpreter
@pytest.mark.parametrize("weights,act", FORMATS)
def test_triton_k_tail_and_split_k(weights, act):
    "32-wide K tiles over K = 200 (a tail tile) shared by 3 programs that write float32 partials."
    q = layer(weights, 48, 200, act, seed=3)
    x = inputs(4, 200, seed=4)
    err = rel_err(triton_kernel(q, x, block_k=32, block_n=16, split_k=3), reference(q, x))
    assert err < TOL, f"{weights} {act}: {err:.1e}"


@needs_interpreter
def test_triton_nvfp4_every_code():
    "x = identity rows: the kernel's output is its decoded weight, each E2M1 pair and E4M3 scale code checked."
    qweight, scale, ts = nvfp4_every_code()
    w = nvfp4_dequantize(NVFP4Tensor(qweight, scale, ts.reshape(()), (16, 256)))     # [16, 256]
    out = nvfp4_matmul_triton(torch.eye(256), qweight, scale, ts)                       # [256, 16] = w.T
    assert torch.allclose(out, w.t(), rtol=1e-6, atol=0)                               # 1 ulp: scale order


@needs_interpreter
def test_triton_w8a8_integer_sum_is_exact():
    "Rows whose max is 127 get scale 1: the output is the exact int32 sum of code products."
    g = torch.Generator().manual_seed(0)
    x = torch.randint(-127, 128, (4, 256), generator=g).float(); x[:, 0] = 127
    w = torch.randint(-128, 128, (40, 256), dtype=torch.int8, generator=g)
    exact = int8_matmul_int32(x.to(torch.int8), w).float()
    assert torch.equal(w8a8_matmul_triton(x, w, torch.ones(40)), exact)
    assert torch.equal(w8a8_matmul_reference(x, w, torch.ones(40)), exact)


@needs_interpreter
@pytest.mark.parametrize("weights,dtype,tol", [("int4-g32", torch.bfloat16, 1e-2), ("nvfp4", torch.bfloat16, 1e-2),
                                               ("fp8", torch.float16, 2e-3), ("int8", torch.bfloat16, 1e-2)])
def test_triton_16bit_inputs(weights, dtype, tol):
    "bf16 inputs take float32 tiles in the interpreter (its bf16 dot is broken); outputs round to 16 bits."
    q = layer(weights, 48, 200)
    x = inputs(3, 200, dtype=dtype)
    out = triton_kernel(q, x)
    assert out.dtype == dtype and rel_err(out, reference(q, x)) < tol


@needs_interpreter
def test_triton_empty_and_strided_inputs():
    q = layer("int4-g32", 32, 64)
    assert w4a16_matmul_triton(torch.zeros(0, 64), q.qweight, q.scale, 32).shape == (0, 32)
    x = inputs(6, 128)[:, ::2]                               # non-contiguous [6, 64]
    assert rel_err(w4a16_matmul_triton(x, q.qweight, q.scale, 32), reference(q, x)) < TOL


# -------------------------------------------------------------------------------------------------- dispatch

@needs_interpreter
@pytest.mark.parametrize("weights,act", [("int4-g64", None), ("int8", "int8"), ("int8", None), ("fp8", None), ("nvfp4", None)])
def test_quant_matmul_equals_quantlinear(weights, act):
    q = layer(weights, 48, 130, act, bias=True)
    x = inputs(6, 130).view(2, 3, 130)
    out = quant_matmul(x, q, allow_interpreter=True)
    assert out.shape == (2, 3, 48) and rel_err(out, q(x)) < TOL
    assert quant_matmul(x, q) is None                        # CPU tensors: the caller runs QuantLinear's own path


@needs_interpreter
def test_use_gpu_kernels_sets_each_layer_explicitly():
    m = nn.Sequential(layer("int4-g64", 130, 130, bias=True), layer("mxfp4", 48, 130))
    x = inputs(6, 130).view(2, 3, 130)
    own = m(x)                                               # each layer's own path (the reference: float32 input)
    assert use_gpu_kernels(m) == 0 and all(l.kernel is cpu_packed_matmul for l in m)   # CPU layers: untouched
    assert use_gpu_kernels(m, allow_interpreter=True) == 1   # MXFP4 has no kernel: it keeps its own path
    assert m[1].kernel is cpu_packed_matmul and m[0].kernel.func is quant_matmul
    assert rel_err(m(x), own) < TOL
    other = layer("int4-g64", 130, 130, bias=True)
    assert other.kernel is cpu_packed_matmul                 # nothing process-wide changed


def test_quant_matmul_kinds_and_fallbacks():
    kinds = {w: quant_matmul_kind(layer(w, 16, 64)) for w in ["int4-g32", "int4-g128", "int8", "int8-tensor", "fp8",
                                                                "fp8-tensor", "nvfp4", "int8-g128", "mxfp4", None]}
    assert kinds == {"int4-g32": "w4a16", "int4-g128": "w4a16", "int8": "w8a16", "int8-tensor": "w8a16",
                     "fp8": "w8a16", "fp8-tensor": "w8a16", "nvfp4": "nvfp4", "int8-g128": None, "mxfp4": None, None: None}
    assert quant_matmul_kind(layer("int8", 16, 64, "int8")) == "w8a8"
    assert quant_matmul_kind(layer("int4-g32", 16, 64, "fp8")) is None          # fp8 activations: no kernel
    assert quant_matmul(inputs(2, 64), layer("int8-g128", 16, 64), allow_interpreter=True) is None


# ------------------------------------------------------------------------------------------- bad arguments

def test_bad_arguments_name_the_argument():
    q4, q8, qn = layer("int4-g128", 16, 200), layer("int8", 16, 200), layer("nvfp4", 16, 200)
    x = inputs(2, 200)
    with pytest.raises(ValueError, match="group_size"): w4a16_matmul_reference(x, q4.qweight, q4.scale, 48)
    with pytest.raises(ValueError, match="scale"): w4a16_matmul_reference(x, q4.qweight, q4.scale, 64)
    with pytest.raises(ValueError, match="x:"): w4a16_matmul_reference(inputs(2, 100), q4.qweight, q4.scale, 128)
    with pytest.raises(ValueError, match="qweight"): w4a16_matmul_reference(x, q8.qweight, q4.scale, 128)
    with pytest.raises(ValueError, match="qweight"): w8a8_matmul_reference(x, q4.qweight, q8.scale)
    with pytest.raises(ValueError, match="x:"): w8a16_matmul_reference(inputs(2, 64), q8.qweight, q8.scale)
    with pytest.raises(ValueError, match="qweight"): fp8_matmul_reference(x, q8.qweight, q8.scale)
    with pytest.raises(ValueError, match="block_scale"): nvfp4_matmul_reference(x, qn.qweight, qn.scale[:, 1:], qn.tensor_scale)
    with pytest.raises(ValueError, match="a, b"): int8_matmul_int32(x, q8.qweight)


@needs_interpreter
def test_bad_tiles_name_the_argument():
    q = layer("int8", 16, 64)
    x = inputs(2, 64)
    with pytest.raises(ValueError, match="block_k"): w8a16_matmul_triton(x, q.qweight, q.scale, block_k=48)
    with pytest.raises(ValueError, match="split_k"): w8a16_matmul_triton(x, q.qweight, q.scale, split_k=0)
    with pytest.raises(ValueError, match="x:"): w8a16_matmul_triton(x.to(torch.int32), q.qweight, q.scale)


# --------------------------------------------------------------------------------------------- the roofline

def test_roofline_numbers():
    assert bits_per_weight(None) == 16 and bits_per_weight("int4-g128") == 4.125 and bits_per_weight("nvfp4") == 4.5
    assert bits_per_weight("int8", 4096) == 8 + 16 / 4096 and bits_per_weight("int8-tensor") == 8
    mem, comp = linear_time_s(7e9, 1, 16)
    assert abs(mem - 14e9 / 4.8e12) < 1e-12 and abs(comp - 14e9 / 989e12) < 1e-15
    assert abs(decode_tokens_per_s(7e9, 1, 4.125) / decode_tokens_per_s(7e9, 1, 16) - 16 / 4.125) < 1e-9
    assert abs(ridge_batch(16) - 989 / 4.8) < 1e-9
    assert decode_tokens_per_s(7e9, 4096, 4.125) == decode_tokens_per_s(7e9, 4096, 16)   # compute-bound: same
    with pytest.raises(ValueError, match="int8_tops"): GPUSpec(int8_tops=-1)


# tools/gpu_check.py's quantized-matmul checks (tiny shapes in the interpreter): tests/test_tools_gpu_check.py
