"The disaggregation router in-process (chapter 58): a decode worker that dies before a request's first token has that request started again on a survivor; one that dies while the router is idle is noticed before a request is sent to it."
import pytest, torch
from inferlab.engine.interface import check_engine
from inferlab.llm import LLM
from inferlab.model.sampling import SamplingParams
from inferlab.serve.router import DisaggRouter

def drain(router) -> dict:
    done = {}
    while router.has_unfinished():
        for o in router.step():
            if o.finished: done[o.request_id] = o
    return done

def test_a_dead_decode_worker_reroutes_what_it_had_not_started_and_an_idle_death_is_noticed():
    g = torch.Generator().manual_seed(3)
    ps = [torch.randint(1, 4096, (int(torch.randint(4, 160, (1,), generator=g)),), generator=g).tolist() for _ in range(16)]
    greedy = SamplingParams(max_tokens=8, temperature=0)
    want = [o.token_ids for o in LLM("tiny-dense", dtype="float32").generate(ps, greedy)]
    router = DisaggRouter("tiny-dense", 1, 2, worker_args=["--dtype", "float32"], max_local_prefill_length=64, max_prefill_queue=100)
    try:
        check_engine(router)                                # the router is an engine like any other
        rids = [router.add_request(p, greedy) for p in ps]
        d0, d1 = (next(w for w in router.workers if w.name == f"inferlab-decode-{i}") for i in (0, 1))
        on_d1 = [r for r in rids if router.requests[r].decode is d1]
        assert on_d1 and any(router.requests[r].prefill is not None for r in on_d1)   # local and remote prefills both
        d1.proc.kill(); d1.proc.wait()                      # before any step: none of its requests has a token
        done = drain(router)
        assert [done[r].error for r in rids] == [None] * len(ps)
        assert [done[r].token_ids for r in rids] == want
        assert router.stats()["rerouted"] == len(on_d1) and all(router.requests.get(r) is None for r in rids)
        d0.proc.kill(); d0.proc.wait()                      # dies while the router is idle: no step reads its EOF
        with pytest.raises(RuntimeError, match="no decode worker is alive"): router.add_request(ps[0], greedy)
        assert not router.has_unfinished()
    finally:
        router.shutdown()

def test_prompt_logprobs_refused_before_any_work():
    "The workers report tokens and text, not a prompt's scores: a request asking for them is refused by name, at once."
    bare = DisaggRouter.__new__(DisaggRouter)                   # no workers, no engine: nothing may be touched
    with pytest.raises(ValueError, match="^prompt_logprobs: not available through the disaggregation router"):
        bare.add_request([1, 2, 3], SamplingParams(prompt_logprobs=0))
