"""Rejection sampling is exact for whole blocks, not only for the first token: the first 4 tokens of speculative
decoding with k = 3 drafts per verification (so a block that keeps every draft ends with the bonus token), on a toy
target over a 3-token vocabulary whose next-token distribution depends on the whole prefix, follow the target's
chain rule p(x1) p(x2|x1) p(x3|x1,x2) p(x4|x1..x3): chi-square over the 81 outputs at alpha = 0.001, for sampled
and point-mass drafts. Two off-by-one verifiers (the bonus from the last draft's row; every draft tested against
q_1) are rejected."""
import itertools, math
import pytest
import torch
from inferlab.model.sampling import chi2_quantile, chi2_statistic
from inferlab.spec_decode.rejection import rejection_sample

V, K, N_TOK, RUNS, ALPHA = 3, 3, 4, 20_000, 0.001

def prefix_logits(seed: int, scale: float):
    "Next-token logits [V] for every prefix, from a generator seeded by the prefix itself."
    cache = {}
    def logits(prefix):
        key = tuple(prefix)
        if key not in cache:
            code = sum((t + 1) * (V + 1) ** i for i, t in enumerate(key))
            cache[key] = scale * torch.randn(V, generator=torch.Generator().manual_seed(seed * 10**6 + code))
        return cache[key]
    return logits

TARGET, NOISE = prefix_logits(1, 1.5), prefix_logits(2, 1.0)
p_of = lambda prefix: TARGET(prefix).softmax(-1)
q_of = lambda prefix: (TARGET(prefix) + NOISE(prefix)).softmax(-1)
SEQS = list(itertools.product(range(V), repeat=N_TOK))
EXACT = torch.tensor([math.prod(p_of(s[:i])[s[i]].item() for i in range(N_TOK)) for s in SEQS], dtype=torch.float64)

def speculate(verify, g, point_mass):
    "The first N_TOK tokens, and the number of tokens the first verification emitted."
    out, first = [], None
    while len(out) < N_TOK:
        drafts, qs = [], []
        for _ in range(K):
            q = q_of(out + drafts)
            drafts.append(int(q.argmax()) if point_mass else int(torch.multinomial(q, 1, generator=g)))
            qs.append(q)
        P = torch.stack([p_of(out + drafts[:i]) for i in range(K + 1)])          # [K+1, V]
        emitted = verify(P, drafts, None if point_mass else torch.stack(qs), g)
        first = len(emitted) if first is None else first
        out += emitted
    return tuple(out[:N_TOK]), first

def joint_test(verify, point_mass, runs=RUNS, seed=0):
    "(chi-square statistic / limit at ALPHA, share of first verifications that kept every draft)."
    g, counts, full = torch.Generator().manual_seed(seed), torch.zeros(len(SEQS), dtype=torch.float64), 0
    for _ in range(runs):
        s, first = speculate(verify, g, point_mass)
        counts[SEQS.index(s)] += 1; full += first == K + 1
    rare = EXACT * runs < 5                                                        # pooled: expected < 5
    stat, dof = chi2_statistic(torch.cat([counts[~rare], counts[rare].sum()[None]]),
                               torch.cat([EXACT[~rare], EXACT[rare].sum()[None]]))
    return stat / chi2_quantile(1 - ALPHA, dof), full / runs

def test_exact_chain():
    assert abs(EXACT.sum().item() - 1) < 1e-6 and len(SEQS) == 81

@pytest.mark.parametrize("point_mass", [False, True], ids=["sampled drafts", "point-mass drafts"])
def test_joint_distribution_with_bonus(point_mass):
    ratio, full = joint_test(rejection_sample, point_mass)
    assert full > 0.1, "the bonus path must run: some blocks keep all K drafts"
    assert ratio < 1, f"chi-square / limit = {ratio:.2f}: the 4-token joint is not the target's"

def bonus_from_last_draft_row(P, drafts, q, g):
    return rejection_sample(torch.cat([P[:-1], P[-2:-1]]), drafts, q, g)

def first_q_for_every_draft(P, drafts, q, g):
    return rejection_sample(P, drafts, q[:1].expand(len(drafts), -1), g)

@pytest.mark.parametrize("verify", [bonus_from_last_draft_row, first_q_for_every_draft], ids=lambda f: f.__name__)
def test_biased_verifier_is_rejected(verify):
    ratio, _ = joint_test(verify, point_mass=False, runs=10_000)
    assert ratio > 1, f"{verify.__name__} passed the joint test (chi-square / limit {ratio:.2f})"
