"Quantizing a model (chapter 23) and measuring it (chapter 25): recipes, which layers, SmoothQuant, GPTQ, KL."
import copy, math
import pytest, torch
import torch.nn as nn
from inferlab.model.config import data_dir, shipped_model_path, ModelConfig
from inferlab.model.model import load_model
from inferlab.model.tokenizer import load_tokenizer
from inferlab.engine.llm_engine import EngineConfig
from inferlab.engine.paged_attention import KV_CACHE_DTYPES
from inferlab.quant.linear import QuantLinear, parse_weight_format, quantize_weight
from inferlab.quant.quantize import (QuantRecipe, quantize, weight_memory_bytes, quant_targets, name_matches,
                                     smooth_model, gptq_quantize_weight)
from inferlab.quant.quality import (kl_stats, kl_per_position, perplexity, eval_windows, logits_of, compare,
                                    quantized_bits_per_element, quant_decode_benchmark, BENCH_VARIANTS)

BASE, TOK = load_model(), load_tokenizer()
_corpus = data_dir() / "corpus"
EVAL = eval_windows(torch.tensor(TOK.encode((_corpus / "valid.txt").read_text(encoding="utf-8")[:20_000])), 512, max_rows=2)
CALIB = torch.tensor(TOK.encode((_corpus / "train.txt").read_text(encoding="utf-8")[:60_000])[: 12 * 512]).view(12, 512)
REF = logits_of(BASE, EVAL)

def kl(model) -> float: return kl_stats(REF, logits_of(model, EVAL))["mean_kl"]
def quantized(recipe, model=BASE): return quantize(copy.deepcopy(model), recipe, CALIB)

# ---- the recipe

@pytest.mark.parametrize("kw,field", [(dict(weights="int5"), "weights"), (dict(weights="int4"), "weights"),
                                      (dict(weights="int4-g7"), "weights"), (dict(activations="int4"), "activations"),
                                      (dict(kv_cache="fp4"), "kv_cache"), (dict(kv_cache="fp8_e5m2"), "kv_cache"),
                                      (dict(kv_cache="fp8_e4m3"), "kv_cache"), (dict(method="awq"), "method"),
                                      (dict(weights="int8", method="smoothquant"), "method"),
                                      (dict(weights="nvfp4", method="gptq"), "method"), (dict(skip=[3]), "skip"),
                                      (dict(smooth_alpha=-0.1), "smooth_alpha"), (dict(damp=0), "damp")])
def test_recipe_validation_names_the_field(kw, field):
    with pytest.raises(ValueError, match=field): QuantRecipe(**kw)

def test_recipe_kv_cache_names_are_the_engines():
    "One table of KV formats: every name a recipe accepts, the engine accepts, and the other way round."
    for name in KV_CACHE_DTYPES:
        assert EngineConfig(kv_cache_dtype=QuantRecipe(kv_cache=name).kv_cache).kv_cache_dtype == name
    with pytest.raises(ValueError, match="kv_cache") as e: QuantRecipe(kv_cache="fp8_e5m2")
    assert "fp8, int8" in str(e.value)

def test_quantize_needs_calibration_for_smoothquant_and_gptq():
    with pytest.raises(ValueError, match="calib_ids"): quantize(copy.deepcopy(BASE), QuantRecipe(weights="int4-g128", method="gptq"))
    with pytest.raises(ValueError, match="recipe"): quantize(copy.deepcopy(BASE), "int8")

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
