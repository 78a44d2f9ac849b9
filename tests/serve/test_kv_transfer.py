"KV transfer: adopt continues a prefill exactly; a payload that does not fit is refused with the engine untouched."
import pytest, torch
from inferlab.llm import build_engine
from inferlab.model.sampling import SamplingParams
from inferlab.serve.kv_transfer import prefill_engine, prefill, adopt, KVPayload

GREEDY = SamplingParams(max_tokens=10, temperature=0)

def run(engine):
    done = {}
    while engine.has_unfinished():
        for o in engine.step():
            if o.finished: done[o.request_id] = o
    return done

@pytest.fixture(scope="module")
def engines():
    return prefill_engine("tiny-dense", dtype="float32"), build_engine("tiny-dense", dtype="float32")

def test_adopt_equals_one_engine_and_counts_the_prefix_cache(engines):
    pe, de = engines
    ps = [list(range(1, 70)), list(range(1, 70)) + [5, 6, 7]]          # the second shares 4 full blocks
    want = [o.token_ids for o in run_ref(ps)]
    hits0 = de.block_manager.hit_tokens
    payloads = prefill(pe, ps, GREEDY)
    rids = [adopt(de, payloads[0], GREEDY)]
    done = run(de)
    rids.append(adopt(de, payloads[1], GREEDY))                         # the first prompt's blocks are cached now
    done |= run(de)
    assert [done[r].token_ids for r in rids] == want
    assert de.block_manager.hit_tokens - hits0 == 64                    # 4 blocks of 16 shared, not rewritten
    assert de.block_manager.num_free_blocks == de.block_manager.num_blocks and not de.requests

def run_ref(ps):
    e = build_engine("tiny-dense", dtype="float32", enable_prefix_caching=False)
    rids = [e.add_request(p, GREEDY) for p in ps]
    done = run(e)
    return [done[r] for r in rids]

def test_a_payload_that_does_not_fit_is_refused(engines):
    pe, de = engines
    [p] = prefill(pe, [list(range(1, 40))], GREEDY)
    free = de.block_manager.num_free_blocks
    bad = [KVPayload(p.kv.to(torch.float16), None, p.prompt_token_ids, p.first_token),     # wrong dtype
           KVPayload(p.kv[:, :, :1], None, p.prompt_token_ids, p.first_token),             # too few blocks
           KVPayload(p.kv[:, :, :, :, :2], None, p.prompt_token_ids, p.first_token)]       # wrong head count
    for b, match in zip(bad, ["dtype", "blocks for a", "shape"]):
        with pytest.raises(ValueError, match=match): adopt(de, b, GREEDY)
        assert de.block_manager.num_free_blocks == free and not de.requests and not de.scheduler.running
    with pytest.raises(ValueError, match="logprobs"): adopt(de, p, SamplingParams(logprobs=2))
    assert not de.has_unfinished()

def test_kv_arriving_at_a_full_decode_worker_waits_for_room(engines):
    "A decode worker whose pool is busy keeps an arriving payload until running requests free blocks, then adopts it."
    from inferlab.serve.disagg import _adopt_waiting
    pe, _ = engines
    de = build_engine("tiny-dense", dtype="float32", num_kv_blocks=12)
    prompt = list(range(1, 120))                                            # 8 blocks: both do not fit at once
    [payload] = prefill(pe, [prompt], GREEDY)
    busy = de.add_request(list(range(200, 300)), SamplingParams(max_tokens=20, temperature=0))
    de.step()                                                               # the neighbour holds 8 of 12 blocks
    waiting = [(dict(rid="late", params=GREEDY.__dict__), payload, 0.0)]   # (message, payload, seconds it took)
    assert _adopt_waiting(de, waiting) == [] and len(waiting) == 1          # no room yet: it waits, no error
    done = {}
    while de.has_unfinished():
        done |= {o.request_id: o for o in de.step() if o.finished}
        if busy in done and waiting: replies = _adopt_waiting(de, waiting)
    assert not waiting and "adopted" in replies[0] and done["late"].token_ids == run_ref([prompt])[0].token_ids
    de.check_idle()

def test_a_prefill_worker_that_loses_its_router_unlinks_the_kv_nobody_adopted(engines):
    "Segments are reclaimed after their lease while the worker runs, and at once when its router goes away."
    import threading
    from multiprocessing import Pipe, shared_memory
    from inferlab.serve.disagg import params_dict, prefill_loop, recv, send
    pe, _ = engines
    router_end, worker_end = Pipe()
    def serve():
        try: prefill_loop(pe, worker_end)
        except (EOFError, OSError): pass                                       # the router is gone
    t = threading.Thread(target=serve); t.start()
    send(router_end, dict(op="prefill", rid="r", prompt=list(range(1, 40)), params=params_dict(GREEDY)))
    kv = recv(router_end)
    shared_memory.SharedMemory(name=kv["shm"]).close()                         # there, waiting for an adopter
    router_end.close(); t.join(10)
    assert not t.is_alive()
    with pytest.raises(FileNotFoundError): shared_memory.SharedMemory(name=kv["shm"])
