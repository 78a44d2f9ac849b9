"""Parity with Hugging Face `transformers`, the ground truth for the model layer.

For each of the six architectures a random-weight tiny config is built with `transformers` (no download), saved with
`save_pretrained`, and loaded by inferlab: float32 logits must agree to 1e-4 and 32-token greedy continuations must be
identical. The configs cover GQA ratios above 1, tied and untied embeddings, Llama-3 RoPE scaling, sliding windows,
Qwen2 attention bias, Qwen3 q/k-norm with an explicit head_dim, and MoE with and without top-k renormalisation."""
import pytest, torch
import transformers as tf
from inferlab.model.model import load_model
from inferlab.model.generate import generate_one
from inferlab.model.sampling import SamplingParams

COMMON = dict(vocab_size=160, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
              max_position_embeddings=256, initializer_range=0.1)
CASES = {
    "llama-gqa2-untied-llama3rope": (tf.LlamaConfig, tf.LlamaForCausalLM, dict(num_key_value_heads=2, tie_word_embeddings=False,
        rope_scaling=dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0, original_max_position_embeddings=16))),
    "mistral-gqa4-tied-window8": (tf.MistralConfig, tf.MistralForCausalLM, dict(num_key_value_heads=1, tie_word_embeddings=True, sliding_window=8)),
    "qwen2-bias-window-upper-layer": (tf.Qwen2Config, tf.Qwen2ForCausalLM, dict(num_key_value_heads=2, tie_word_embeddings=True,
        use_sliding_window=True, sliding_window=8, max_window_layers=1)),
    "qwen3-qknorm-headdim32": (tf.Qwen3Config, tf.Qwen3ForCausalLM, dict(num_key_value_heads=2, head_dim=32, tie_word_embeddings=False)),
    "mixtral-4experts-top2": (tf.MixtralConfig, tf.MixtralForCausalLM, dict(num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2)),
    "qwen3moe-no-renorm-dense-layer": (tf.Qwen3MoeConfig, tf.Qwen3MoeForCausalLM, dict(num_key_value_heads=2, num_experts=4,
        num_experts_per_tok=2, moe_intermediate_size=32, norm_topk_prob=False, mlp_only_layers=[1])),
}

@pytest.fixture(scope="module", params=list(CASES))
def pair(request, tmp_path_factory):
    cfg_cls, model_cls, kw = CASES[request.param]
    torch.manual_seed(0)
    hf = model_cls(cfg_cls(**COMMON, **kw)).eval()
    path = tmp_path_factory.mktemp(request.param)
    hf.save_pretrained(path)
    return request.param, hf, load_model(path, dtype="float32", device="cpu")

def test_logits_match(pair):
    name, hf, ours = pair
    ids = torch.randint(0, 160, (2, 40), generator=torch.Generator().manual_seed(1))
    with torch.no_grad(): diff = (hf(ids).logits - ours(ids)).abs().max().item()
    print(f"{name}: max |logit difference| = {diff:.2e}")
    assert diff < 1e-4

def test_greedy_32_tokens_match(pair):
    name, hf, ours = pair
    prompt = torch.randint(0, 160, (1, 12), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        ref = hf.generate(prompt, max_new_tokens=32, min_new_tokens=32, do_sample=False, pad_token_id=0)[0, 12:].tolist()
    out = generate_one(ours, None, prompt[0].tolist(), SamplingParams(temperature=0, max_tokens=32, ignore_eos=True))
    assert out.token_ids == ref and len(ref) == 32

def test_cases_cover_the_features():
    "The case list itself: every architecture and the features the issue names are present."
    from inferlab.model.config import SUPPORTED_ARCHITECTURES
    archs = {m.__name__ for _, m, _ in CASES.values()}
    assert archs == set(SUPPORTED_ARCHITECTURES)
    kws = [kw for _, _, kw in CASES.values()]
    assert any(kw.get("tie_word_embeddings") for kw in kws) and any(kw.get("tie_word_embeddings") is False for kw in kws)
    assert any(COMMON["num_attention_heads"] // kw.get("num_key_value_heads", 4) > 1 for kw in kws)
    assert any((kw.get("rope_scaling") or {}).get("rope_type") == "llama3" for kw in kws)
