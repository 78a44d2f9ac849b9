"""Structured outputs and the logits processors inside the engine step: constrained replies validate, plain requests
beside them are unchanged token for token (with speculation on), a schema that cannot compile is refused alone,
`min_tokens` holds, penalties equal the reference generate, and no KV block leaks."""
import json, re
import jsonschema, pytest, torch
from inferlab.model.model import load_model
from inferlab.model.tokenizer import load_tokenizer
from inferlab.model.generate import generate_one
from inferlab.model.sampling import SamplingParams
from inferlab.engine.llm_engine import LLMEngine, EngineConfig
from inferlab.spec_decode.spec_decoder import add_speculation

PERSON = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 10},
          "age": {"type": "integer", "minimum": 0, "maximum": 99}}, "required": ["name", "age"]}

@pytest.fixture(scope="module")
def model(): return load_model(dtype=torch.float32)

@pytest.fixture(scope="module")
def tok(): return load_tokenizer()

def engine(model, tok, spec=None, **kw):
    e = LLMEngine(model, tok, EngineConfig(**{"num_kv_blocks": 256, "max_num_seqs": 16, **kw}))
    return add_speculation(e, spec) if spec else e

def run(eng, prompts, params) -> dict:
    ids = [eng.add_request(p, sp) for p, sp in zip(prompts, params)]
    done = {}
    while eng.has_unfinished():
        for o in eng.step():
            if o.finished: done[o.request_id] = o
    return [done[i] for i in ids]

PROMPTS = ["def fibonacci(n):", "import os\n\ndef list_files(path):", "class Stack:\n    def __init__(self):",
           "# parse a config file\n", "x = [i * i for i in", "def main():\n    args = parse()\n"]

@pytest.mark.parametrize("spec", [None, {"method": "ngram", "num_speculative_tokens": 4}])
def test_mixed_batch_plain_unchanged(model, tok, spec):
    plain = [SamplingParams(temperature=0, max_tokens=40, ignore_eos=True) for _ in PROMPTS]
    alone = [o.token_ids for o in run(engine(model, tok, spec), PROMPTS, plain)]
    eng = engine(model, tok, spec)
    free0 = eng.block_manager.num_free_blocks
    shaped = [SamplingParams(temperature=t, seed=i, max_tokens=120, structured_outputs=dict(json=PERSON))
              for i, t in enumerate([0, 1.0, 0.7, 1.0, 0, 1.0])]
    regex = [SamplingParams(temperature=1.0, seed=i, max_tokens=40, structured_outputs=dict(regex=r"[a-z]{2,6}-\d{3}"))
             for i in range(3)]
    outs = run(eng, PROMPTS + PROMPTS + PROMPTS[:3], plain + shaped + regex)
    assert [o.token_ids for o in outs[:6]] == alone                  # plain neighbours: the same greedy tokens
    for o in outs[6:12]: jsonschema.validate(json.loads(o.text), PERSON)
    for o in outs[12:]: assert re.fullmatch(r"[a-z]{2,6}-\d{3}", o.text), o.text
    assert eng.block_manager.num_free_blocks == free0 and not eng.constraints.state     # no leaks, no state left

def test_bad_structure_refused_alone(model, tok):
    eng = engine(model, tok)
    rid = eng.add_request(PROMPTS[0], SamplingParams(temperature=0, max_tokens=8))
    for so, name in [(dict(regex="(unclosed"), "structured_outputs.regex"),
                     (dict(json={"type": "nope"}), "structured_outputs.json"),
                     (dict(grammar="root ::= undefined_rule"), "structured_outputs.grammar")]:
        with pytest.raises(ValueError, match=name): eng.add_request(PROMPTS[1], SamplingParams(structured_outputs=so))
    with pytest.raises(ValueError, match="logit_bias"): eng.add_request(PROMPTS[1], SamplingParams(logit_bias={10**6: 1}))
    assert list(eng.requests) == [rid] and not eng.constraints.state    # the refused ones left nothing behind
    outs = []
    while eng.has_unfinished(): outs += [o for o in eng.step() if o.finished]
    assert [(o.request_id, o.finish_reason, len(o.token_ids), o.error) for o in outs] == [(rid, "length", 8, None)]

def test_min_tokens_200_requests(model, tok):
    "At T = 1 with EOS masked until min_tokens: every one of 200 requests reaches it, though many would stop sooner."
    eng = engine(model, tok, max_num_seqs=32)
    prompts = [PROMPTS[i % len(PROMPTS)] + "\n" * (i % 3) for i in range(200)]
    free = run(eng, prompts, [SamplingParams(temperature=1.0, seed=i, max_tokens=48) for i in range(200)])
    early = sum(len(o.token_ids) < 24 and o.finish_reason == "stop" for o in free)
    held = run(eng, prompts, [SamplingParams(temperature=1.0, seed=i, max_tokens=48, min_tokens=24) for i in range(200)])
    assert early >= 5, early                                # without it, some stop early: the test can fail
    assert all(len(o.token_ids) >= 24 for o in held)

def test_penalties_equal_reference(model, tok):
    "Greedy with penalties, biases and bad words, in a batch with others: the reference generate's tokens."
    kinds = [dict(repetition_penalty=1.3), dict(frequency_penalty=0.8, presence_penalty=0.5),
             dict(logit_bias={int(tok.encode(" the")[0]): 5.0}), dict(bad_words=["self", " return"]),
             dict(repetition_penalty=0.8, presence_penalty=-1.0), {}]
    params = [SamplingParams(temperature=0, max_tokens=32, **k) for k in kinds]
    ref = [generate_one(model, tok, tok.encode(p), sp).token_ids for p, sp in zip(PROMPTS, params)]
    for spec in (None, {"method": "ngram", "num_speculative_tokens": 3}):
        assert [o.token_ids for o in run(engine(model, tok, spec), PROMPTS, params)] == ref
    assert ref[0] != run(engine(model, tok), PROMPTS[:1], [SamplingParams(temperature=0, max_tokens=32)])[0].token_ids

def test_complete_structure_ends_request(model, tok):
    "With ignore_eos the grammar still ends the request once its output is whole (the end-of-text token accepted)."
    eng = engine(model, tok)
    outs = run(eng, PROMPTS[:3], [SamplingParams(temperature=1.0, seed=i, max_tokens=50, ignore_eos=True,
                                                 structured_outputs=dict(choice=["yes", "no"])) for i in range(3)])
    assert all(o.text in ("yes", "no") and o.finish_reason == "stop" and len(o.token_ids) <= 4 for o in outs)
