"""The stack composes: quantization × KV dtype × speculation × (one process, TP=2, DP=2), and EP=2 with fp8 on
tiny-moe, give the greedy tokens of the one-process engine with the same quantization and KV dtype (speculation is
lossless, so its reference has none). `make test-slow` runs the whole matrix and prints it; `make test` a cover of
it in which every level of every factor appears beside parallelism. One engine runs each speculation method in turn,
so the prefix cache is off: with an 8-bit KV cache a prompt served from cached (quantized) blocks attends to other
values than one prefilled whole, which would compare the cache, not the combination (tested on its own in tests/engine)."""
import itertools
import pytest
from inferlab.llm import LLM
from inferlab.model.config import data_dir
from inferlab.model.sampling import SamplingParams
from inferlab.quant.linear import use_cpu_a16_kernels
from inferlab.spec_decode.spec_decoder import add_speculation

GREEDY = SamplingParams(max_tokens=16, temperature=0)
QUANT, KV, SPEC = (None, "fp8", "w4a16"), (None, "fp8"), (None, "ngram", "draft_model", "suffix")
PAR = {"1 process": {}, "TP=2": dict(tensor_parallel_size=2), "DP=2": dict(data_parallel_size=2)}

@pytest.fixture(scope="module")
def prompts():
    "16 prompts cut from held-out code, 20-200 characters (real text: n-gram drafts find matches)."
    text = (data_dir() / "corpus" / "valid.txt").read_text()
    return [text[i * 997:i * 997 + 20 + (i * 53) % 180] for i in range(16)]

_REF = {}
def reference(model, quant, kv, prompts, exact: bool = False):
    """The one-process engine's tokens with this quantization and KV dtype, no speculation (computed once). `exact`:
    with float32 decode rows kept in float32, as a tensor-parallel rank keeps them (chapter 26: w8a16 and w4a16 run
    them in bf16 in one process, and a row-parallel layer's bf16 partial sums would round differently)."""
    key = (model, quant, kv, exact)
    if key not in _REF:
        with LLM(model, dtype="float32", quantization=quant, kv_cache_dtype=kv, enable_prefix_caching=False) as llm:
            if exact: use_cpu_a16_kernels(llm.engine.runner.model, None)
            _REF[key] = [o.token_ids for o in llm.generate(prompts, GREEDY)]
    return _REF[key]

def speculate(engine, method):
    "Give a built engine the speculator `method` names (None: take it away) — on every replica of a DP engine."
    for e in getattr(engine, "replicas", [engine]):
        if method is None: e.speculator = None
        else: add_speculation(e, {"method": method, "num_speculative_tokens": 3})

def run_cell(llm, method, prompts):
    speculate(llm.engine, method)
    outs = llm.generate(prompts, GREEDY)
    assert all(o.error is None for o in outs), [o.error for o in outs if o.error][:1]
    return [o.token_ids for o in outs]

def check(model, quant, kv, methods, par, prompts) -> dict:
    "Equal (True/False) per speculation method, on one launch of the engine."
    par = PAR[par] if isinstance(par, str) else par
    want, got = reference(model, quant, kv, prompts, exact=par.get("tensor_parallel_size", 1) > 1), {}
    with LLM(model, dtype="float32", quantization=quant, kv_cache_dtype=kv, enable_prefix_caching=False, **par) as llm:
        for m in methods: got[m] = run_cell(llm, m, prompts) == want
    return got

COVER = [("fp8", "fp8", ("ngram",), "TP=2"), ("w4a16", None, ("draft_model",), "TP=2"),
         (None, "fp8", ("draft_model",), "DP=2"), ("w4a16", "fp8", (None, "ngram", "suffix"), "DP=2")]

@pytest.mark.parametrize("quant,kv,methods,par", COVER, ids=["-".join(map(str, c[:2])) + f"-{c[3]}" for c in COVER])
def test_a_cover_of_the_matrix(quant, kv, methods, par, prompts, no_stray_processes):
    got = check("tiny-dense", quant, kv, methods, par, prompts)
    assert all(got.values()), got

def test_expert_parallel_with_fp8(prompts, no_stray_processes):
    got = check("tiny-moe", "fp8", None, (None,), dict(tensor_parallel_size=2, enable_expert_parallel=True), prompts)
    assert got[None]

@pytest.mark.slow
def test_the_whole_matrix(prompts, no_stray_processes):
    rows = []
    for quant, kv, par in itertools.product(QUANT, KV, PAR):
        got = check("tiny-dense", quant, kv, SPEC, par, prompts)
        rows += [(quant, kv, m, par, ok) for m, ok in got.items()]
    for par in ("TP=2 + EP", "DP=2 + EP"):
        kw = dict(tensor_parallel_size=2) if par.startswith("TP") else dict(data_parallel_size=2)
        got = check("tiny-moe", "fp8", None, SPEC, dict(kw, enable_expert_parallel=True), prompts)
        rows += [("fp8 (tiny-moe)", None, m, par, ok) for m, ok in got.items()]
    print(f"\n{'quantization':16} {'KV':5} {'speculation':12} {'parallelism':11} greedy tokens = one process ({len(prompts)} prompts)")
    for quant, kv, m, par, ok in rows:
        print(f"{str(quant):16} {str(kv):5} {str(m):12} {par:11} {'equal' if ok else 'DIFFER'}")
    assert len(rows) == 3 * 2 * 3 * 4 + 8 and all(r[-1] for r in rows)
