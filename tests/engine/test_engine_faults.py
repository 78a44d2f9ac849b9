"""One bad request, a failing model step or a second thread never breaks the engine: the bad request ends alone with
an error naming its culprit, the others complete, no KV block leaks, and the next call works."""
import threading
import pytest
import torch
from inferlab.engine.llm_engine import LLMEngine, EngineDeadError
from inferlab.llm import LLM, as_prompt_list
from inferlab.model.sampling import SamplingParams

G = SamplingParams(temperature=0, max_tokens=8)
PROMPTS = ["def add(a, b):", "import os\n", "class Stack:"]

@pytest.fixture(scope="module")
def llm(): return LLM()

@pytest.fixture(scope="module")
def solo(llm): return [o.token_ids for o in llm.generate(PROMPTS, G)]

def _clean(llm, free0):
    eng = llm.engine
    assert not eng.has_unfinished() and len(eng.requests) == 0 and not eng.scheduler.running
    assert eng.block_manager.num_free_blocks == free0, "KV blocks leaked"

@pytest.mark.parametrize("bad, field", [(dict(logprobs=5000), "logprobs"), (dict(logprobs=True), "logprobs"),
                                        (dict(temperature=float("inf")), "temperature"), (dict(stop=5), "stop"),
                                        (dict(stop_token_ids=5), "stop_token_ids"), (dict(seed=2**70), "seed")])
def test_bad_field_fails_alone(llm, solo, bad, field):
    free0 = llm.engine.block_manager.num_free_blocks
    outs = llm.generate(PROMPTS, [G, {**dict(temperature=0, max_tokens=8), **bad}, G])
    assert outs[1].finish_reason == "error" and field in str(outs[1].error)
    assert outs[0].token_ids == solo[0] and outs[2].token_ids == solo[2]
    _clean(llm, free0)
    assert [o.token_ids for o in llm.generate(PROMPTS, G)] == solo           # the engine keeps working

def test_none_stop_fields_mean_none(llm, solo):
    outs = llm.generate(PROMPTS, dict(temperature=0, max_tokens=8, stop=None, stop_token_ids=None))
    assert [o.token_ids for o in outs] == solo

@pytest.mark.parametrize("temperature", [0, 0.8])
def test_non_finite_logits_fail_alone(llm, solo, monkeypatch, temperature):
    eng, free0 = llm.engine, llm.engine.block_manager.num_free_blocks
    real = eng.runner.execute
    def poisoned(batch):
        seqs, logits = real(batch)
        logits = logits.clone()                    # (inference tensors are read-only outside inference mode)
        for i, s in enumerate(seqs):
            if s.prompt_token_ids == eng.tokenizer.encode(PROMPTS[1]): logits[i, 7] = float("nan")
        return seqs, logits
    monkeypatch.setattr(eng.runner, "execute", poisoned)
    outs = llm.generate(PROMPTS, [G, SamplingParams(temperature=temperature, max_tokens=8, seed=1), G])
    assert outs[1].finish_reason == "error" and "non-finite" in str(outs[1].error)
    assert outs[0].token_ids == solo[0] and outs[2].token_ids == solo[2]
    _clean(llm, free0)

def test_failure_in_one_requests_bookkeeping_fails_alone(llm, solo, monkeypatch):
    eng, free0 = llm.engine, llm.engine.block_manager.num_free_blocks
    real = eng.append_token
    def broken(seq, tok, logits):
        if seq.prompt_token_ids == eng.tokenizer.encode(PROMPTS[2]) and seq.num_output_tokens == 3:
            raise RuntimeError("detokenizer exploded")
        return real(seq, tok, logits)
    monkeypatch.setattr(eng, "append_token", broken)
    outs = llm.generate(PROMPTS, G)
    assert outs[2].finish_reason == "error" and "exploded" in str(outs[2].error) and len(outs[2].token_ids) == 3
    assert [o.token_ids for o in outs[:2]] == solo[:2]
    _clean(llm, free0)

def _fail_at(eng, monkeypatch, call: int, err: Exception) -> list[int]:
    "The runner's `call`-th step raises `err`; the steps before and after run the model. Returns the call counter."
    real, calls = eng.runner.execute, [0]
    def execute(batch):
        calls[0] += 1
        if calls[0] == call: raise err
        return real(batch)
    monkeypatch.setattr(eng.runner, "execute", execute)
    return calls

def test_model_failure_ends_the_steps_requests_and_engine_recovers(llm, solo, monkeypatch):
    eng, free0 = llm.engine, llm.engine.block_manager.num_free_blocks
    _fail_at(eng, monkeypatch, 3, RuntimeError("The size of tensor a (24) must match the size of tensor b (16)"))
    outs = llm.generate(PROMPTS, G)
    assert all(o.finish_reason == "error" and "model step failed" in str(o.error) for o in outs)
    _clean(llm, free0)
    assert [o.token_ids for o in llm.generate(PROMPTS, G)] == solo           # the next call is whole again
    _clean(llm, free0)

