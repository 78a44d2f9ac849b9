"Medusa heads (chapter 33): shapes, zero-init identity, save/load and its errors, the proposer."
import json
import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file
from inferlab.model.config import ModelConfig
from inferlab.model.sampling import SamplingParams
from inferlab.engine.sequence import Sequence
from inferlab.model.random_weights import random_model
from inferlab.spec_decode.medusa import (MedusaHeads, MedusaProposer, save_medusa, load_medusa, default_medusa_path,
                                  train_medusa, head_hits, chain_acceptance, tokens_per_pass, lm_head_fingerprint)

CFG = ModelConfig(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                  num_attention_heads=2, num_key_value_heads=1)
K = 3

@pytest.fixture(scope="module")
def target(): return random_model(CFG, seed=0)

def random_heads(target, k=K, seed=0):
    heads = MedusaHeads.for_target(target, k)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        heads.weight.copy_(torch.randn(heads.weight.shape, generator=g) * 0.3)
        heads.bias.copy_(torch.randn(heads.bias.shape, generator=g) * 0.3)
    return heads.eval().requires_grad_(False)

def test_shapes_and_bad_input(target):
    heads = random_heads(target)
    assert heads(torch.randn(5, 32)).shape == (K, 5, 96)
    with pytest.raises(ValueError, match="^h:"): heads(torch.randn(5, 16))
    with pytest.raises(ValueError, match="^num_heads:"): MedusaHeads(0, target.lm_head.weight)
    assert set(heads.state_dict()) == {"weight", "bias"}                         # no lm_head in the heads' own state

def test_zero_init_is_the_target_head(target):
    ids = torch.randint(0, 96, (1, 12), generator=torch.Generator().manual_seed(1))
    h = target.hidden_states(ids)[0]                                              # [12, 32]
    logits = MedusaHeads.for_target(target, K)(h)
    ref = target(ids)[0]
    assert all(torch.allclose(logits[i], ref, atol=1e-5, rtol=0) for i in range(K))

def test_round_trip(tmp_path, target):
    heads = random_heads(target)
    out = save_medusa(heads, tmp_path / "m-medusa", target, training={"steps": 1})
    conf = json.loads((out / "config.json").read_text())
    assert conf["method"] == "medusa" and conf["num_heads"] == K and conf["hidden_size"] == 32 and conf["vocab_size"] == 96
    assert conf["base_fingerprint"] == lm_head_fingerprint(target) and conf["training"] == {"steps": 1}
    with safe_open(str(out / "model.safetensors"), "pt") as f: names = set(f.keys())
    assert names == {f"blocks.{i}.layers.0.{p}" for i in range(K) for p in ("weight", "bias")}
    back = load_medusa(out, target)
    h = torch.randn(4, 32)
    assert torch.equal(back(h), heads(h))
    assert back.lm_head_weight.data_ptr() == target.lm_head.weight.data_ptr()
    assert lm_head_fingerprint(random_model(CFG, seed=0).to(torch.bfloat16)) == lm_head_fingerprint(target)   # any dtype of one model

def _rewrite(out, **change):
    conf = json.loads((out / "config.json").read_text()); conf.update(change)
    (out / "config.json").write_text(json.dumps({k: v for k, v in conf.items() if v is not None}))

@pytest.mark.parametrize("change,field", [(dict(method=None), "method"), (dict(method="eagle"), "method"),
                                          (dict(num_heads=None), "num_heads"), (dict(num_heads="3"), "num_heads"),
                                          (dict(hidden_size=64), "hidden_size"), (dict(vocab_size=4096), "vocab_size"),
                                          (dict(base_fingerprint=None), "base_fingerprint"),
                                          (dict(base_fingerprint="0" * 16), "base_fingerprint")])
def test_load_errors_name_the_field(tmp_path, target, change, field):
    out = save_medusa(random_heads(target), tmp_path / "m", target)
    _rewrite(out, **change)
    with pytest.raises(ValueError) as e: load_medusa(out, target)
    assert str(e.value).startswith(field + ":") and str(out / "config.json") in str(e.value)

def test_size_and_model_mismatch(tmp_path, target):
    out = save_medusa(random_heads(target), tmp_path / "m", target)
    wide = random_model(ModelConfig(**{**CFG.__dict__, "hidden_size": 64, "head_dim": None, "intermediate_size": 64}))
    with pytest.raises(ValueError, match=r"^hidden_size: the heads in .*config.json were trained for 32, the target has 64"):
        load_medusa(out, wide)
    with pytest.raises(ValueError, match=r"^base_fingerprint: .*trained for another model \(base_model unknown\)"):
        load_medusa(out, random_model(CFG, seed=1))

