"""Logits processors against definitions written elsewhere: transformers' processors (repetition penalty, bad words,
min new tokens) and OpenAI's published formula for frequency/presence penalties and logit_bias, on random logits and
random histories, several differently-constrained rows per batch. Every comparison is exact (`torch.equal`): each
side does the same IEEE float32 operations in the same order, so no rounding is forgiven."""
import numpy as np
import pytest, torch
from transformers.generation.logits_process import (RepetitionPenaltyLogitsProcessor, NoBadWordsLogitsProcessor,
                                                    MinNewTokensLengthLogitsProcessor)
from inferlab.model.logits_process import LogitsRow, apply_logits_processors, bad_words_token_ids, repeated_ngrams
from inferlab.model.sampling import SamplingParams
from inferlab.model.tokenizer import load_tokenizer

V = 97                       # a small vocabulary: repeats and bad-word matches are frequent

def _ids(g, n, hi=V // 3): return torch.randint(0, hi, (n,), generator=g).tolist()
def _u(g): return float(torch.rand((), generator=g))
def _n(g, lo, hi): return int(torch.randint(lo, hi, (), generator=g))

def hf_repetition(x, prompt, output, theta):
    return RepetitionPenaltyLogitsProcessor(theta)(torch.tensor([list(prompt) + list(output)], dtype=torch.long), x[None])[0]

def hf_bad_words(x, output, bad):
    return NoBadWordsLogitsProcessor([list(s) for s in bad])(torch.tensor([list(output)], dtype=torch.long), x[None])[0]

def hf_min_tokens(x, prompt, output, min_tokens, stop_ids):
    p = MinNewTokensLengthLogitsProcessor(len(prompt), min_tokens, sorted(stop_ids))
    return p(torch.tensor([list(prompt) + list(output)], dtype=torch.long), x[None])[0]

def openai(x, output, alpha_frequency, alpha_presence, bias):
    "OpenAI: mu[j] -> mu[j] - c[j] * alpha_frequency - float(c[j] > 0) * alpha_presence; logit_bias added (float32)."
    mu = x.numpy().copy()
    c = np.zeros(len(mu), dtype=np.int64)
    for t in output: c[t] += 1
    af, ap = np.float32(alpha_frequency), np.float32(alpha_presence)
    for j in range(len(mu)): mu[j] = mu[j] - np.float32(c[j]) * af - np.float32(c[j] > 0) * ap
    return torch.from_numpy(mu)

def add_bias(x, bias):
    mu = x.numpy().copy()
    for t, b in bias.items(): mu[t] = mu[t] + np.float32(b)
    return torch.from_numpy(mu)

def reference(x, r: LogitsRow):
    "vLLM V1's order, every step from the outside definitions."
    p = r.params
    if not p.constrained: return x
    if r.bad_words_ids: x = hf_bad_words(x, r.output_ids, r.bad_words_ids)
    if p.min_tokens and r.stop_ids: x = hf_min_tokens(x, r.prompt_ids, r.output_ids, p.min_tokens, r.stop_ids)
    if p.logit_bias: x = add_bias(x, p.logit_bias)
    if p.repetition_penalty != 1: x = hf_repetition(x, r.prompt_ids, r.output_ids, float(p.repetition_penalty))
    if p.frequency_penalty or p.presence_penalty: x = openai(x, r.output_ids, p.frequency_penalty, p.presence_penalty, {})
    return x

def _batch(g, make_row, rows=10):
    rs = [make_row(g) if _u(g) < 0.7 else LogitsRow(SamplingParams(), _ids(g, 4), _ids(g, 3)) for _ in range(rows)]
    return torch.randn(rows, V, generator=g) * 4, rs

def _check(x, rows):
    before = x.clone()
    y = apply_logits_processors(x, rows)
    assert torch.equal(x, before), "the input was modified"
    for i, r in enumerate(rows):
        assert torch.equal(y[i], reference(x[i], r)), (i, r)
        if not r.params.constrained: assert torch.equal(y[i], x[i])
    return y

def test_repetition_penalty_equals_transformers():
    g = torch.Generator().manual_seed(0)
    def row(g):
        theta = 0.2 + 2.8 * _u(g)
        return LogitsRow(SamplingParams(repetition_penalty=theta), _ids(g, _n(g, 0, 20)), _ids(g, _n(g, 0, 30)))
    changed = 0
    for _ in range(30):
        x, rows = _batch(g, row)
        changed += int((_check(x, rows) != x).sum())
    assert changed > 1000                              # the penalty really moved logits

def test_bad_words_equal_transformers():
    g = torch.Generator().manual_seed(1)
    def row(g):                                        # an alphabet of 4 tokens: multi-token matches happen
        bad = tuple(dict.fromkeys(tuple(_ids(g, _n(g, 1, 4), hi=4)) for _ in range(_n(g, 1, 5))))
        return LogitsRow(SamplingParams(bad_words=["x"]), _ids(g, 5), _ids(g, _n(g, 0, 8), hi=4), bad_words_ids=bad)
    multi = 0
    for _ in range(40):
        x, rows = _batch(g, row)
        y = _check(x, rows)
        for i, r in enumerate(rows):                   # count bans that needed a prefix match
            multi += sum(len(s) > 1 and bool(torch.isinf(y[i, s[-1]])) and not torch.isinf(x[i, s[-1]])
                         and (s[-1],) not in r.bad_words_ids for s in r.bad_words_ids)
    assert multi > 20

def test_min_tokens_equals_transformers():
    g = torch.Generator().manual_seed(2)
    def row(g):
        m = _n(g, 1, 8)
        return LogitsRow(SamplingParams(min_tokens=m, max_tokens=8), _ids(g, 6), _ids(g, _n(g, 0, 10)),
                         stop_ids=frozenset(_ids(g, _n(g, 1, 4), hi=V)))
    masked = 0
    for _ in range(30):
        x, rows = _batch(g, row)
        masked += int(torch.isinf(_check(x, rows)).sum())
    assert masked > 50

def test_openai_penalties_and_bias():
    g = torch.Generator().manual_seed(3)
    def row(g):
        kw = dict(frequency_penalty=4 * _u(g) - 2, presence_penalty=4 * _u(g) - 2)
        if _u(g) < 0.5: kw["logit_bias"] = {t: 200 * _u(g) - 100 for t in _ids(g, 3, hi=V)}
        return LogitsRow(SamplingParams(**kw), _ids(g, 5), _ids(g, _n(g, 0, 40)))
    for _ in range(30): _check(*_batch(g, row))

def test_everything_at_once_in_vllm_order():
    g = torch.Generator().manual_seed(4)
    def row(g):
        kw = dict(repetition_penalty=[1.0, 0.7, 1.3][_n(g, 0, 3)], frequency_penalty=[0.0, 0.5, -0.4][_n(g, 0, 3)],
                  presence_penalty=[0.0, 1.5][_n(g, 0, 2)], min_tokens=_n(g, 0, 6), max_tokens=8,
                  logit_bias={t: 50 * _u(g) - 25 for t in _ids(g, _n(g, 0, 3))} or None)
        bad = tuple(tuple(_ids(g, _n(g, 1, 3), hi=6)) for _ in range(_n(g, 0, 3)))
        if bad: kw["bad_words"] = ["x"]
        # speculation: row i of a request scores after the drafts before it, so outputs vary in length
        return LogitsRow(SamplingParams(**kw), _ids(g, 8), _ids(g, _n(g, 0, 12), hi=6), frozenset(_ids(g, 2, hi=V)), bad)
    for _ in range(30): _check(*_batch(g, row, rows=12))

def test_nothing_constrained_returns_the_input_itself():
    x = torch.randn(3, V)
    rows = [LogitsRow(SamplingParams(temperature=t), [1, 2], [3]) for t in (0, 0.7, 1.0)]
    assert apply_logits_processors(x, rows) is x
    with pytest.raises(ValueError, match="for 2 rows"): apply_logits_processors(x, rows[:2])

def test_out_of_vocabulary_bias_is_refused():
    with pytest.raises(ValueError, match=f"logit_bias: token id {V} is outside the vocabulary of {V} tokens"):
        apply_logits_processors(torch.zeros(1, V), [LogitsRow(SamplingParams(logit_bias={V: 1.0}), [1], [])])

def test_bad_words_token_ids_follow_vllm():
    tok = load_tokenizer()
    plain, spaced = tuple(tok.encode("None")), tuple(tok.encode(" None"))
    assert plain != spaced and bad_words_token_ids(tok, ["None"]) == (plain, spaced)
    assert bad_words_token_ids(tok, [" None", "None"]) == (plain, spaced)          # leading space stripped, deduped
    hello = tuple(tok.encode("hello"))
    assert len(tok.encode(" hello")) != len(hello) and bad_words_token_ids(tok, ["hello"]) == (hello,)
    assert bad_words_token_ids(tok, ["  "]) == ()

def test_repeated_ngrams():
    assert repeated_ngrams([1, 2, 3, 4] * 3) == 5 and repeated_ngrams([1, 2, 3]) == 0
