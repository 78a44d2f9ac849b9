"Quantizing a model (chapter 23) and measuring it (chapter 25): packing, QuantLinear, recipes, SmoothQuant, GPTQ, KL."
import copy, math
import pytest, torch
import torch.nn as nn
from hypothesis import given, settings, strategies as st, HealthCheck
from inferlab.model.config import data_dir, shipped_model_path, ModelConfig
from inferlab.model.model import load_model
from inferlab.model.tokenizer import load_tokenizer
from inferlab.quant.quantize import (QuantRecipe, QuantLinear, quantize, weight_memory_bytes, pack_int4, unpack_int4,
                                     parse_weight_format, quantize_weight, dequantize_codes, scales_per_column,
                                     padded_in_features, quantize_activation, cpu_kernels, quant_targets, name_matches,
                                     smooth_model, gptq_quantize_weight, WEIGHT_FORMATS)
from inferlab.quant.quality import (kl_stats, kl_per_position, perplexity, eval_windows, logits_of, compare,
                                    quantized_bits_per_element, quant_decode_benchmark, BENCH_VARIANTS)

BASE, TOK = load_model(), load_tokenizer()
_corpus = data_dir() / "corpus"
EVAL = eval_windows(torch.tensor(TOK.encode((_corpus / "valid.txt").read_text(encoding="utf-8")[:20_000])), 512, max_rows=2)
CALIB = torch.tensor(TOK.encode((_corpus / "train.txt").read_text(encoding="utf-8")[:60_000])[: 12 * 512]).view(12, 512)
REF = logits_of(BASE, EVAL)

def kl(model) -> float: return kl_stats(REF, logits_of(model, EVAL))["mean_kl"]
def quantized(recipe, model=BASE): return quantize(copy.deepcopy(model), recipe, CALIB)

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

# ---- recipe and QuantLinear

@pytest.mark.parametrize("kw,field", [(dict(weights="int5"), "weights"), (dict(weights="int4"), "weights"),
                                      (dict(weights="int4-g7"), "weights"), (dict(activations="int4"), "activations"),
                                      (dict(kv_cache="fp4"), "kv_cache"), (dict(method="awq"), "method"),
                                      (dict(weights="int8", method="smoothquant"), "method"),
                                      (dict(weights="nvfp4", method="gptq"), "method"), (dict(skip=[3]), "skip"),
                                      (dict(smooth_alpha=-0.1), "smooth_alpha"), (dict(damp=0), "damp")])
def test_recipe_validation_names_the_field(kw, field):
    with pytest.raises(ValueError, match=field): QuantRecipe(**kw)

def test_quantize_needs_calibration_for_smoothquant_and_gptq():
    with pytest.raises(ValueError, match="calib_ids"): quantize(copy.deepcopy(BASE), QuantRecipe(weights="int4-g128", method="gptq"))
    with pytest.raises(ValueError, match="recipe"): quantize(copy.deepcopy(BASE), "int8")

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
    assert q._kernel_applies(x) and not q._kernel_applies(torch.randn(64, 704).bfloat16()) and not q._kernel_applies(x.float())
    ref = x.float() @ q.dequantize().t() + lin.bias
    assert torch.allclose(q(x).float(), ref, rtol=2e-2, atol=3e-2)
    QuantLinear.use_kernel = False
    try: assert torch.allclose(q(x).float(), ref, rtol=2e-2, atol=3e-2)
    finally: QuantLinear.use_kernel = True

def test_to_dtype_keeps_codes_and_scales():
    lin = nn.Linear(64, 32)
    for fmt in ["fp8", "int4-g32", "nvfp4"]:
        q = QuantLinear.from_linear(lin, fmt)
        before = {k: v.clone() for k, v in q.state_dict().items() if k != "bias"}
        qb = q.to(torch.bfloat16)
        assert qb.compute_dtype == torch.bfloat16 and qb.bias.dtype == torch.bfloat16 and qb.weight.dtype == torch.bfloat16
        for k, v in before.items(): assert qb.state_dict()[k].dtype == v.dtype and torch.equal(qb.state_dict()[k], v)

# ---- which layers

def test_skip_patterns_are_honoured():
    assert name_matches("model.layers.0.mlp.up_proj", "layers.0") and not name_matches("model.layers.10.mlp.up_proj", "layers.0")
    assert name_matches("model.layers.3.self_attn.q_proj", "layers.*.self_attn") and not name_matches("model.layers.3.mlp.gate_proj", "gate")
    m = quantize(copy.deepcopy(BASE), QuantRecipe(weights="int8", skip=["lm_head", "layers.0", "down_proj"]))
    for name, mod in m.named_modules():
        if isinstance(mod, (nn.Linear, QuantLinear)):
            kept = name == "lm_head" or ".layers.0." in name or name.endswith("down_proj")
            assert isinstance(mod, nn.Linear) == kept, name
    assert m.quant_recipe.skip == ["lm_head", "layers.0", "down_proj"]

def test_moe_routers_stay_in_full_precision():
    moe = load_model(shipped_model_path("tiny-moe"))
    m = quantize(copy.deepcopy(moe), QuantRecipe(weights="int4-g32"))
    gates = [mod for n, mod in m.named_modules() if n.endswith("mlp.gate")]
    assert gates and all(type(g) is nn.Linear for g in gates)
    assert sum(isinstance(mod, QuantLinear) for mod in m.modules()) == len(quant_targets(moe))
    ids = EVAL[:1, :64]
    assert kl_stats(logits_of(moe, ids), logits_of(m, ids))["mean_kl"] < 0.1

