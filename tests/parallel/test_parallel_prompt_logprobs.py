"Prompt logprobs through the parallel runners: tensor parallel and attention data parallel give the single process's."
import pytest
from parallel_helpers import prompts
from inferlab.llm import LLM
from inferlab.model.sampling import SamplingParams

PARAMS = SamplingParams(prompt_logprobs=3, max_tokens=4, temperature=0, ignore_eos=True)

@pytest.fixture(scope="module")
def single():
    ps = prompts(12, seed=3)
    return ps, LLM("tiny-dense", dtype="float32", max_num_batched_tokens=48).generate(ps, PARAMS)

@pytest.mark.parametrize("kw", [dict(tensor_parallel_size=2), dict(data_parallel_size=2)], ids=["tp2", "dp2"])
def test_parallel_prompt_logprobs_equal_single_process(single, kw, no_stray_processes):
    ps, want = single
    with LLM("tiny-dense", dtype="float32", max_num_batched_tokens=48, **kw) as llm: got = llm.generate(ps, PARAMS)
    assert all(o.error is None for o in got) and [o.token_ids for o in got] == [o.token_ids for o in want]
    assert [len(o.prompt_logprobs) for o in got] == [len(p) for p in ps]
    err = max(abs(a - b) for g, w in zip(got, want) for a, b in zip(g.prompt_logprobs[1:], w.prompt_logprobs[1:]))
    print(f"\n{kw}: max |prompt logprob difference| from one process {err:.1e}")
    assert err < 1e-4
