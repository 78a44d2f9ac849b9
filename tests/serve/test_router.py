"The disaggregation router in-process (chapter 58): a decode worker that dies before a request's first token has that request started again on a survivor; one that dies while the router is idle is noticed before a request is sent to it; the decode worker is chosen by the routing policy (chapter 58a) from an index the workers' KV events keep current."
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

class _Proc:
    pid = 0
    def poll(self): return None                                   # alive

class _Conn:
    "A worker connection that records what the router sends."
    def __init__(self): self.sent = []
    def send_bytes(self, b): self.sent.append(b)

def _bare_router(mode="kv", num_decode=2):
    "A router's bookkeeping with fake decode workers: no processes (routing, reports and stats only)."
    from inferlab.engine.llm_engine import EngineConfig
    from inferlab.model.tokenizer import load_tokenizer
    from inferlab.model.config import load_config, resolve_model_path
    from inferlab.serve.kv_routing import RoutingPolicy
    from inferlab.serve.registry import Worker, WorkerRegistry
    r = DisaggRouter.__new__(DisaggRouter)
    r.registry, r.kv_transport, r._next_check = WorkerRegistry(), "auto", 0.0   # a door nobody comes through
    r.config, r.routing, r.requests, r._done = EngineConfig(), RoutingPolicy(mode), {}, []
    r.model_config, r.tokenizer = load_config(resolve_model_path("tiny-dense")), load_tokenizer("tiny-dense")
    r.max_model_len, r.max_local_prefill_length, r.max_prefill_queue = 2048, 1000, 2
    r.kv_bytes = r.kv_blocks = r.remote_prefills = r.local_prefills = r.fallbacks = r.rerouted = 0
    r.kv_transfers, r._departed = {"shm": 0, "tcp": 0}, dict(query=0, hits=0, drafts=0, accepted=0)
    r.workers = r.registry.workers
    r.workers += [Worker(f"inferlab-decode-{i}", _Proc(), _Conn(), pool=_report(events=False)["pool"])
                  for i in range(num_decode)]
    return r

def _report(stored=(), removed=(), events=True):
    pool = dict(free=100, blocks=100, query=0, hits=0, running=0, waiting=0)
    if events: pool["kv_events"] = dict(stored=[h.hex() for h in stored], removed=[h.hex() for h in removed])
    return dict(op="out", outs=[], pool=pool)

def test_kv_events_keep_the_decode_index_current_and_route_the_prefix_there():
    from inferlab.engine.block_manager import chain_hashes
    r = _bare_router()
    d0, d1 = r.workers
    system = list(range(100, 196))                                # 6 full blocks
    chain = chain_hashes(system + [1], 16)
    r._handle(d1, _report(stored=chain))
    assert d1.hashes == set(chain) and d0.hashes == set()
    first = r.add_request(list(range(500, 530)), SamplingParams(max_tokens=4))    # no overlap anywhere: decode-0
    assert r.requests[first].decode is d0
    rid = r.add_request(system + [7, 8, 9], SamplingParams(max_tokens=4))        # its 6 blocks are on decode-1
    assert r.requests[rid].decode is d1
    s = r.stats()
    assert (s["router_prefix_query_tokens"], s["router_prefix_hit_tokens"]) == (30 + 99, 96)
    r._handle(d1, _report(removed=chain[:1]))                     # decode-1 evicted the first block: the chain breaks
    assert r._load(d1, chain).overlap_blocks == 0
    r._handle(d1, _report(events=False))                          # a report without events changes nothing
    assert d1.hashes == set(chain[1:])
    third = r.add_request(system + [4, 5], SamplingParams(max_tokens=4))         # by load now: decode-0 is lighter
    assert r.requests[third].decode is d0 and r.stats()["router_prefix_hit_tokens"] == 96

