"""Speculation is lossless in distribution: for each method, the first 3 tokens of 12,000 seeded runs of a fixed
prompt follow the target's exact marginals (enumerated over every prefix: a small vocabulary makes that 24 x 24
forward rows), as the plain engine's do: chi-square per position at alpha = 0.001, against the exact distribution and
against the plain engine's counts. The same test rejects a deliberately biased verifier (one that accepts every draft):
at 12,000 runs its worst-position statistic is 90-2800x the limit, at 1,500 runs still 10-350x, so 1,500 runs do."""
import pytest
import torch
from inferlab.model.config import ModelConfig
from inferlab.model.sampling import SamplingParams, chi2_quantile, probs_from_logits
from inferlab.engine.llm_engine import LLMEngine, EngineConfig
from inferlab.spec_decode.spec_decoder import SpecDecoder, SpeculativeConfig
from inferlab.spec_decode.proposers import NgramProposer
from inferlab.spec_decode.proposers import DraftModelProposer, RestProposer, TokenDatastore
from inferlab.spec_decode.medusa import MedusaHeads, MedusaProposer
from inferlab.spec_decode.suffix import SuffixProposer
from inferlab.spec_decode.eagle3 import Eagle3Drafter, Eagle3Proposer
from inferlab.spec_decode.dflash import DFlashDrafter, DFlashProposer
from inferlab.model.random_weights import random_model

RUNS, POSITIONS, ALPHA = 12_000, 3, 0.001
BIASED_RUNS = 1_500                     # the negative control's bias is gross: a few runs show it
CFG = ModelConfig(vocab_size=24, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                  num_key_value_heads=1, head_dim=16, max_position_embeddings=64)
SETTINGS = {"T=1.0": dict(temperature=1.0), "T=0.7, top-p 0.9": dict(temperature=0.7, top_p=0.9)}
ENGINE = EngineConfig(max_num_seqs=1024, max_num_batched_tokens=16384, num_kv_blocks=2200, block_size=16)

def sharpened(seed, scale):
    "A random model whose next-token distributions are peaked enough to tell samplers apart."
    m = random_model(CFG, seed)
    with torch.no_grad(): m.lm_head.weight.mul_(scale)
    return m

@pytest.fixture(scope="module")
def target(): return sharpened(0, 12.0)

_PROMPTS = {}
def prompt_of(target):
    "The target's own greedy continuation of every token once: prompt lookup then proposes what the target favours."
    from inferlab.model.generate import generate
    if id(target) not in _PROMPTS:
        start = list(range(CFG.vocab_size))
        _PROMPTS[id(target)] = start + generate(target, None, start, SamplingParams(temperature=0, max_tokens=24, ignore_eos=True))[0].token_ids
    return _PROMPTS[id(target)]

@pytest.fixture(scope="module")
def prompt(target): return prompt_of(target)

def first_tokens(engine, prompt, params, seed0, runs=RUNS):
    "Counts [POSITIONS, vocab] of the first tokens over `runs` seeded requests."
    for i in range(runs): engine.add_request(prompt, SamplingParams(**params, seed=seed0 + i, max_tokens=POSITIONS + 1, ignore_eos=True))
    counts = torch.zeros(POSITIONS, CFG.vocab_size)
    while engine.has_unfinished():
        for o in engine.step():
            if o.finished:
                for j, t in enumerate(o.token_ids[:POSITIONS]): counts[j, t] += 1
    return counts

@torch.no_grad()
def exact_marginals(target, prompt, params) -> torch.Tensor:
    "[POSITIONS, vocab]: the exact distribution of each of the first 3 tokens, summed over every possible prefix."
    V, sp = CFG.vocab_size, SamplingParams(**params)
    def nxt(prefixes):                                   # [N, L] -> [N, V] next-token probabilities as the request samples
        h = target.hidden_states(torch.tensor(prefixes))[:, -1]
        return probs_from_logits(target.lm_head(h).float(), sp)
    p1 = nxt([prompt])[0]                                                        # [V]
    p2 = nxt([prompt + [a] for a in range(V)])                                   # [V, V]: p(t2 | t1 = a)
    p3 = nxt([prompt + [a, b] for a in range(V) for b in range(V)]).view(V, V, V)   # p(t3 | t1, t2)
    return torch.stack([p1, p1 @ p2, (p1[:, None, None] * p2[:, :, None] * p3).sum((0, 1))]).double()

def goodness_of_fit(counts: torch.Tensor, probs: torch.Tensor) -> tuple[float, int]:
    "Pearson's statistic against exact `probs`; categories expecting fewer than 5 are pooled. inf if an impossible token came."
    if counts[probs == 0].sum() > 0: return float("inf"), 1
    n, keep = counts.sum(), probs * counts.sum() >= 5
    obs = torch.cat([counts[keep].double(), counts[~keep].sum()[None].double()])
    exp = torch.cat([probs[keep] * n, (probs[~keep].sum() * n)[None]])
    obs, exp = obs[exp > 0], exp[exp > 0]
    return float(((obs - exp) ** 2 / exp).sum()), len(exp) - 1

def homogeneity(a: torch.Tensor, b: torch.Tensor) -> tuple[float, int]:
    "Two-sample chi-square statistic and degrees of freedom; categories with fewer than 10 joint counts are pooled."
    keep = (a + b) >= 10
    rows = torch.stack([torch.cat([a[keep], a[~keep].sum()[None]]), torch.cat([b[keep], b[~keep].sum()[None]])])
    rows = rows[:, rows.sum(0) > 0]
    expected = rows.sum(1, keepdim=True) * rows.sum(0, keepdim=True) / rows.sum()
    return float(((rows - expected) ** 2 / expected).sum()), rows.shape[1] - 1

