"Speculation in the engine: greedy outputs identical to the plain engine for every method, no KV leaks, clear errors."
import json, shutil
import numpy as np
import pytest
import torch
from inferlab.model.config import shipped_model_path, ModelConfig
from inferlab.model.model import load_model
from inferlab.model.tokenizer import load_tokenizer
from inferlab.model.train import read_corpus
from inferlab.model.sampling import SamplingParams
from inferlab.engine.llm_engine import LLMEngine, EngineConfig
from inferlab.spec_decode.spec_decoder import SpeculativeConfig, add_speculation, fit_to_path
from inferlab.model.random_weights import random_model

def spec_engine(model, tokenizer, config=None, speculative_config=None, source=None):
    "An engine over `model` with the `SpecDecoder` that `speculative_config` asks for (chapter 34)."
    return add_speculation(LLMEngine(model, tokenizer, config), speculative_config, source)

TINY = shipped_model_path("tiny-dense")
METHODS = {"ngram": {"method": "ngram", "num_speculative_tokens": 4},
           "draft_model": {"method": "draft_model", "num_speculative_tokens": 3},
           "medusa": {"method": "medusa", "num_speculative_tokens": 4},
           "rest": {"method": "rest", "num_speculative_tokens": 4},   # datastore: the shipped corpus's training split
           "suffix": {"method": "suffix"},                            # k: the tree depth, 24, cut to the decode path
           "eagle3": {"method": "eagle3", "num_speculative_tokens": 4},   # the shipped tiny-dense-eagle3
           "dflash": {"method": "dflash", "num_speculative_tokens": 4}}   # the shipped tiny-dense-dflash
GREEDY = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)

@pytest.fixture(scope="module")
def target(): return load_model(TINY, dtype=torch.float32)

@pytest.fixture(scope="module")
def tok(): return load_tokenizer(TINY)

@pytest.fixture(scope="module")
def prompts(tok):
    "96 prompts cut from held-out code, 8-160 tokens; half share a 48-token header (prefix-cache hits)."
    ids = tok.encode(read_corpus("valid")[:150_000])
    rng = np.random.default_rng(0)
    out = [ids[s:s + int(n)] for s, n in zip(rng.integers(0, len(ids) - 200, 96), rng.integers(8, 161, 96))]
    header = ids[:48]
    return [header + p if i % 2 else p for i, p in enumerate(out)]

def run(engine, prompts, params=GREEDY):
    for i, p in enumerate(prompts): engine.add_request(p, params, request_id=str(i))
    out = {}
    while engine.has_unfinished():
        for o in engine.step():
            if o.finished: out[o.request_id] = o.token_ids
    return [out[str(i)] for i in range(len(prompts))]

CONFIGS = {"batch 1": dict(max_num_seqs=1), "batch 16, chunked prefill": dict(max_num_seqs=16, max_num_batched_tokens=96),
           "batch 16, preempting": dict(max_num_seqs=16, num_kv_blocks=48, max_num_batched_tokens=96)}
# Batch 1 runs one prompt at a time: the first 64 prompts (half behind the shared header) cover its one path; the
# batched configurations, where drafts are trimmed, chunked and preempted, take all 96 (six batches of 16 each).
NUM_PROMPTS = {"batch 1": 64}

def prompts_for(config, prompts): return prompts[:NUM_PROMPTS.get(config, len(prompts))]

@pytest.fixture(scope="module")
def plain(target, tok, prompts):
    return {name: run(LLMEngine(target, tok, EngineConfig(**cfg)), prompts_for(name, prompts))
            for name, cfg in CONFIGS.items()}

CASES = [(m, c) for m in METHODS for c in CONFIGS]

@pytest.mark.parametrize("method,config", CASES)
def test_greedy_identical(method, config, target, tok, prompts, plain):
    eng = spec_engine(target, tok, EngineConfig(**CONFIGS[config]), METHODS[method], source=TINY)
    prompts = prompts_for(config, prompts)
    got = run(eng, prompts)
    same = sum(a == b for a, b in zip(got, plain[config]))
    s = eng.stats()
    print(f"{method} {config}: identical {same}/{len(prompts)}, preemptions {s['preemptions']}, prefix hits "
          f"{s['prefix_hit_rate']:.0%}, acceptance {s['acceptance_rate']:.0%}, {s['mean_accepted_length']:.2f} tokens/verification")
    assert same == len(prompts)
    assert s["num_draft_tokens"] > 0 and s["prefix_hit_tokens"] > 0
    if "preempting" in config: assert s["preemptions"] > 0
    eng.check_idle()