def test_the_router_never_assumes_what_it_sent_is_cached():
    "The old approximation (remember the prompts sent) is gone: without events, a second request sees no overlap."
    r = _bare_router("kv")
    system = list(range(100, 196))
    a = r.add_request(system + [1], SamplingParams(max_tokens=4))
    assert r.requests[a].decode.hashes == set()
    b = r.add_request(system + [2], SamplingParams(max_tokens=4))
    assert r.requests[b].decode is not r.requests[a].decode          # by load: the other worker is idle
    assert r.stats()["router_prefix_hit_tokens"] == 0

def test_decode_load_counts_a_shared_prefix_once():
    from inferlab.engine.block_manager import chain_hashes
    r = _bare_router("least_loaded")
    d0 = r.workers[0]
    system = list(range(100, 196))
    for q in ([1, 2], [3, 4, 5]):
        rid = r.add_request(system + q, SamplingParams(max_tokens=4)); r.requests[rid].decode.inflight.discard(rid)
        d0.inflight.add(rid); r.requests[rid].decode = d0
    load = r._load(d0, chain_hashes(system + [9], 16))
    assert load.active_blocks == 6 + 1 + 1 and load.num_requests == 2     # 6 shared blocks once, one tail block each
    r.requests[rid].tokens += list(range(20))                          # 99 + 20 tokens: 8 blocks, 2 of them its own
    assert r._load(d0, []).active_blocks == 6 + 1 + 2

def test_router_mode_is_checked_before_any_worker_starts():
    with pytest.raises(ValueError, match="^router_mode: 'rr' is not a routing policy"):
        DisaggRouter("tiny-dense", 1, 1, router_mode="rr")

def test_a_shared_prefix_follows_the_decode_workers_kv_events():
    "Real workers: the decode worker that prefilled a system prompt reports its blocks, and the next request follows."
    system, greedy = list(range(100, 196)), SamplingParams(max_tokens=3, temperature=0)
    want = LLM("tiny-dense", dtype="float32").generate([system + [11, 12, 13]], greedy)[0].token_ids
    router = DisaggRouter("tiny-dense", 0, 2, worker_args=["--dtype", "float32"])
    try:
        router.add_request(list(range(500, 540)), greedy)                      # decode-0 (a tie: the lower index)
        b = router.add_request(system + [7, 8], greedy)                         # decode-1 (the lighter)
        holder = router.requests[b].decode
        drain(router)
        assert holder.name == "inferlab-decode-1" and len(holder.hashes) >= 6    # its report's stored events
        c = router.add_request(system + [11, 12, 13], greedy)
        assert router.requests[c].decode is holder
        done = drain(router)
        s = router.stats()
        assert done[c].token_ids == want and s["router_prefix_hit_tokens"] == 96
        assert s["prefix_hit_tokens"] == 96                                     # the worker did reuse them
    finally:
        router.shutdown()

def test_a_silent_remote_worker_is_dropped_and_its_requests_move():
    "A registered worker (no process of the router's) that sends nothing for SILENCE_S is gone: a dead host sends no EOF."
    from inferlab.serve.registry import SILENCE_S, Worker
    r = _bare_router(num_decode=1)
    remote = Worker("edge-decode", None, _Conn(), pool=_report(events=False)["pool"], role="decode", address="10.0.0.9")
    r.workers.append(remote)
    rids = [r.add_request(list(range(1, 20)), SamplingParams(max_tokens=4)) for _ in range(2)]   # one on each
    moved = [rid for rid in rids if r.requests[rid].decode is remote]
    assert len(moved) == 1
    remote.pool |= dict(query=50, hits=32)                         # its prefix cache's counters so far
    before = r.stats()["prefix_query_tokens"], r.stats()["prefix_hit_tokens"]
    remote.last_seen -= SILENCE_S + 1
    r._reap()                                                      # what each step does first: no message ever comes
    assert not remote.alive and remote not in r.workers                # unlisted: restarts cannot grow the table
    assert r.requests[moved[0]].decode is r.workers[0] and r.stats()["rerouted"] == 1
    assert r.stats()["worker_departures"] == {"silent": 1} and r.stats()["workers_decode"] == 1
    assert (r.stats()["prefix_query_tokens"], r.stats()["prefix_hit_tokens"]) == before   # counters never go back
