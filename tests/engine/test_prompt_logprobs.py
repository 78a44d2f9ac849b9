"""Prompt logprobs (chapter 15e): the engine's scores of every prompt token equal log_softmax of `transformers`' logits
on the same checkpoint, with chunked prefill, a warm prefix cache, preemption, speculation and requests that ask for
nothing beside them; no KV block leaks; a path that cannot give them refuses by name."""
import pytest
from inferlab.engine.kv_connector import KVConnector, add_prefilled
import torch
import transformers
from inferlab.model.config import shipped_model_path, data_dir
from inferlab.model.model import load_model
from inferlab.model.tokenizer import load_tokenizer
from inferlab.model.generate import generate_one
from inferlab.model.sampling import SamplingParams
from inferlab.engine.llm_engine import LLMEngine, EngineConfig

TINY = shipped_model_path("tiny-dense")
K = 5

@pytest.fixture(scope="module")
def model(): return load_model(TINY, dtype=torch.float32)

@pytest.fixture(scope="module")
def tok(): return load_tokenizer(TINY)

@pytest.fixture(scope="module")
def prompts(tok):
    "Prompts of 1, 2, 17, 33, 64 and ~150 tokens cut from held-out code."
    ids = tok.encode((data_dir() / "corpus" / "valid.txt").read_text()[:20_000])
    return [ids[:1], ids[10:12], ids[100:117], ids[300:333], ids[500:564], ids[1000:1150]]

@pytest.fixture(scope="module")
def truth(prompts):
    "transformers' log-probabilities [P, vocab] of each prompt, float32."
    hf = transformers.AutoModelForCausalLM.from_pretrained(TINY, dtype=torch.float32).eval()
    with torch.no_grad(): return [torch.log_softmax(hf(torch.tensor([p])).logits[0].float(), -1) for p in prompts]

def run(model, prompts, params, **cfg):
    "Every prompt through one engine; outputs in prompt order. The pool must be whole again at the end."
    eng = LLMEngine(model, None, EngineConfig(**{"num_kv_blocks": 128, **cfg}))
    plist = params if isinstance(params, list) else [params] * len(prompts)
    rids = [eng.add_request(p, sp) for p, sp in zip(prompts, plist)]
    done = {}
    while eng.has_unfinished():
        for o in eng.step():
            if o.finished: done[o.request_id] = o
    assert eng.block_manager.num_free_blocks == eng.block_manager.num_blocks, "KV blocks leaked"
    eng.check_idle()
    return [done[r] for r in rids], eng

def max_error(outs, prompts, truth) -> float:
    "Largest |engine - transformers| over every scored prompt token; checks the shape, ranks and top-k on the way."
    err = 0.0
    for o, p, lp in zip(outs, prompts, truth):
        assert o.error is None and len(o.prompt_logprobs) == len(o.prompt_ranks) == len(o.prompt_top_logprobs) == len(p)
        assert o.prompt_logprobs[0] is None and o.prompt_ranks[0] is None and o.prompt_top_logprobs[0] is None
        for i in range(1, len(p)):
            row, t = lp[i - 1], p[i]
            err = max(err, abs(o.prompt_logprobs[i] - row[t].item()))
            top = o.prompt_top_logprobs[i]
            assert len(top) == K and max(top.values()) == pytest.approx(row.max().item(), abs=1e-4)
            if row.topk(2).values.diff().abs().item() > 1e-3:                  # no near-tie: the same winner
                assert next(iter(top)) == int(row.argmax())
            if abs(o.prompt_logprobs[i] - max(top.values())) > 1e-3: assert o.prompt_ranks[i] > 1
            if o.prompt_ranks[i] == 1: assert o.prompt_logprobs[i] == max(top.values())   # exactly: "is greedy"
    return err

SCORE = SamplingParams(prompt_logprobs=K, max_tokens=1, temperature=0)

def test_equals_transformers(model, prompts, truth):
    outs, eng = run(model, prompts, SCORE)
    err = max_error(outs, prompts, truth)
    print(f"\nmax |prompt logprob - transformers| over {sum(map(len, prompts)) - len(prompts)} tokens: {err:.2e}")
    assert err < 1e-4

@pytest.mark.parametrize("budget", [1, 7, 16])
def test_chunked_prefill(model, prompts, truth, budget):
    outs, eng = run(model, prompts, SCORE, max_num_batched_tokens=budget, max_num_seqs=3)
    assert eng.num_steps > len(prompts) and max_error(outs, prompts, truth) < 1e-4

def test_chunked_prefill_off(model, prompts, truth):
    outs, _ = run(model, prompts, SCORE, enable_chunked_prefill=False, max_num_batched_tokens=160)
    assert max_error(outs, prompts, truth) < 1e-4

