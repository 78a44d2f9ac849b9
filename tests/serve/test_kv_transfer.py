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
