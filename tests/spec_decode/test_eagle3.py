"""EAGLE-3 (chapter 35): training-time test computes what inference runs, the proposer's drafts are the drafter's,
its state follows the engine's requests, and a drafter for another model is refused with the field at fault."""
import dataclasses, json, shutil
import pytest
import torch
from inferlab.model.config import ModelConfig
from inferlab.model.random_weights import random_model
from inferlab.model.sampling import SamplingParams
from inferlab.engine.sequence import Sequence
from inferlab.spec_decode.eagle3 import (Eagle3Drafter, Eagle3Proposer, ttt_forward, target_features, save_eagle3,
                                         load_eagle3, default_aux_layers, check_aux_layers, chain_hits,
                                         chain_acceptance, default_eagle3_path)

CFG = ModelConfig(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=4, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=8, max_position_embeddings=128)

@pytest.fixture(scope="module")
def toy():
    m = random_model(CFG, seed=0)
    with torch.no_grad(): m.lm_head.weight.mul_(10)                   # sharp choices: drafts are not all one token
    return m

@pytest.fixture(scope="module")
def drafter(toy):
    d = Eagle3Drafter.for_target(toy, (0, 2, 3))
    with torch.no_grad():
        g = torch.Generator().manual_seed(1)
        for p in d.parameters(): p.copy_(torch.randn(p.shape, generator=g) * 0.2 + (1 if p.dim() == 1 else 0))
    return d.eval().requires_grad_(False)

@torch.no_grad()
@pytest.mark.parametrize("c,j", [(0, 1), (5, 3), (17, 2), (20, 0)])
def test_ttt_output_is_the_inference_chain(toy, drafter, c, j):
    "Output j at position c + j of the unrolled pass equals the chain run the inference way from context c."
    ids = torch.randint(0, CFG.vocab_size, (1, 30), generator=torch.Generator().manual_seed(c))
    feats, _ = target_features(toy, ids, drafter.aux_layers)
    outs = ttt_forward(drafter, feats, ids[:, 1:], 4)
    o, K, V = drafter.layer(drafter.embed(ids[:, 1:c + 2]), drafter.fc(feats[:, :c + 1]), torch.arange(c + 1))
    last = o[:, -1:]
    for i in range(1, j + 1):
        last, k, v = drafter.layer(drafter.embed(ids[:, c + 1 + i:c + 2 + i]), last, torch.tensor([c + i]), K, V)
        K, V = torch.cat([K, k], 1), torch.cat([V, v], 1)
    assert torch.allclose(last[0, 0], outs[j][0, c + j], atol=1e-5)
    assert j == 0 or not torch.allclose(last[0, 0], outs[0][0, c + j], atol=1e-3)   # the chain is not step 0

@torch.no_grad()
def test_proposer_drafts_the_chain_and_resets_on_a_gap(toy, drafter):
    ids = torch.randint(0, CFG.vocab_size, (1, 24), generator=torch.Generator().manual_seed(7))
    feats, _ = target_features(toy, ids, drafter.aux_layers)
    c, prop = 12, Eagle3Proposer(drafter)
    seq = Sequence(ids[0, :c + 2].tolist(), SamplingParams(temperature=0, max_tokens=8))
    prop.observe([seq], [0], [feats[0, :5]]); prop.observe([seq], [5], [feats[0, 5:c + 1]])   # two chunks
    d = prop.propose([seq], [3])[0].tokens
    toks = ids.clone(); toks[0, c + 2:c + 4] = torch.tensor(d[:2])          # the chain's own tokens, teacher-forced
    outs = ttt_forward(drafter, feats, toks[:, 1:], 3)
    assert d == [int(drafter.logits(outs[j][0, c + j]).argmax()) for j in range(3)]
    assert len(set(d)) > 1 or len(set(ids[0].tolist())) == 1
    prop.observe([seq], [c + 3], [feats[0, :2]])                            # a gap (position c+1, c+2 missing)
    assert prop.state[seq.seq_id]["end"] == c + 5 and prop.state[seq.seq_id]["k"] is None
    prop.release(seq); prop.check()
    assert prop.propose([seq], [2])[0].tokens == []                          # no features: no drafts