def test_tensor_errors(tmp_path, target):
    out = save_medusa(random_heads(target), tmp_path / "m", target)
    wfile = out / "model.safetensors"
    with safe_open(str(wfile), "pt") as f: tensors = {n: f.get_tensor(n) for n in f.keys()}
    save_file({n: t for n, t in tensors.items() if n != "blocks.2.layers.0.bias"}, str(wfile))
    with pytest.raises(ValueError, match=r"^blocks\.2\.layers\.0\.bias: missing from .*model.safetensors"): load_medusa(out, target)
    save_file({**tensors, "lm_head.weight": torch.zeros(96, 32)}, str(wfile))
    with pytest.raises(ValueError, match=r"^lm_head\.weight: unexpected tensor"): load_medusa(out, target)
    save_file({**tensors, "blocks.0.layers.0.weight": torch.zeros(32, 16)}, str(wfile))
    with pytest.raises(ValueError, match=r"^blocks\.0\.layers\.0\.weight: shape \[32, 16\]"): load_medusa(out, target)
    (out / "config.json").unlink()
    with pytest.raises(FileNotFoundError, match="config.json"): load_medusa(out, target)

def test_default_path(tmp_path):
    (tmp_path / "m").mkdir(); (tmp_path / "m-medusa").mkdir()
    assert default_medusa_path(tmp_path / "m") == tmp_path / "m-medusa"
    assert default_medusa_path(tmp_path / "other") is None and default_medusa_path(None) is None

def test_proposer(target):
    heads = random_heads(target)
    prop = MedusaProposer(heads)
    assert prop.method == "medusa" and prop.uses_hidden
    h = torch.randn(3, 32)
    seqs = [Sequence([1, 2, 3], SamplingParams(temperature=0)), Sequence([4, 5], SamplingParams(temperature=0.9, top_k=20, seed=3)),
            Sequence([6], SamplingParams(temperature=0)), Sequence([7], SamplingParams(temperature=1.0, seed=4))]
    drafts = prop.propose(seqs, [2, 5, 1, 3], [h[0], h[1], None, h[2]])
    assert drafts[0].tokens == heads(h[:1])[:2, 0].argmax(-1).tolist() and drafts[0].probs is None
    assert len(drafts[1].tokens) == K and drafts[1].probs.shape == (K, 96)        # at most K, however many asked
    assert drafts[2].tokens == [] and len(drafts[3].tokens) == 3
    for d in (drafts[1], drafts[3]):
        assert d.probs.dtype == torch.float32 and torch.allclose(d.probs.sum(-1), torch.ones(len(d.tokens)))
        assert all(d.probs[j, t] > 0 for j, t in enumerate(d.tokens))
    assert int((drafts[1].probs > 0).sum(-1).max()) <= 20                        # the request's top-k applied
    again = prop.propose([Sequence([4, 5], SamplingParams(temperature=0.9, top_k=20, seed=3))], [5], [h[1]])[0]
    assert again.tokens == drafts[1].tokens and torch.allclose(again.probs, drafts[1].probs, atol=1e-6)   # seeded: repeats
    assert [d.tokens for d in prop.propose(seqs[:2], [1, 1])] == [[], []]          # no hidden states: no drafts
    with pytest.raises(ValueError, match="^num_tokens:"): prop.propose(seqs, [1], [h[0]] * 4)

def test_training_learns_and_target_stays_frozen():
    toy = random_model(ModelConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                   num_attention_heads=2, num_key_value_heads=1), seed=0)
    before = {n: p.clone() for n, p in toy.state_dict().items()}
    heads, log = train_medusa(toy, torch.arange(7).repeat(400), num_heads=3, steps=80, seq_len=32, pool_windows=16,
                              batch_positions=128, lr=3e-2, progress=False)
    assert log["loss"][-1] < log["loss"][0] / 4 and len(log["head_loss"][0]) == 3 and log["pool_positions"] == 16 * 32
    assert all(torch.equal(before[n], p) for n, p in toy.state_dict().items())
    hits = head_hits(toy, heads, torch.arange(7).repeat(60), seq_len=32)
    assert hits.shape == (4, (420 - 4) // 32, 32) and hits[1:].float().mean() > 0.9
    chain = chain_acceptance(hits)
    assert chain.shape == (3,) and len(tokens_per_pass(chain)) == 4
    with pytest.raises(ValueError, match="^target:"): train_medusa(toy.to(torch.bfloat16), torch.arange(7).repeat(400), steps=1)

def test_shipped_heads():
    from inferlab.model.config import shipped_model_path
    from inferlab.model.model import load_model
    path = default_medusa_path(shipped_model_path("tiny-dense"))
    assert path is not None and path.name == "tiny-dense-medusa"
    for dtype in (torch.float32, torch.bfloat16):                                  # the fingerprint is dtype-blind
        heads = load_medusa(path, load_model(shipped_model_path("tiny-dense"), dtype=dtype))
        assert heads.num_heads == 4 and heads.weight.dtype == dtype
    with pytest.raises(ValueError, match=r"^hidden_size: .* trained for 256, the target has 128"):
        load_medusa(path, load_model(shipped_model_path("tiny-draft")))
