"""Scaling granularity (chapter 22): `fake_quantize` per tensor / channel / token / group / block, its error metrics and
its storage bill, checked against chapters 20 and 21 and against properties that must hold for any tensor."""
import math

import pytest
import torch
from hypothesis import given, settings, strategies as st

from inferlab.quant.block_formats import BLOCK_FORMATS, quantize_dequantize, bits_per_element
from inferlab.quant.formats import quantize_symmetric, dequantize_int
from inferlab.quant.granularity import (SCALED_FORMATS, GRANULARITIES, fake_quantize, compute_scales, scale_groups,
                                        quant_error, num_scales, scale_overhead_bits, storage_bits, capture_inputs)

NESTED = [("tensor", 128), ("channel", 128), ("group", 128), ("group", 64), ("group", 32), ("group", 16)]


def weight_with_outlier(seed: int, rows: int = 64, cols: int = 256) -> torch.Tensor:
    "A weight-like tensor `[rows, cols]` (N(0, 0.05²)) with one element 100 times its RMS."
    gen = torch.Generator().manual_seed(seed)
    w = torch.randn(rows, cols, generator=gen) * 0.05
    w[rows // 3, cols // 5] = 100 * w.pow(2).mean().sqrt()
    return w


@pytest.mark.parametrize("fmt", SCALED_FORMATS)
def test_tensor_equals_whole_row_group_when_rows_share_amax(fmt):
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(32, 128, generator=gen).clamp(-2.9, 2.9)
    x[:, 7] = torch.where(torch.arange(32) % 2 == 0, 3.0, -3.0)              # every row: amax 3 (either sign)
    ref = fake_quantize(x, fmt, "tensor")
    assert torch.equal(ref, fake_quantize(x, fmt, "group", group_size=128))
    assert torch.equal(ref, fake_quantize(x, fmt, "channel")) and torch.equal(ref, fake_quantize(x, fmt, "token"))


@pytest.mark.parametrize("fmt", SCALED_FORMATS)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_finer_granularity_never_larger_max_error_on_outlier_tensor(fmt, seed):
    w = weight_with_outlier(seed)
    worst = [(fake_quantize(w, fmt, g, gs) - w).abs().max().item() for g, gs in NESTED]
    assert all(b <= a for a, b in zip(worst, worst[1:])), worst
    sqnr = [quant_error(w, fake_quantize(w, fmt, g, gs))["sqnr_db"] for g, gs in NESTED]
    assert sqnr[-1] >= sqnr[0]


def test_outlier_per_tensor_int_destroys_rest_finer_contains_it():
    w = weight_with_outlier(3)
    rest = torch.ones_like(w, dtype=torch.bool); rest[64 // 3, 256 // 5] = False
    zeroed = {g: ((fake_quantize(w, "int4", g, 32) == 0) & (w != 0))[rest].float().mean().item() for g in ["tensor", "channel", "group"]}
    assert zeroed["tensor"] == 1.0 and zeroed["channel"] < 0.3 and zeroed["group"] < zeroed["channel"]
    s_t = quant_error(w[rest], fake_quantize(w, "int8", "tensor")[rest])["sqnr_db"]
    s_g = quant_error(w[rest], fake_quantize(w, "int8", "group", 32)[rest])["sqnr_db"]
    assert s_t < 15 and s_g > s_t + 20


@settings(max_examples=40, deadline=None)
@given(rows=st.integers(1, 9), cols=st.integers(1, 70), log_scale=st.floats(-6, 6), seed=st.integers(0, 2 ** 16))
def test_int8_per_channel_error_within_half_a_step(rows, cols, log_scale, seed):
    x = torch.randn(rows, cols, generator=torch.Generator().manual_seed(seed)) * 10 ** log_scale
    s = compute_scales(x, "int8", "channel")                                  # [rows, 1] = row amax / 127
    assert torch.allclose(s.flatten(), (x.abs().amax(1) / 127).clamp_min(0) + (x.abs().amax(1) == 0).float())
    err = (fake_quantize(x, "int8", "channel") - x).abs()
    assert (err <= s / 2 + x.abs() * 2 ** -22).all()                          # half a step, plus float32 rounding


def test_int8_tensor_and_channel_match_quantize_symmetric():
    x = torch.randn(48, 96, generator=torch.Generator().manual_seed(4))
    c, s = quantize_symmetric(x, "int8"); assert torch.equal(fake_quantize(x, "int8", "tensor"), dequantize_int(c, "int8", s))
    c, s = quantize_symmetric(x, "int8", dim=1); assert torch.equal(fake_quantize(x, "int8", "channel"), dequantize_int(c, "int8", s))


@pytest.mark.parametrize("fmt", BLOCK_FORMATS)
@pytest.mark.parametrize("shape", [(8, 64), (3, 5, 50), (96,)])
def test_block_matches_chapter_21_exactly(fmt, shape):
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(5)) * torch.logspace(-2, 2, shape[-1])
    out = fake_quantize(x, fmt, "block")
    assert out.shape == x.shape and out.dtype == torch.float32
    assert torch.equal(out, quantize_dequantize(x, fmt))


def test_granularities_are_reshapes():
    x = torch.randn(2, 6, 64, generator=torch.Generator().manual_seed(6))    # [batch, tokens, hidden]
    assert scale_groups(x, "tensor").shape == (1, 768) and scale_groups(x, "channel").shape == (2, 384)
    assert scale_groups(x, "token").shape == (12, 64) and scale_groups(x, "group", 16).shape == (48, 16)
    assert torch.equal(fake_quantize(x, "int4", "token"), fake_quantize(x.reshape(12, 64), "int4", "channel").reshape(x.shape))
    assert torch.equal(fake_quantize(x, "fp4_e2m1", "group", 16), fake_quantize(x.reshape(48, 16), "fp4_e2m1", "channel").reshape(x.shape))
    for g, n in [("tensor", 1), ("channel", 2), ("token", 12), ("group", 48)]:
        assert compute_scales(x, "int8", g, 16).shape == (n, 1) == (num_scales(x.shape, g, 16), 1)
    assert (fake_quantize(torch.zeros(4, 32), "int8", "group", 8) == 0).all()
    assert fake_quantize(x.to(torch.bfloat16), "int8", "token").dtype == torch.float32


@pytest.mark.parametrize("kw,field", [
    (dict(fmt="int3", granularity="tensor"), "fmt"),
    (dict(fmt="mxfp4", granularity="group"), "fmt"),            # a block format needs granularity="block"
    (dict(fmt="fp8_e4m3", granularity="block"), "fmt"),         # and "block" needs a block format
    (dict(fmt="int8", granularity="row"), "granularity"),
    (dict(fmt="int8", granularity="group", group_size=100), "group_size"),   # 256 % 100 != 0
    (dict(fmt="int8", granularity="group", group_size=0), "group_size"),
    (dict(fmt="int8", granularity="group", group_size=32.0), "group_size"),
    (dict(fmt="int8", granularity="tensor", group_size=-1), "group_size"),
])
def test_bad_arguments_name_the_field(kw, field):
    with pytest.raises(ValueError, match=field): fake_quantize(torch.randn(4, 256), **kw)


def test_one_dimensional_tensor_has_no_rows():
    with pytest.raises(ValueError, match="granularity"): fake_quantize(torch.randn(64), "int8", "token")
    assert fake_quantize(torch.randn(64), "int8", "group", 32).shape == (64,)


def test_quant_error():
    e = quant_error(torch.tensor([3.0, 4.0]), torch.tensor([3.0, 3.0]))
    assert e["rel_mse"] == pytest.approx(1 / 25) and e["sqnr_db"] == pytest.approx(10 * math.log10(25)) and e["max_abs"] == 1
    x = torch.randn(10); assert quant_error(x, x) == {"rel_mse": 0.0, "sqnr_db": math.inf, "max_abs": 0.0}
    with pytest.raises(ValueError, match="xq"): quant_error(x, x[:4])


def test_scale_overhead_and_storage_bits():
    shape = (4096, 256)
    assert scale_overhead_bits(shape, "tensor") == 16 / (4096 * 256)
    assert scale_overhead_bits(shape, "channel") == scale_overhead_bits(shape, "token") == 16 / 256
    assert scale_overhead_bits(shape, "group", 128) == 0.125 and scale_overhead_bits(shape, "group", 32) == 0.5
    assert scale_overhead_bits(shape, "block", 32, scale_bits=8) == 0.25 and scale_overhead_bits((2, 40), "block", 32, 8) == 2 * 2 * 8 / 80
    assert storage_bits("int4", "group", shape, 128) == 4.125 and storage_bits("fp8_e4m3", "channel", shape) == 8.0625
    for f in BLOCK_FORMATS: assert storage_bits(f, "block", shape) == bits_per_element(f, numel=4096 * 256)
    with pytest.raises(ValueError, match="granularity"): scale_overhead_bits(shape, "row")


def test_capture_inputs_on_the_shipped_model():
    from inferlab.model.model import load_model
    model = load_model(device="cpu")
    ids = torch.randint(0, model.config.vocab_size, (2, 12), generator=torch.Generator().manual_seed(7))
    acts = capture_inputs(model, ["lm_head", "model.layers.1.mlp.down_proj"], ids)
    assert acts["lm_head"].shape == (24, model.config.hidden_size)
    assert acts["model.layers.1.mlp.down_proj"].shape == (24, model.config.intermediate_size)
    with torch.no_grad(): logits = model(ids)                                 # [2, 12, vocab]
    assert torch.allclose(model.lm_head(acts["lm_head"]).reshape(logits.shape).float(), logits.float(), atol=1e-4)
    assert not any(m._forward_pre_hooks for m in model.modules())             # hooks removed
    with pytest.raises(ValueError, match="names"): capture_inputs(model, ["nope"], ids)