@pytest.mark.parametrize("method", list(METHODS))
def test_no_leaks_with_aborts_and_preemption(method, target, tok, prompts):
    eng = spec_engine(target, tok, EngineConfig(max_num_seqs=8, num_kv_blocks=28), METHODS[method], source=TINY)
    sp, gp = SamplingParams(temperature=0.9, seed=1, max_tokens=80), SamplingParams(temperature=0, max_tokens=80)
    for i, p in enumerate(prompts[:16]): eng.add_request(p[:20], sp if i % 2 else gp, request_id=str(i))  # they grow
    for _ in range(6): eng.step()
    for i in range(0, 16, 3): eng.abort(str(i))
    while eng.has_unfinished(): eng.step()
    assert eng.stats()["preemptions"] > 0
    eng.check_idle()

@pytest.mark.parametrize("max_num_seqs", [1, 4])     # at 4, drafts are cut to fit the CPU decode path: mixed lengths
def test_stats_fields(target, tok, prompts, max_num_seqs):
    eng = spec_engine(target, tok, EngineConfig(max_num_seqs=max_num_seqs), METHODS["ngram"])
    run(eng, prompts[:8])
    s = eng.stats()
    assert s["num_accepted_tokens"] <= s["num_draft_tokens"] and len(s["acceptance_rate_per_position"]) == 4
    assert s["acceptance_rate"] == pytest.approx(s["num_accepted_tokens"] / s["num_draft_tokens"])
    rates = s["acceptance_rate_per_position"]          # vLLM's: accepted at position j per verification
    assert all(a >= b for a, b in zip(rates, rates[1:]))    # position j is reached only if 1..j-1 were accepted
    assert 1 + sum(rates) == pytest.approx(s["mean_accepted_length"])   # the accepted drafts and the bonus token
    # the raw counters behind them (vLLM's metrics), and what drafting cost
    assert sum(s["num_accepted_tokens_per_pos"]) == s["num_accepted_tokens"] and s["num_drafts"] > 0
    assert rates == [a / s["num_drafts"] for a in s["num_accepted_tokens_per_pos"]]
    assert 0 < s["draft_seconds_per_step"] <= s["draft_seconds"]

def test_max_tokens_and_stop_respected(target, tok, prompts):
    "Tokens a verification emits past max_tokens or a stop token are dropped."
    p = prompts[1]
    ref = run(LLMEngine(target, tok), [p], SamplingParams(temperature=0, max_tokens=7, ignore_eos=True))[0]
    for k in (1, 4, 8):
        eng = spec_engine(target, tok, None, {"method": "ngram", "num_speculative_tokens": k})
        assert run(eng, [p], SamplingParams(temperature=0, max_tokens=7, ignore_eos=True))[0] == ref
    stop = ref[3]
    want = run(LLMEngine(target, tok), [p], SamplingParams(temperature=0, max_tokens=7, stop_token_ids=[stop]))[0]
    eng = spec_engine(target, tok, None, {"method": "ngram", "num_speculative_tokens": 6})
    assert run(eng, [p], SamplingParams(temperature=0, max_tokens=7, stop_token_ids=[stop]))[0] == want

def test_disable_by_batch_size(target, tok, prompts):
    "No drafts while more than N requests run; drafts again once the batch has drained below it."
    def drafts(spec):
        eng = spec_engine(target, tok, EngineConfig(max_num_seqs=16), spec)
        for i, p in enumerate(prompts[:16]):       # staggered lengths: the batch drains one by one
            eng.add_request(p, SamplingParams(temperature=0, max_tokens=4 + 3 * i, ignore_eos=True))
        while eng.has_unfinished(): eng.step()
        return eng.stats()["num_draft_tokens"]
    on = drafts({"method": "ngram", "num_speculative_tokens": 4})
    gated = drafts({"method": "ngram", "num_speculative_tokens": 4, "disable_by_batch_size": 4})
    assert 0 < gated < on

@pytest.mark.parametrize("bad, field", [({"method": "beam"}, "method"), ({"method": "ngram", "num_speculative_tokens": 0}, "num_speculative_tokens"),
                                        ({"method": "ngram", "bogus": 1}, "bogus"), ({"method": "eagle"}, "method")])
