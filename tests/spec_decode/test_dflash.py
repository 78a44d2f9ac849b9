"""The parallel drafter (chapter 36): its block's training pass is what inference runs, the proposer's one pass
drafts what the block forward gives, and a drafter file for another block size or method is refused."""
import json, shutil
import pytest
import torch
from inferlab.model.config import ModelConfig
from inferlab.model.random_weights import random_model
from inferlab.model.sampling import SamplingParams
from inferlab.engine.sequence import Sequence
from inferlab.spec_decode.eagle3 import target_features
from inferlab.spec_decode.dflash import (DFlashDrafter, DFlashProposer, block_forward, block_mask, save_dflash,
                                         load_dflash)

CFG = ModelConfig(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=4, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=8, max_position_embeddings=128)

@pytest.fixture(scope="module")
def toy():
    m = random_model(CFG, seed=0)
    with torch.no_grad(): m.lm_head.weight.mul_(10)
    return m

@pytest.fixture(scope="module")
def drafter(toy):
    d = DFlashDrafter.for_target(toy, (0, 2, 3), block_size=4)
    with torch.no_grad():
        g = torch.Generator().manual_seed(1)
        for p in d.parameters(): p.copy_(torch.randn(p.shape, generator=g) * 0.2 + (1 if p.dim() == 1 else 0))
    return d.eval().requires_grad_(False)

def test_block_mask_shape_and_rows():
    m = block_mask(5, 3)
    assert m.shape == (15, 15) and m[:5, :5].equal(torch.ones(5, 5, dtype=torch.bool).tril()) and not m[:5, 5:].any()
    assert m[5 + 2 * 2].nonzero().flatten().tolist() == [0, 1, 2, 9, 10]       # c = 2: context 0..2, its block

@torch.no_grad()
@pytest.mark.parametrize("c", [0, 7, 20])
def test_proposer_drafts_the_block_forward(toy, drafter, c):
    ids = torch.randint(0, CFG.vocab_size, (1, 30), generator=torch.Generator().manual_seed(c))
    feats, _ = target_features(toy, ids, drafter.aux_layers)
    ctx, blk = block_forward(drafter, feats, ids[:, 1:])
    want = [int(drafter.logits(ctx[0, c]).argmax())] + [int(drafter.logits(blk[0, c, i]).argmax()) for i in range(3)]
    prop = DFlashProposer(drafter)
    seq = Sequence(ids[0, :c + 2].tolist(), SamplingParams(temperature=0, max_tokens=8))
    half = (c + 1) // 2
    prop.observe([seq], [0], [feats[0, :half]])
    if half: assert prop.propose([seq], [2])[0].tokens[:1]                   # absorbs the first half on its own
    prop.observe([seq], [half], [feats[0, half:c + 1]])
    assert prop.propose([seq], [4])[0].tokens == want
    assert prop.propose([seq], [9])[0].tokens == want                       # capped at the block size
    prop.release(seq); prop.check()

def test_refuses_other_block_sizes_and_methods(toy, drafter, tmp_path):
    save_dflash(drafter, tmp_path / "d", toy, base_model="toy")
    back = load_dflash(tmp_path / "d", toy)
    assert back.block_size == 4 and torch.equal(back.mask_embed, drafter.mask_embed)
    conf = json.loads((tmp_path / "d" / "config.json").read_text())
    for name, change, msg in [("bs", {"block_size": 1}, "block_size"), ("m", {"method": "eagle3"}, "method"),
                              ("bs8", {"block_size": 8}, "mask_embed|shape|block")]:
        shutil.copytree(tmp_path / "d", tmp_path / name)
        (tmp_path / name / "config.json").write_text(json.dumps({**conf, **change}))
        if name == "bs8":                                  # a block size the tensors allow: loads, drafts 8
            assert load_dflash(tmp_path / name, toy).block_size == 8; continue
        with pytest.raises(ValueError, match=msg): load_dflash(tmp_path / name, toy)
    with pytest.raises(ValueError, match="block_size"): DFlashDrafter.for_target(toy, block_size=40)

def test_refused_with_data_parallelism():
    from inferlab.llm import LLM
    with pytest.raises(ValueError, match="method 'dflash' with tensor_parallel_size=1, data_parallel_size=2"):
        LLM("tiny-dense", data_parallel_size=2, speculative_config={"method": "dflash"})
