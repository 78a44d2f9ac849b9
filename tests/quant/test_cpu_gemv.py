"Chapter 24a's C kernels for few float32 rows against int8 / int4 weight-only codes, and their place in the engine."
import numpy as np
import pytest, torch
import torch.nn as nn
from hypothesis import example, given, settings, strategies as st, HealthCheck
from inferlab.model.config import shipped_model_path
from inferlab.model.model import load_model
from inferlab.model.sampling import SamplingParams
from inferlab.engine.llm_engine import LLMEngine, EngineConfig
from inferlab.quant.linear import QuantLinear, cpu_packed_matmul
from inferlab.quant.presets import quantize_model
from inferlab.quant import cpu_gemv
from inferlab.quant.cpu_gemv import (gemv_library, build_gemv, w8_gemv, w4_gemv, gemv_rows, cpu_gemv_matmul,
                                     use_cpu_gemv, GEMV_MAX_ROWS)

needs_lib = pytest.mark.skipif(gemv_library()[0] is None, reason=f"C kernels unavailable: {gemv_library()[1]}")

def _layer(fmt, n, k, seed, bias=False):
    lin = nn.Linear(k, n, bias=bias)
    g = torch.Generator().manual_seed(seed)
    nn.init.normal_(lin.weight, generator=g)
    if bias: nn.init.normal_(lin.bias, generator=g)
    q = QuantLinear.from_linear(lin, fmt); q.kernel = None                  # the reference
    return q

@needs_lib
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(["int8", "int4-g32", "int4-g64", "int4-g128"]), st.integers(1, 70), st.integers(1, 400),
       st.integers(1, GEMV_MAX_ROWS), st.integers(0, 2**31 - 1))
@example("int4-g32", 1, 399, 1, 2230)                                   # terms that cancel
def test_matches_reference_and_each_row_alone(fmt, n, k, m, seed):
    q = _layer(fmt, n, k, seed)
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(seed + 1))
    ref = q(x)
    got = torch.from_numpy(gemv_rows(q, x.numpy()))
    # two float32 sums of the same terms in different orders: they differ by up to ~k ulps of the terms' size, so
    # the bound scales with sum |x w| (a tolerance on |y| fails when the terms cancel: k = 399, y = 0.09)
    assert ((got - ref).abs() <= 1e-5 * (x.abs() @ q.dequantize().float().abs().T)).all()
    for i in range(m):                     # a row's bits never depend on its neighbours or on the thread count
        assert torch.equal(torch.from_numpy(gemv_rows(q, x[i:i + 1].numpy())), got[i:i + 1])

@needs_lib
def test_threads_do_not_change_bits():
    q = _layer("int8", 131, 777, 3)
    x = np.random.default_rng(0).standard_normal((3, 777), dtype=np.float32)
    codes, scale = q.qweight.numpy(), q.scale.float().numpy()
    assert np.array_equal(w8_gemv(x, codes, scale, threads=1), w8_gemv(x, codes, scale, threads=2))

@needs_lib
def test_bad_arguments_are_named():
    q = _layer("int8", 8, 32, 0)
    x = np.zeros((1, 32), np.float32)
    with pytest.raises(ValueError, match="codes must be int8"):
        w8_gemv(x, q.qweight.numpy().astype(np.int16), q.scale.float().numpy())
    with pytest.raises(ValueError, match="scale"):
        w8_gemv(x, q.qweight.numpy(), q.scale.numpy())                     # float16 scales: not what the C reads
    q4 = _layer("int4-g32", 8, 64, 0)
    with pytest.raises(ValueError, match="multiple of group"):
        w4_gemv(np.zeros((1, 64), np.float32), q4.qweight.numpy(), q4.scale.float().numpy(), group=24)

@needs_lib
def test_kernel_slot_bias_and_what_it_declines():
    q = _layer("int8", 40, 96, 1, bias=True)
    x = torch.randn(2, 3, 96)
    ref = q(x)
    assert use_cpu_gemv(nn.Sequential(q)) == 1 and q.kernel is cpu_gemv_matmul
    assert torch.allclose(q(x), ref, atol=1e-4)                            # [2, 3, 96]: 6 rows, bias added once
    assert cpu_gemv_matmul(torch.randn(GEMV_MAX_ROWS + 1, 96), q) is None  # a prefill: the reference's GEMM
    assert cpu_gemv_matmul(x.bfloat16(), q) is None
    w8a8 = QuantLinear.from_linear(nn.Linear(96, 8), "int8", "int8")
    assert use_cpu_gemv(nn.Sequential(w8a8)) == 0                          # activations quantized: not this kernel

def test_no_compiler_no_library_nothing_left(tmp_path):
    lib, why = build_gemv(tmp_path, cc="no-such-compiler")
    assert lib is None and why and list(tmp_path.iterdir()) == []

def test_presets_fall_back_without_the_library(monkeypatch):
    monkeypatch.setattr(cpu_gemv, "gemv_library", lambda: (None, "no C compiler"))
    m = quantize_model(load_model(shipped_model_path("tiny-dense"), dtype=torch.float32), "w8a16")
    k = m.model.layers[0].mlp.down_proj.kernel
    assert k.func is cpu_packed_matmul and k.keywords["float32_as"] == torch.bfloat16   # chapter 22a's a16

@needs_lib
@pytest.mark.parametrize("preset", ["w8a16", "w4a16"])
def test_engine_decodes_quantized_models_in_numpy_with_the_reference_tokens(preset):
    "The C kernels give a quantized engine the NumPy decode step; greedy tokens equal the torch reference path's."
    model = quantize_model(load_model(shipped_model_path("tiny-dense"), dtype=torch.float32), preset)
    prompts = [[1, 5, 9, 200, 31], [7, 7, 3], list(range(40, 90))]
    sp = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    fast = LLMEngine(model, None, EngineConfig(max_num_seqs=4))
    assert fast.runner.numpy_decoder is not None and not fast.runner.numpy_decoder.uses_blas
    ref_model = quantize_model(load_model(shipped_model_path("tiny-dense"), dtype=torch.float32), preset)
    for l in ref_model.modules():
        if isinstance(l, QuantLinear): l.kernel, l.few_rows = None, None       # dequantize + F.linear everywhere
    ref = LLMEngine(ref_model, None, EngineConfig(max_num_seqs=4))
    assert ref.runner.numpy_decoder is None
    assert _greedy(fast, prompts, sp) == _greedy(ref, prompts, sp)

def _greedy(engine, prompts, sp) -> list[list[int]]:
    ids, out = [engine.add_request(p, sp) for p in prompts], {}
    while engine.has_unfinished():
        out.update({o.request_id: o.token_ids for o in engine.step() if o.finished})
    return [out[i] for i in ids]