def test_warm_prefix_cache_gives_the_cold_numbers(model, prompts, truth):
    cold, _ = run(model, prompts, SCORE, enable_prefix_caching=False)
    eng = LLMEngine(model, None, EngineConfig(num_kv_blocks=256))
    for p in prompts: eng.add_request(p, SamplingParams(max_tokens=1))          # warms the cache
    while eng.has_unfinished(): eng.step()
    hits = eng.block_manager.hit_tokens
    rids = [eng.add_request(p, SCORE) for p in prompts]
    warm = {o.request_id: o for _ in range(100) if eng.has_unfinished() for o in eng.step() if o.finished}
    warm = [warm[r] for r in rids]
    assert eng.block_manager.hit_tokens == hits and all(o.metrics.num_cached_tokens == 0 for o in warm)
    assert max(abs(a - b) for c, w in zip(cold, warm) for a, b in zip(c.prompt_logprobs[1:], w.prompt_logprobs[1:])) < 1e-5
    assert [c.prompt_ranks for c in cold] == [w.prompt_ranks for w in warm]
    assert max_error(warm, prompts, truth) < 1e-4
    eng.add_request(prompts[-1], SamplingParams(max_tokens=1))       # a plain request still reads the blocks
    while eng.has_unfinished(): eng.step()
    assert eng.block_manager.hit_tokens - hits == (len(prompts[-1]) - 1) // 16 * 16
    eng.check_idle()

def test_preemption_recomputes_without_duplicates(model, prompts, truth):
    many = prompts[2:] * 4
    params = SamplingParams(prompt_logprobs=K, max_tokens=24, temperature=0, ignore_eos=True)
    outs, eng = run(model, many, params, num_kv_blocks=16, max_num_batched_tokens=48)
    print(f"\n{eng.scheduler.num_preemptions} preemptions")
    assert eng.scheduler.num_preemptions > 0 and sum(o.metrics.num_preemptions for o in outs) > 0
    assert max_error(outs, many, truth[2:] * 4) < 1e-4
    alone = [generate_one(model, None, p, params).token_ids for p in prompts[2:]]
    assert [o.token_ids for o in outs] == alone * 4                   # and the outputs are the reference's

def test_mixed_batch_keeps_greedy_outputs(model, tok, prompts, truth):
    plain = [tok.encode(t) for t in ("def add(a, b):", "class Stack:", "import os\n\ndef", "for i in range(")]
    greedy = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True, logprobs=2)
    ref = [generate_one(model, None, p, greedy) for p in plain]
    mix = [x for pair in zip(prompts[2:], plain) for x in pair]
    params = [p for _ in plain for p in (SamplingParams(prompt_logprobs=K, max_tokens=12, temperature=0), greedy)]
    outs, _ = run(model, mix, params, max_num_batched_tokens=24)
    scored, others = outs[0::2], outs[1::2]
    assert [o.token_ids for o in others] == [r.token_ids for r in ref]
    assert all(o.prompt_logprobs == [] and o.prompt_top_logprobs == [] and len(o.logprobs) == 12 for o in others)
    assert max(abs(a - b) for o, r in zip(others, ref) for a, b in zip(o.logprobs, r.logprobs)) < 1e-4
    assert max_error(scored, prompts[2:], truth[2:]) < 1e-4

def test_top_zero_and_short_prompts(model, prompts):
    outs, _ = run(model, prompts[:3], SamplingParams(prompt_logprobs=0, max_tokens=1))
    assert outs[0].prompt_logprobs == [None] and outs[0].prompt_ranks == [None]   # one token: nothing to score
    assert len(outs[1].prompt_logprobs) == 2 and outs[1].prompt_top_logprobs == [None, {}]
    assert all(r >= 1 for r in outs[2].prompt_ranks[1:])

@pytest.mark.parametrize("method", ["ngram", "medusa", "eagle3"])
def test_speculation_gives_the_same_prompt_logprobs(model, tok, prompts, truth, method):
    from inferlab.spec_decode.spec_decoder import add_speculation
    params = SamplingParams(prompt_logprobs=K, max_tokens=16, temperature=0, ignore_eos=True)
    plain, _ = run(model, prompts[2:], params)
    eng = add_speculation(LLMEngine(model, tok, EngineConfig(num_kv_blocks=128, max_num_batched_tokens=40)),
                          {"method": method, "num_speculative_tokens": 3}, TINY)
    rids = [eng.add_request(p, params) for p in prompts[2:]]
    done = {o.request_id: o for _ in range(400) if eng.has_unfinished() for o in eng.step() if o.finished}
    spec = [done[r] for r in rids]
    assert [o.token_ids for o in spec] == [o.token_ids for o in plain]
    assert max(abs(a - b) for s, p in zip(spec, plain) for a, b in zip(s.prompt_logprobs[1:], p.prompt_logprobs[1:])) < 1e-5
    assert max_error(spec, prompts[2:], truth[2:]) < 1e-4
    eng.check_idle()

class NoWork(KVConnector):
    def lookup(self, seq, hashes, start): pytest.fail("no work may start")

def test_prefilled_elsewhere_refuses_by_name(model, prompts):
    eng = LLMEngine(model, None, EngineConfig(num_kv_blocks=32))
    with pytest.raises(ValueError, match="^prompt_logprobs: .*prefilled elsewhere"):
        add_prefilled(eng, prompts[3], 7, NoWork(), SCORE)
    assert not eng.requests and eng.block_manager.num_free_blocks == 32 and not eng.has_unfinished()