def proposer(method, target):
    if method == "draft_model": return DraftModelProposer(sharpened(1, 6.0), num_blocks=2200, block_size=16)
    if method == "medusa":
        heads = MedusaHeads.for_target(target, 2)
        with torch.no_grad():
            heads.weight.normal_(0, 0.3, generator=torch.Generator().manual_seed(2)); heads.bias.normal_(0, 0.3)
        return MedusaProposer(heads)
    if method == "rest":                                    # a datastore of what the target favours: its greedy text
        from inferlab.model.generate import generate        # after every pair of tokens, so every context matches
        sp, V = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True), CFG.vocab_size
        text = [t for a in range(V) for b in range(V) for t in [a, b] + generate(target, None, [a, b], sp)[0].token_ids]
        return RestProposer(TokenDatastore(text), prompt_lookup_min=4, prompt_lookup_max=6, min_occurrences=1)
    if method == "suffix": return SuffixProposer()          # its global index learns from every run before
    if method in ("eagle3", "dflash"):                      # random weights: drafts the target sometimes accepts
        dr = (Eagle3Drafter.for_target(target, (0, 1)) if method == "eagle3" else
              DFlashDrafter.for_target(target, (0, 1), block_size=2))
        g = torch.Generator().manual_seed(3)
        with torch.no_grad():
            for p in dr.parameters(): p.copy_(torch.randn(p.shape, generator=g) * 0.3 + (1 if p.dim() == 1 else 0))
        return (Eagle3Proposer if method == "eagle3" else DFlashProposer)(dr)
    return None                                             # ngram: built from the configuration

@pytest.fixture(scope="module")
def exact(target, prompt): return {name: exact_marginals(target, prompt, p) for name, p in SETTINGS.items()}

@pytest.fixture(scope="module")
def plain(target, prompt, exact):
    out = {name: first_tokens(LLMEngine(target, None, ENGINE), prompt, params, 0) for name, params in SETTINGS.items()}
    for name in SETTINGS: assert worst(out[name], exact[name])[0] < 1, f"the plain engine itself is off ({name})"
    return out

def spec_engine(method, target, decoder_cls=SpecDecoder):
    # max_tokens = 4: token 1 comes from the prefill, tokens 2-3 (and a bonus 4th) from verifying 2 drafts
    spec = {"method": method, "num_speculative_tokens": 2}
    if method == "ngram": spec.update(prompt_lookup_min=1, prompt_lookup_max=3)
    eng = LLMEngine(target, None, ENGINE)
    config = SpeculativeConfig.from_dict(spec)
    prop = proposer(method, target) or NgramProposer(config.prompt_lookup_min, config.prompt_lookup_max)
    eng.speculator = decoder_cls(config, prop)
    return eng

def worst(counts, exact, test=goodness_of_fit):
    "The largest statistic / limit over positions, with the per-position (statistic, dof, limit)."
    figs = []
    for j in range(POSITIONS):
        stat, dof = test(counts[j], exact[j])
        figs.append((stat, dof, chi2_quantile(1 - ALPHA, dof)))
    return max(s / lim for s, _, lim in figs), figs

fmt = lambda figs: "; ".join(f"pos {j + 1}: {st:.1f} (dof {d}, limit {lim:.1f})" for j, (st, d, lim) in enumerate(figs))

METHODS = ("ngram", "draft_model", "medusa", "rest", "suffix", "eagle3", "dflash")
CASES = [(m, s) for m in METHODS for s in SETTINGS]

@pytest.mark.parametrize("method,setting", CASES)
def test_same_distribution(method, setting, target, exact, plain):
    eng = spec_engine(method, target)
    counts = first_tokens(eng, prompt_of(target), SETTINGS[setting], 1_000_000)
    ratio, figs = worst(counts, exact[setting])
    vs_plain, figs_plain = worst(counts, plain[setting], homogeneity)
    s = eng.stats()
    print(f"\n{method}, {setting}: acceptance {s['acceptance_rate']:.0%} of {s['num_draft_tokens']} drafts\n"
          f"  chi2 vs exact: {fmt(figs)}\n  chi2 vs plain engine (two-sample): {fmt(figs_plain)}")
    assert s["num_draft_tokens"] > RUNS and 0.05 < s["acceptance_rate"] < 0.95   # both routes (accept, reject) ran
    assert ratio < 1, f"{method} {setting}: the speculative distribution differs from the target's"
    eng.check_idle()

class AcceptEverything(SpecDecoder):
    "The negative control: a verifier that trusts the draft (emits every draft, then a target sample)."
    def _verify(self, logits, groups, constraints=None):
        from inferlab.model.sampling import sample
        out = []
        for seq, r0, n in groups:
            out.append(list(seq.draft_token_ids) + [sample(logits[r0 + n - 1], seq.params, seq.generator)])
        return out

@pytest.mark.parametrize("method", METHODS)
def test_biased_verifier_is_rejected(method, target, exact):
    counts = first_tokens(spec_engine(method, target, AcceptEverything), prompt_of(target), SETTINGS["T=1.0"], 1_000_000,
                          BIASED_RUNS)
    ratio, figs = worst(counts, exact["T=1.0"])
    print(f"\naccept-everything with {method}: chi2 vs exact: {fmt(figs)}")
    assert ratio > 1
