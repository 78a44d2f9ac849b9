"The model is fused from construction; the loader fills each fused parameter shard by shard (nano-vllm's hook)."
import pytest
import torch
from safetensors.torch import load_file
from inferlab.model.config import ModelConfig
from inferlab.model.layers import MergedLinear
from inferlab.model.model import load_model, save_model, checkpoint_tensors, packed_target, PACKED_MODULES
from inferlab.model.random_weights import random_model

CFGS = {"qwen2 (q/k/v bias)": dict(architecture="Qwen2ForCausalLM", attention_bias=True),
        "mixtral (experts)": dict(architecture="MixtralForCausalLM", num_experts=4, num_experts_per_tok=2, moe_intermediate_size=24)}


@pytest.mark.parametrize("extra", CFGS.values(), ids=CFGS.keys())
def test_round_trip_through_separate_checkpoint_tensors(tmp_path, extra):
    cfg = ModelConfig(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, **extra)
    m = random_model(cfg, seed=1)
    save_model(m, tmp_path)
    stored = load_file(str(tmp_path / "model.safetensors"))
    assert not any("qkv_proj" in k or "gate_up_proj" in k for k in stored)     # the checkpoint holds them apart
    back = load_model(tmp_path, dtype=torch.float32)
    for name, t in checkpoint_tensors(back).items():                         # every shard landed in its rows
        assert torch.equal(t, checkpoint_tensors(m)[name]), name
    x = torch.randint(0, 64, (1, 9))
    assert torch.equal(back(x), m(x))


def test_packed_targets_cover_every_fused_module_and_fail_loudly():
    assert {t for t, _ in PACKED_MODULES.values()} == {"qkv_proj", "gate_up_proj"}
    assert packed_target("model.layers.1.self_attn.v_proj.bias") == ("model.layers.1.self_attn.qkv_proj.bias", 2)
    lin = MergedLinear(8, [4, 2, 2])
    with pytest.raises(ValueError, match="shard 2"): lin.weight_loader(lin.weight, torch.zeros(3, 8), 2)
