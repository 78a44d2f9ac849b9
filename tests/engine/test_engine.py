"""The engine computes what the model means: greedy outputs equal the reference generate token for token, for any
batch limit, with chunked prefill and prefix caching on or off, and under preemption; no KV block leaks; seeded
sampling does not depend on the batch; bad requests fail alone."""
import random, subprocess, sys
import pytest
import torch
from inferlab.model.config import data_dir
from inferlab.model.model import load_model
from inferlab.model.tokenizer import load_tokenizer
from inferlab.model.generate import generate_one
from inferlab.model.sampling import SamplingParams
from inferlab.engine.llm_engine import LLMEngine, EngineConfig
from inferlab.llm import LLM

N_PROMPTS = 200

@pytest.fixture(scope="module")
def model(): return load_model(dtype=torch.float32)

@pytest.fixture(scope="module")
def tok(): return load_tokenizer()

@pytest.fixture(scope="module")
def workload(model, tok):
    "200 prompts of mixed lengths (1 to ~300 tokens) cut from held-out code, a quarter sharing one of three stems."
    rng = random.Random(0)
    text = (data_dir() / "corpus" / "valid.txt").read_text()[:400_000]
    ids = tok.encode(text)
    stems = [ids[i:i + 40] for i in (1000, 5000, 9000)]
    prompts, params = [], []
    for i in range(N_PROMPTS):
        n = max(1, min(300, int(rng.lognormvariate(3.5, 1.0))))
        start = rng.randrange(0, len(ids) - n)
        p = ids[start:start + n]
        if i % 4 == 0: p = stems[i % 3] + p[: max(1, n // 2)]
        prompts.append(p)
        params.append(SamplingParams(temperature=0, max_tokens=rng.randint(1, 16)))
    ref = [generate_one(model, None, p, sp).token_ids for p, sp in zip(prompts, params)]
    return prompts, params, ref

def run_engine(model, prompts, params, **cfg):
    eng = LLMEngine(model, None, EngineConfig(**cfg))
    free0 = eng.block_manager.num_free_blocks
    seqs = [eng.requests[eng.add_request(p, sp)] for p, sp in zip(prompts, params)]   # finished ones leave the engine
    while eng.has_unfinished(): eng.step()
    assert eng.block_manager.num_free_blocks == free0, "KV blocks leaked"
    assert not eng.requests, "finished requests must leave the engine"
    return [s.output_token_ids for s in seqs], eng.stats()

@pytest.mark.parametrize("max_num_seqs", [1, 8, 64])
@pytest.mark.parametrize("chunked", [True, False], ids=["chunked", "whole"])
@pytest.mark.parametrize("prefix", [True, False], ids=["cache", "nocache"])
def test_greedy_equals_reference(model, workload, max_num_seqs, chunked, prefix):
    prompts, params, ref = workload
    if max_num_seqs == 1:               # one prompt at a time takes one path: 64 prompts (16 behind a stem) cover it
        prompts, params, ref = prompts[:64], params[:64], ref[:64]
    out, st = run_engine(model, prompts, params, max_num_seqs=max_num_seqs, enable_chunked_prefill=chunked,
                         enable_prefix_caching=prefix, max_num_batched_tokens=64 if chunked else 512)
    diff = [i for i, (a, b) in enumerate(zip(out, ref)) if a != b]
    print(f"\nmax_num_seqs={max_num_seqs} chunked={chunked} prefix_cache={prefix}: {len(ref) - len(diff)}/{len(ref)} "
          f"identical, steps {st['steps']}, prefill tokens {st['prefill_tokens']}, hit rate {st['prefix_hit_rate']:.2f}")
    assert not diff, f"prompts {diff[:5]} differ from the reference"
    if prefix: assert st["prefix_hit_tokens"] > 0

@pytest.mark.parametrize("chunked", [True, False], ids=["chunked", "whole"])
def test_greedy_equals_reference_under_preemption(model, workload, chunked):
    prompts, params, ref = workload
    out, st = run_engine(model, prompts, params, max_num_seqs=64, num_kv_blocks=48, enable_chunked_prefill=chunked,
                         max_num_batched_tokens=128 if chunked else 512)
    print(f"\n48 blocks of 16, chunked={chunked}: preemptions {st['preemptions']}, steps {st['steps']}")
    assert st["preemptions"] > 0
    assert out == ref

def test_long_chunks_after_a_prefix(model, tok, monkeypatch):
    """Chunks of 256 new tokens after a cached prefix (chunked prefill of long prompts; prefix-cache hits on a long
    stem): greedy outputs equal the reference generate through the engine's C prefill (chapter 15h), and through
    chapter 13's path, whose chunks attend in two mask-free passes on CPU (`causal_after_prefix`), which did run."""
    from inferlab.engine import paged_attention, llm_engine
    from inferlab.engine.c_rows import CRowsDecoder
    from inferlab.engine.c_flash import flash_library
    calls, split = [], paged_attention.causal_after_prefix
    monkeypatch.setattr(paged_attention, "causal_after_prefix", lambda *a: calls.append(a[3]) or split(*a))
    ids = tok.encode((data_dir() / "corpus" / "valid.txt").read_text()[:400_000])
    stem = ids[20_000:20_600]
    prompts = [ids[2_000:2_700], ids[7_000:8_100], stem + ids[30_000:30_300], stem + ids[40_000:40_280]]
    params = [SamplingParams(temperature=0, max_tokens=8) for _ in prompts]
    ref = [generate_one(model, None, p, sp).token_ids for p, sp in zip(prompts, params)]
    run = lambda: run_engine(model, prompts, params, max_num_seqs=1, max_num_batched_tokens=256, max_model_len=2048)
    out, st = run()
    assert out == ref and st["prefix_hit_tokens"] >= 512           # the last two share the stem's cached blocks
    assert not calls or flash_library()[0] is None                   # the C took every chunk
    monkeypatch.setattr(llm_engine, "CPrefillDecoder", CRowsDecoder)   # the runner's decoder: chapter 13's prefill
    out, st = run()
    assert out == ref and st["prefix_hit_tokens"] >= 512
    assert len(calls) >= 6 * 4 and min(calls) >= 256                 # per layer: every chunk after a first one


def test_no_leak_after_abort_and_errors(model, tok):
    eng = LLMEngine(model, tok, EngineConfig(num_kv_blocks=64, max_num_batched_tokens=32))
    free0 = eng.block_manager.num_free_blocks
    rids = [eng.add_request("def f(x):\n" * (i + 1), dict(temperature=0, max_tokens=30)) for i in range(6)]
    seqs = [eng.requests[r] for r in rids]
    for bad in ("", list(range(5000)), [10**6]):
        with pytest.raises(ValueError): eng.add_request(bad)
    for _ in range(3): eng.step()
    assert eng.block_manager.num_free_blocks < free0
    assert eng.abort(rids[0]) and eng.abort(rids[5])            # one running, one possibly still waiting
    while eng.has_unfinished(): eng.step()
    assert eng.block_manager.num_free_blocks == free0
    assert [s.finish_reason for s in seqs].count("abort") == 2

def test_seeded_sampling_independent_of_batch(model, tok):
    llm_ = LLM.from_engine(LLMEngine(model, tok, EngineConfig()))
    sp = SamplingParams(temperature=0.9, top_k=50, top_p=0.9, seed=7, max_tokens=24)
    alone = llm_.generate(["import os\n"], sp)[0].token_ids
    others = [SamplingParams(temperature=1.0, max_tokens=24, seed=None)] * 63
    crowd = llm_.generate(["import os\n"] + [f"x{i} = {i}\n" for i in range(63)], [sp] + others)[0].token_ids
    assert alone == crowd == generate_one(model, tok, "import os\n", sp).token_ids
    assert llm_.generate(["import os\n"], SamplingParams(temperature=0.9, seed=8, max_tokens=24))[0].token_ids != alone

@pytest.mark.parametrize("prompt, params, match", [
    (list(range(1, 2049)), {}, "context"),
    ("", {}, "empty"),
    ("x", dict(max_tokens=0), "max_tokens"),
    ("x", dict(temperature=-0.5), "temperature"),
    ("x", dict(top_p=0.0), "top_p"),
    ("x", dict(top_p=1.5), "top_p"),
])
def test_bad_request_fails_alone(model, tok, prompt, params, match):
    llm_ = LLM.from_engine(LLMEngine(model, tok, EngineConfig(num_kv_blocks=256)))
    free0 = llm_.engine.block_manager.num_free_blocks
    good = SamplingParams(temperature=0, max_tokens=8)
    outs = llm_.generate(["def f(x):", prompt, "import sys"], [good, params, good])
    assert outs[1].finish_reason == "error" and isinstance(outs[1].error, ValueError)
    assert match in str(outs[1].error)
    for o, p in ((outs[0], "def f(x):"), (outs[2], "import sys")):
        assert o.finish_reason in ("length", "stop") and o.token_ids == generate_one(model, tok, p, good).token_ids
    assert llm_.engine.block_manager.num_free_blocks == free0

def test_long_prompts_with_cached_prefix_and_chunked_prefill(model, tok):
    "Prompts of 1,000-1,900 tokens, half of them sharing a cached 1,024-token prefix, prefilled in 256-token chunks."
    text = (data_dir() / "corpus" / "valid.txt").read_text()[:400_000]
    ids, rng = tok.encode(text), random.Random(1)
    shared = ids[20_000:21_024]                                  # 64 blocks of 16: a whole-block prefix
    prompts = []
    for i in range(6):
        n = rng.randint(1000, 1900)
        start = rng.randrange(0, len(ids) - n)
        prompts.append(shared + ids[start:start + n - len(shared)] if i % 2 else ids[start:start + n])
    params = [SamplingParams(temperature=0, max_tokens=12) for _ in prompts]
    ref = [generate_one(model, None, p, sp).token_ids for p, sp in zip(prompts, params)]
    eng = LLMEngine(model, None, EngineConfig(max_num_batched_tokens=256, max_num_seqs=4))
    free0 = eng.block_manager.num_free_blocks
    first = eng.requests[eng.add_request(prompts[1], params[1])]   # warms the cache with the shared prefix
    while eng.has_unfinished(): eng.step()
    seqs = [eng.requests[eng.add_request(p, sp)] for p, sp in zip(prompts, params)]
    while eng.has_unfinished(): eng.step()
    assert first.output_token_ids == ref[1]
    assert [s.output_token_ids for s in seqs] == ref
    assert all(seqs[i].num_cached_tokens >= 1024 for i in (1, 3, 5))   # the prefix came from the cache
    assert all(len(p) >= 1000 for p in prompts) and eng.block_manager.num_free_blocks == free0

FREEZE = """
import gc, torch
from inferlab.model.model import load_model
from inferlab.engine.llm_engine import LLMEngine, EngineConfig
m = load_model(dtype=torch.float32)
LLMEngine(m, None, EngineConfig(num_kv_blocks=8, freeze_gc_heap=False)); off = gc.get_freeze_count()
first = LLMEngine(m, None, EngineConfig(num_kv_blocks=8)); on = gc.get_freeze_count()
LLMEngine(m, None, EngineConfig(num_kv_blocks=8)); again = gc.get_freeze_count()
print(off, on, again, len(gc.get_objects()))
"""

def test_the_first_engine_freezes_the_startup_heap_once():
    "A fresh process: no freeze when asked not to; the first engine freezes the heap; the next leaves it as it is."
    out = subprocess.run([sys.executable, "-c", FREEZE], capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stderr[-2000:]
    off, on, again, walked = map(int, out.stdout.split()[-4:])
    assert off == 0 and on > 10 * walked and again == on
    with pytest.raises(ValueError, match="freeze_gc_heap: must be True or False, got 'yes'"):
        EngineConfig(freeze_gc_heap="yes")
