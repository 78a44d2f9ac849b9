"""Property test (hypothesis): random mixes of good requests, requests with a bad field, aborts and tiny KV pools.
Good requests give the reference generate's tokens (as when run alone), bad ones end with an error naming the field,
aborted ones end as aborted, every KV block comes back, and the same engines serve every example."""
import pytest
import torch
from hypothesis import given, settings, strategies as st, HealthCheck
from inferlab.model.model import load_model
from inferlab.model.generate import generate_one
from inferlab.model.sampling import SamplingParams
from inferlab.engine.llm_engine import LLMEngine, EngineConfig

MODEL = load_model(dtype=torch.float32)
ENGINES = {n: LLMEngine(MODEL, None, EngineConfig(num_kv_blocks=n, block_size=16, max_num_batched_tokens=32,
                                                  max_num_seqs=4)) for n in (8, 16, 64)}
FREE0 = {n: e.block_manager.num_free_blocks for n, e in ENGINES.items()}
REFERENCE: dict = {}
BAD = [("temperature", -1.0), ("temperature", float("inf")), ("top_p", 0.0), ("top_k", -5), ("logprobs", 5000),
       ("max_tokens", 0), ("stop", 5), ("seed", 2**70), ("foo", 1)]

def reference(prompt: tuple, params: dict) -> list[int]:
    key = (prompt, tuple(sorted(params.items())))
    if key not in REFERENCE: REFERENCE[key] = generate_one(MODEL, None, list(prompt), SamplingParams(**params)).token_ids
    return REFERENCE[key]

good = st.fixed_dictionaries({"prompt": st.lists(st.integers(1, 4095), min_size=1, max_size=40).map(tuple),
                              "params": st.one_of(
                                  st.builds(lambda n: dict(temperature=0, max_tokens=n, ignore_eos=True), st.integers(1, 6)),
                                  st.builds(lambda n, s: dict(temperature=0.9, max_tokens=n, seed=s, ignore_eos=True),
                                            st.integers(1, 6), st.integers(0, 3)))})
bad = st.fixed_dictionaries({"prompt": st.lists(st.integers(1, 4095), min_size=1, max_size=10).map(tuple),
                             "bad": st.sampled_from(BAD)})
request = st.one_of(good.map(lambda r: {**r, "kind": "good"}), bad.map(lambda r: {**r, "kind": "bad"}),
                    good.map(lambda r: {**r, "kind": "abort"}))

@settings(max_examples=500, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(reqs=st.lists(request, min_size=1, max_size=6), pool=st.sampled_from(sorted(ENGINES)),
       abort_step=st.integers(0, 4))
def test_random_mixes_keep_the_engine_whole(reqs, pool, abort_step):
    eng = ENGINES[pool]
    outcome, rids = {}, {}
    for i, r in enumerate(reqs):
        if r["kind"] == "bad":
            field, value = r["bad"]
            params = {"temperature": 0, "max_tokens": 3, field: value}
        else: params = r["params"]
        try: rids[eng.add_request(list(r["prompt"]), params)] = i
        except ValueError as e: outcome[i] = ("rejected", str(e))
    steps = 0
    while eng.has_unfinished():
        if steps == abort_step:
            for rid, i in rids.items():
                if reqs[i]["kind"] == "abort": eng.abort(rid)
        for out in eng.step():
            if out.finished: outcome[rids[out.request_id]] = (out.finish_reason, out.token_ids)
        steps += 1
    for i, r in enumerate(reqs):
        kind, (how, what) = r["kind"], outcome[i]
        if kind == "bad":
            assert how == "rejected" and r["bad"][0] in what, (r, outcome[i])
        elif kind == "good":
            assert how == "length" and what == reference(r["prompt"], r["params"]), (r, outcome[i])
        else:                                           # aborted, unless it had already finished
            assert how == "abort" or (how == "length" and what == reference(r["prompt"], r["params"]))
    assert eng.block_manager.num_free_blocks == FREE0[pool] and not eng.requests and not eng.scheduler.running