def test_weight_memory_counts_codes_and_scales():
    m8 = quantize(copy.deepcopy(BASE), QuantRecipe(weights="int8"))
    lins = [mod for mod in BASE.modules() if isinstance(mod, nn.Linear)]
    other = weight_memory_bytes(BASE) - sum(l.weight.numel() * 4 for l in lins)
    assert weight_memory_bytes(m8) == other + sum(l.weight.numel() + l.out_features * 2 for l in lins)   # int8 + fp16 scales
    m4 = quantize(copy.deepcopy(BASE), QuantRecipe(weights="int4-g128"))
    assert 4.125 <= quantized_bits_per_element(m4) < 4.3 and weight_memory_bytes(m4) < weight_memory_bytes(m8)
    cfg = ModelConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2, vocab_size=256, tie_word_embeddings=True)
    with torch.device("meta"):
        from inferlab.model.model import CausalLM
        meta = CausalLM(cfg)
    assert weight_memory_bytes(quantize(copy.deepcopy(meta), QuantRecipe(weights="int4-g32"))) < weight_memory_bytes(meta)

# ---- quality metrics

def test_kl_of_the_model_against_itself_is_zero():
    assert kl_stats(REF, logits_of(copy.deepcopy(BASE), EVAL)) == dict(mean_kl=0.0, p99_kl=0.0, max_kl=0.0, top1_agreement=1.0)
    r = compare(BASE, EVAL, REF)
    assert r["ppl_ratio"] == 1 and r["ppl"] == pytest.approx(perplexity(BASE, EVAL), rel=1e-5)

def test_kl_by_hand_and_perplexity_of_uniform():
    p, q = torch.tensor([0.5, 0.5]).log(), torch.tensor([0.9, 0.1]).log()
    assert float(kl_per_position(p, q)) == pytest.approx(0.5 * math.log(0.5 / 0.9) + 0.5 * math.log(5), rel=1e-6)
    kl_ = kl_per_position(torch.randn(50, 30), torch.randn(50, 30))
    assert (kl_ >= 0).all() and kl_stats(torch.zeros(1, 3), torch.zeros(1, 3))["mean_kl"] == 0
    class Uniform(nn.Module):
        def __init__(self): super().__init__(); self.model = nn.Module(); self.model.embed_tokens = nn.Embedding(1, 1)
        def forward(self, ids): return torch.zeros(*ids.shape, 100)
    assert perplexity(Uniform(), torch.randint(0, 100, (1000,)), seq_len=100) == pytest.approx(100, rel=1e-5)

# ---- the algorithms, on the shipped model

def test_smoothquant_preserves_the_function_before_quantization():
    m = copy.deepcopy(BASE)
    scales = smooth_model(m, CALIB[:4])
    assert len(scales) == 4 * BASE.config.num_hidden_layers and all((s > 0).all() for s in scales.values())
    assert any((s - 1).abs().max() > 0.1 for s in scales.values())              # it did move something
    assert torch.allclose(logits_of(m, EVAL[:1]), REF[:1], atol=2e-3)
    lin = nn.Linear(16, 8); x = torch.randn(5, 16); s = torch.rand(16) + 0.5   # x·Wᵀ = (x/s)·(s·W)ᵀ
    assert torch.allclose(x @ lin.weight.t(), (x / s) @ (lin.weight * s).t(), atol=1e-5)

def test_smoothquant_beats_rtn_for_w8a8():
    for act in ["int8", "int8-tensor"]:
        rtn = kl(quantized(QuantRecipe(weights="int8", activations=act)))
        sq = kl(quantized(QuantRecipe(weights="int8", activations=act, method="smoothquant")))
        print(f"\nW8A8 ({act} activations), tiny-dense mean KL: RTN {rtn:.5f}, SmoothQuant {sq:.5f}")
        assert sq < rtn, (act, sq, rtn)

def test_gptq_with_identity_hessian_is_rtn_and_beats_rtn_on_kl():
    w = BASE.model.layers[1].self_attn.o_proj.weight
    spec = parse_weight_format("int4-g64")
    c_rtn, s_rtn = quantize_weight(w, spec)
    c, s = gptq_quantize_weight(w, torch.eye(w.shape[1]), spec, damp=1e-6)     # no correlations: nothing to compensate
    assert torch.equal(s, s_rtn) and (c != c_rtn).float().mean() < 1e-3
    rtn = kl(quantized(QuantRecipe(weights="int4-g128")))
    gptq = kl(quantized(QuantRecipe(weights="int4-g128", method="gptq")))
    print(f"\nW4A16 int4-g128, tiny-dense mean KL: RTN {rtn:.5f}, GPTQ {gptq:.5f}")
    assert gptq < 0.75 * rtn, (gptq, rtn)

def test_decode_benchmark_reports_every_variant():
    cfg = ModelConfig(hidden_size=128, intermediate_size=256, num_hidden_layers=1, num_attention_heads=2, head_dim=64,
                      vocab_size=512, tie_word_embeddings=True)
    rows = quant_decode_benchmark(cfg, steps=2, rounds=1, verbose=False)
    assert [r["name"] for r in rows] == [v[0] for v in BENCH_VARIANTS]
    assert rows[0]["speedup"] == 1 and rows[0]["mem_ratio"] == 1 and all(r["tok_s"] > 0 for r in rows)
    assert rows[3]["weight_bytes"] < rows[2]["weight_bytes"] < rows[0]["weight_bytes"]