def test_bad_config(bad, field, target, tok):
    with pytest.raises(ValueError, match=field): spec_engine(target, tok, None, bad)

def test_rest_datastore_errors(target, tok, tmp_path):
    with pytest.raises(ValueError, match="datastore: only the 'rest' method"):
        spec_engine(target, tok, None, {"method": "ngram", "datastore": "x.txt"})
    with pytest.raises(ValueError, match="datastore: .*nowhere.txt is not a file"):
        spec_engine(target, tok, None, {"method": "rest", "datastore": str(tmp_path / "nowhere.txt")})
    with pytest.raises(ValueError, match=r"datastore: give speculative_config\['datastore'\]"):
        spec_engine(target, tok, None, {"method": "rest"}, source=tmp_path)       # not a shipped model: no default
    (tmp_path / "one.txt").write_text("x")
    with pytest.raises(ValueError, match="datastore: needs at least 2 tokens"):
        spec_engine(target, tok, None, {"method": "rest", "datastore": str(tmp_path / "one.txt")})
    (tmp_path / "code.txt").write_text("def add(a, b):\n    return a + b\n\n" * 50)   # a datastore of its own
    eng = spec_engine(target, tok, EngineConfig(max_num_seqs=1), {"method": "rest", "datastore": str(tmp_path / "code.txt")})
    assert eng.speculator.proposer.method == "rest" and len(eng.speculator.proposer.store.tokens) > 100

def test_draft_with_other_vocabulary(target, tok, tmp_path):
    from inferlab.model.model import save_model
    other = random_model(ModelConfig(vocab_size=1000, hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                                     num_attention_heads=2, num_key_value_heads=1, head_dim=32), 0)
    save_model(other, tmp_path / "draft")
    with pytest.raises(ValueError, match="model: the draft's vocab_size 1000 differs"):
        spec_engine(target, tok, None, {"method": "draft_model", "model": str(tmp_path / "draft")})

def test_heads_for_another_model(tok, tmp_path):
    "The shipped heads were trained on tiny-dense: another model of the same shape is refused."
    other = random_model(load_model(TINY, dtype=torch.float32).config, 1)
    with pytest.raises(ValueError, match="base_fingerprint"):
        spec_engine(other, tok, None, {"method": "medusa"}, source=TINY)
    with pytest.raises(ValueError, match="model: no Medusa heads"):
        spec_engine(other, tok, None, {"method": "medusa"}, source=tmp_path)

def test_llm_facade_and_cli(capsys):
    from inferlab.llm import LLM
    from inferlab.cli import main
    llm = LLM(speculative_config={"method": "ngram", "num_speculative_tokens": 3})
    out = llm.generate(["def f(x):\n    return x\n\ndef g(x):\n    return"], SamplingParams(temperature=0, max_tokens=12))
    assert len(out[0].token_ids) == 12 and llm.engine.stats()["method"] == "ngram"
    with pytest.raises(ValueError, match="method"): LLM(speculative_config={"method": "nope"})
    assert main(["generate", "--max-tokens", "8", "--temperature", "0", "--speculative-config",
                 '{"method": "ngram", "num_speculative_tokens": 2}', "import os\nimport sys\n"]) == 0
    assert "speculation ngram" in capsys.readouterr().err
    assert main(["generate", "--speculative-config", "{not json", "x"]) != 0

def test_drafts_fit_the_cpu_decode_path(target, tok, prompts):
    "With a few requests running, drafts are cut so that a verification stays on the runner's NumPy decode path."
    assert fit_to_path([5, 5, 5, 5], 4, 8) == [1, 1, 1, 1] and fit_to_path([5, 3], 2, 8) == [3, 3]
    assert fit_to_path([5] * 9, 9, 8) == [5] * 9 and fit_to_path([5, 5], 2, None) == [5, 5]   # past the path / no path
    eng = spec_engine(target, tok, EngineConfig(max_num_seqs=4), METHODS["ngram"])
    assert eng.runner.decode_path_tokens == 8
    sizes, execute = [], eng.runner.execute
    def spy(batch, **kw):
        if batch.num_prefill_tokens == 0: sizes.append(batch.num_tokens)
        return execute(batch, **kw)
    eng.runner.execute = spy
    want = run(LLMEngine(target, tok, EngineConfig(max_num_seqs=4)), prompts[:12])
    assert run(eng, prompts[:12]) == want
    assert eng.stats()["num_draft_tokens"] > 0 and max(sizes) <= 8
    eng.check_idle()