@torch.no_grad()
def test_chain_hits_replay_the_proposer():
    """Scored offline by teacher forcing, the shipped drafter's chain from each context end of the target's greedy
    text is accepted exactly as deep as the proposer's drafts from that context match the text."""
    from inferlab.model.config import shipped_model_path
    from inferlab.model.model import load_model
    src = shipped_model_path("tiny-dense")
    target = load_model(src, dtype=torch.float32)
    drafter = load_eagle3(default_eagle3_path(src), target)
    text = [1, 2, 3] + list(range(40, 60))                                  # a prompt, then greedy continuation
    while len(text) < 64: text.append(int(target(torch.tensor([text]))[0, -1].argmax()))
    hits = chain_hits(drafter, target, text, k=4)                           # [4, 59]
    feats, _ = target_features(target, torch.tensor([text]), drafter.aux_layers)
    for c in range(22, 59, 3):                                               # context ends in the continuation
        prop, seq = Eagle3Proposer(drafter), Sequence(text[:c + 2], SamplingParams(temperature=0, max_tokens=8))
        prop.observe([seq], [0], [feats[0, :c + 1]])
        d = prop.propose([seq], [4])[0].tokens
        matched = torch.tensor([t == u for t, u in zip(d, text[c + 2:])]).int()     # the drafts against the text
        assert hits[:, c].tolist() == matched.cumprod(0).tolist()
    assert hits.shape == (4, 59) and hits[0, 22:].float().mean() > 0.3 and (hits[1:] <= hits[:-1]).all()
    assert torch.equal(chain_acceptance(drafter, target, [text], 4, skip=22), hits[:, 22:].float().mean(1))

def test_default_layers_and_bad_ids():
    assert default_aux_layers(32) == (2, 16, 29) and default_aux_layers(6) == (1, 3, 5)
    for bad in ([1, 1, 2], [3, 1, 2], [0, 2, 4], [], [0, 1.5], "012"):
        with pytest.raises(ValueError, match="aux_layers"): check_aux_layers(bad, 4)
    with pytest.raises(ValueError, match="num_layers"): default_aux_layers(2)

def test_load_refuses_another_model(toy, drafter, tmp_path):
    save_eagle3(drafter, tmp_path / "d", toy, base_model="toy")
    assert torch.equal(load_eagle3(tmp_path / "d", toy).fc.weight, drafter.fc.weight)
    other = random_model(dataclasses.replace(CFG, hidden_size=48), seed=0)
    with pytest.raises(ValueError, match="hidden_size: the drafter .* has 32, the target 48"):
        load_eagle3(tmp_path / "d", other)
    with pytest.raises(ValueError, match="vocab_size"):
        load_eagle3(tmp_path / "d", random_model(dataclasses.replace(CFG, vocab_size=100), seed=0))
    with pytest.raises(ValueError, match="base_fingerprint"): load_eagle3(tmp_path / "d", random_model(CFG, seed=5))
    conf = json.loads((tmp_path / "d" / "config.json").read_text())
    for field, value, msg in [("eagle_config", {"eagle_aux_hidden_state_layer_ids": [0, 2, 4]}, r"in \[0, 4\)"),
                              ("method", "medusa", "method"), ("draft_vocab_size", 32, "draft_vocab_size")]:
        shutil.copytree(tmp_path / "d", tmp_path / field)
        (tmp_path / field / "config.json").write_text(json.dumps({**conf, field: value}))
        with pytest.raises(ValueError, match=msg): load_eagle3(tmp_path / field, toy)
    (tmp_path / "d" / "model.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match="model.safetensors"): load_eagle3(tmp_path / "d", toy)

GREEDY = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)

@pytest.mark.parametrize("quant,kv", [("w4a16", "fp8"), ("fp8", None)])
def test_composes_with_quantization_and_kv_dtype(quant, kv):
    "The shipped drafter on a quantized target with a quantized KV cache: the plain engine's tokens, drafts accepted."
    from inferlab.llm import LLM
    from inferlab.model.config import data_dir
    from inferlab.spec_decode.spec_decoder import add_speculation
    text = (data_dir() / "corpus" / "valid.txt").read_text()
    prompts = [text[i * 997:i * 997 + 40 + (i * 53) % 160] for i in range(8)]
    # no prefix cache: the second pass would attend to the first's cached 8-bit KV where the first attended to its own
    # fresh K/V (tests/engine compares the cache on its own), which is not what this test compares
    with LLM("tiny-dense", dtype="float32", quantization=quant, kv_cache_dtype=kv, max_num_seqs=4,
             enable_prefix_caching=False) as llm:
        want = [o.token_ids for o in llm.generate(prompts, GREEDY)]
        add_speculation(llm.engine, {"method": "eagle3", "num_speculative_tokens": 4})
        got = [o.token_ids for o in llm.generate(prompts, GREEDY)]
        s = llm.engine.stats()
    assert got == want and s["mean_accepted_length"] > 1.5

def test_refused_with_tensor_parallelism():
    from inferlab.llm import LLM
    with pytest.raises(ValueError, match="method 'eagle3' with tensor_parallel_size=2"):
        LLM("tiny-dense", tensor_parallel_size=2, speculative_config={"method": "eagle3"})