def test_a_dead_engine_raises_instead_of_ending_requests(llm, solo, monkeypatch):
    "A failure of the engine itself (a parallel worker died) is not one step's: step() raises it to the caller."
    eng, free0 = llm.engine, llm.engine.block_manager.num_free_blocks
    calls = _fail_at(eng, monkeypatch, 3, EngineDeadError("worker rank 1 exited with code -9"))
    with pytest.raises(EngineDeadError, match="rank 1"): llm.generate(PROMPTS, G)
    assert calls[0] == 3                                                   # raised at once, not retried step by step
    monkeypatch.undo()                                                     # (a real dead engine stays dead)
    assert [o.token_ids for o in llm.generate(PROMPTS, G)] == solo         # generate's abort left nothing behind
    _clean(llm, free0)

def test_two_threads_share_one_llm(llm, solo):
    free0, results, errors = llm.engine.block_manager.num_free_blocks, {}, []
    def worker(k):
        try: results[k] = [o.token_ids for o in llm.generate(PROMPTS * 4, G)]
        except Exception as e: errors.append(e)
    threads = [threading.Thread(target=worker, args=(k,)) for k in range(2)]
    for t in threads: t.start()
    for t in threads: t.join(120)
    assert not errors and results[0] == results[1] == solo * 4
    _clean(llm, free0)

def test_concurrent_step_is_refused(llm):
    eng = llm.engine
    with eng._step_lock:                           # as if another thread were inside step()
        with pytest.raises(RuntimeError, match="two threads"): eng.step()

@pytest.mark.parametrize("prompts", [None, 42, (p for p in PROMPTS), [42, "text", "text"], [True, False], [1.5]])
def test_bad_prompts_argument_queues_nothing(llm, prompts):
    with pytest.raises(ValueError, match="prompts"): llm.generate(prompts, G)
    assert not llm.engine.has_unfinished() and len(llm.engine.requests) == 0

def test_bad_priority_and_params_lengths_queue_nothing(llm):
    with pytest.raises(ValueError, match="priority"): llm.generate(PROMPTS, G, priority=[0])
    with pytest.raises(ValueError, match="params"): llm.generate(PROMPTS, [G, G])
    assert not llm.engine.has_unfinished() and len(llm.engine.requests) == 0

def test_bool_token_ids_are_refused(llm):
    out, = llm.generate([[1, True, 3]], G)
    assert out.finish_reason == "error" and "boolean" in str(out.error)
    assert as_prompt_list([5, 6]) == [[5, 6]] and as_prompt_list("x") == ["x"]

def test_abort_from_outside_returns_and_forgets(llm):
    eng, free0 = llm.engine, llm.engine.block_manager.num_free_blocks
    rid = eng.add_request("def f():", G)
    eng.step()
    assert eng.abort(rid) and eng.has_unfinished()           # its final output is still owed
    outs = eng.step()
    assert [(o.request_id, o.finish_reason) for o in outs] == [(rid, "abort")]
    _clean(llm, free0)

def _rss_mb() -> float:
    with open("/proc/self/statm") as f: return int(f.read().split()[1]) * 4096 / 2**20

def test_memory_flat_over_many_requests(llm):
    "20 rounds of 64 requests: the engine holds no finished request, and RSS stays within 5% of the first round."
    eng, rss = llm.engine, []
    params = SamplingParams(temperature=0.8, max_tokens=4, seed=0)
    for r in range(20):
        llm.generate([f"x = {i} + {r}" for i in range(64)], params)
        assert len(eng.requests) == 0 and len(eng.prompts) == 0
        rss.append(_rss_mb())
    print(f"\nRSS per round (MB): first {rss[0]:.1f}, last {rss[-1]:.1f}, max {max(rss):.1f}")
    assert max(rss) <= rss[0] * 1.05

@pytest.mark.parametrize("kw, field", [(dict(kv_cache_memory=10**13), "kv_cache_memory"),
                                       (dict(num_kv_blocks=10**9), "num_kv_blocks"),
                                       (dict(num_kv_blocks=True), "num_kv_blocks")])
def test_impossible_kv_pool_is_refused_at_once(kw, field):
    import time
    t = time.perf_counter()
    with pytest.raises(ValueError, match=field): LLM(**kw)
    assert time.perf_counter() - t < 10

def test_generate_cli_with_an_empty_prompt_exits_cleanly(capsys):
    from inferlab.cli import main
    assert main(["generate", "", "--max-tokens", "4"]) == 2          # the error, then no summary and no traceback
    err = capsys.readouterr()
    assert "prompt: is empty" in err.out + err.err and "Traceback" not in err.out + err.err

def test_add_prefilled_failure_leaves_engine_as_it_was(llm):
    "A KV load that fails (a bad transfer) or a refused parameter leaves no request and no block behind."
    from inferlab.engine.kv_connector import KVConnector, add_prefilled
    eng, free0 = llm.engine, llm.engine.block_manager.num_free_blocks
    ids = eng.tokenizer.encode("def add(a, b):\n    return a + b\n" * 4)
    seen = []
    class Broken(KVConnector):
        def lookup(self, seq, hashes, start): return [None] * (-(-len(ids) // eng.config.block_size) - start)
        def load(self, runner, block_ids, staged):
            seen.append(len(block_ids)); raise ValueError("kv: transfer broke")
    with pytest.raises(ValueError, match="transfer broke"): add_prefilled(eng, ids, 7, Broken(), G)
    assert seen == [-(-len(ids) // eng.config.block_size)]            # every block of the prompt was to be written
    with pytest.raises(ValueError, match="logprobs"):
        add_prefilled(eng, ids, 7, Broken(), SamplingParams(temperature=0, logprobs=2))
    _clean(llm, free0)
