"The arithmetic of speculative decoding (chapter 30): tokens per pass, speedups, the best γ, α from TV, verify cost."
import math
import pytest
import torch
from inferlab.model.config import ModelConfig
from inferlab.model.random_weights import random_model
from inferlab.spec_decode.arithmetic import (expected_tokens, walltime_speedup, speedup_with_verify_cost, best_gamma,
                                      acceptance_from_tv, measure_verify_cost, verify_ratios)

ALPHAS = [i / 20 for i in range(20)] + [0.99, 0.999]


def test_expected_tokens_is_the_truncated_geometric_series():
    for a in ALPHAS:
        for g in range(12):
            assert expected_tokens(a, g) == pytest.approx(math.fsum(a ** i for i in range(g + 1)), rel=1e-12)
    assert expected_tokens(0.8, 4) == pytest.approx(3.3616)


def test_expected_tokens_identities_and_limits():
    assert all(expected_tokens(a, 0) == 1 for a in ALPHAS + [1])           # no drafts: plain decoding
    assert all(expected_tokens(0, g) == 1 for g in range(20))              # every draft rejected: still one token
    assert expected_tokens(1, 5) == 6                                      # α = 1: the limit γ + 1
    assert expected_tokens(1 - 1e-9, 5) == pytest.approx(6, rel=1e-6)      # ... and the closed form approaches it
    for g in (1, 4, 9):
        vals = [expected_tokens(a, g) for a in ALPHAS]
        assert vals == sorted(vals) and len(set(vals)) == len(vals)         # strictly increasing in α
        assert all(1 <= v <= g + 1 for v in vals)
    assert all(expected_tokens(0.7, g) < expected_tokens(0.7, g + 1) < 1 / 0.3 for g in range(40))   # the ceiling


def test_expected_tokens_matches_a_simulation():
    g = torch.Generator().manual_seed(1)
    a, gam, n = 0.6, 4, 100_000
    tokens = (torch.rand(n, gam, generator=g) < a).int().cumprod(1).sum(1) + 1
    se = tokens.double().std().item() / n ** 0.5
    assert abs(tokens.double().mean().item() - expected_tokens(a, gam)) < 4 * se


def test_speedup_formulas():
    assert all(walltime_speedup(a, 0, c) == 1 for a in ALPHAS for c in (0, 0.1, 3))        # γ = 0: 1/(0·c + 1)
    assert walltime_speedup(0.8, 4, 0) == expected_tokens(0.8, 4)
    assert walltime_speedup(0.8, 4, 0.25) == pytest.approx((1 - 0.8 ** 5) / (0.2 * 2))      # Leviathan et al.
    for a in ALPHAS:
        for g in range(6):
            assert speedup_with_verify_cost(a, g, 0.1, 1.0) == walltime_speedup(a, g, 0.1)   # ideal v = 1
            assert speedup_with_verify_cost(a, g, 0.1, 2.0) < walltime_speedup(a, g, 0.1)
    assert all((walltime_speedup(a, 1, c) > 1) == (a > c) for a in ALPHAS for c in (0.05, 0.3, 0.6))  # one draft
    v = {0: 1.0, 1: 1.5, 2: 1.6}
    assert speedup_with_verify_cost(0.8, 2, 0.1, v) == pytest.approx(expected_tokens(0.8, 2) / 1.8)
    assert speedup_with_verify_cost(0.8, 2, 0.1, lambda g: 1 + 0.3 * g) == pytest.approx(expected_tokens(0.8, 2) / 1.8)
    assert speedup_with_verify_cost(0.8, 0, 0.1, {1: 1.5}) == 1          # v(0) = 1 by definition


@pytest.mark.parametrize("verify_cost", [None, 1.0, {k: 1 + 0.2 * k for k in range(9)}, {0: 1.0, 1: 3.0, 2: 3.1, 4: 3.3},
                                         lambda g: 1 + 0.05 * g * g])
def test_best_gamma_matches_brute_force(verify_cost):
    def speed(a, g, c):
        return walltime_speedup(a, g, c) if verify_cost is None else speedup_with_verify_cost(a, g, c, verify_cost)
    for a in ALPHAS[::3] + [0.95]:
        for c in (0, 0.02, 0.1, 0.3, 1.0):
            gs = [g for g in range(9) if not isinstance(verify_cost, dict) or g == 0 or g in verify_cost]
            best = max(speed(a, g, c) for g in gs)
            expect = min(g for g in gs if speed(a, g, c) == best)        # the smallest γ on a tie
            assert best_gamma(a, c, max_gamma=8, verify_cost=verify_cost) == expect


def test_best_gamma_edges():
    assert best_gamma(0, 0.1) == 0                        # drafts never accepted: never speculate
    assert best_gamma(0, 0) == 0                          # all tie at speedup 1: the smallest γ
    assert best_gamma(1, 0, max_gamma=11) == 11           # a perfect free proposer: as long as allowed
    assert best_gamma(0.9, 0.05, max_gamma=0) == 0
    assert best_gamma(0.9, 0.05, verify_cost={0: 1.0, 1: 5.0, 2: 5.0}) == 0   # a verify too dear to pay


@pytest.mark.parametrize("call, name", [
    (lambda: expected_tokens(-0.1, 3), "alpha"), (lambda: expected_tokens(1.01, 3), "alpha"),
    (lambda: expected_tokens(float("nan"), 3), "alpha"), (lambda: expected_tokens(True, 3), "alpha"),
    (lambda: expected_tokens("0.5", 3), "alpha"), (lambda: expected_tokens(0.5, -1), "gamma"),
    (lambda: expected_tokens(0.5, 2.0), "gamma"), (lambda: expected_tokens(0.5, True), "gamma"),
    (lambda: walltime_speedup(0.5, 2, -0.1), "c"), (lambda: walltime_speedup(0.5, 2, float("inf")), "c"),
    (lambda: speedup_with_verify_cost(0.5, 2, 0.1, 0), "verify_cost"),
    (lambda: speedup_with_verify_cost(0.5, 2, 0.1, {1: 1.2}), "verify_cost"),
    (lambda: speedup_with_verify_cost(0.5, 2, 0.1, lambda g: -1), "verify_cost"),
    (lambda: best_gamma(0.5, 0.1, max_gamma=-2), "max_gamma"), (lambda: best_gamma(1.5, 0.1), "alpha"),
    (lambda: best_gamma(0.5, -1), "c"),
])
def test_bad_input_names_the_parameter(call, name):
    with pytest.raises(ValueError, match=rf"^{name}:"): call()


def test_acceptance_from_tv_hand_example_and_rows():
    p, q = torch.tensor([0.5, 0.3, 0.2]), torch.tensor([0.2, 0.3, 0.5])
    a = acceptance_from_tv(p, q)
    assert isinstance(a, float) and a == pytest.approx(0.7) == pytest.approx(1 - 0.5 * (p - q).abs().sum().item())
    assert acceptance_from_tv(p, p) == pytest.approx(1) and acceptance_from_tv(p, q) == acceptance_from_tv(q, p)
    assert acceptance_from_tv(torch.tensor([1.0, 0.0]), torch.tensor([0.0, 1.0])) == 0
    g = torch.Generator().manual_seed(0)
    P, Q = torch.rand(3, 5, 7, generator=g).softmax(-1), torch.rand(3, 5, 7, generator=g).softmax(-1)
    rows = acceptance_from_tv(P, Q)
    assert rows.shape == (3, 5) and rows.dtype == torch.float32
    assert rows[1, 2].item() == pytest.approx(acceptance_from_tv(P[1, 2], Q[1, 2]))


def test_acceptance_from_tv_matches_the_accept_test():
    "Monte Carlo of the rejection sampler's test: draft x ~ q, keep it when u < min(1, p(x)/q(x))."
    g = torch.Generator().manual_seed(3)
    p, q = torch.rand(12, generator=g).softmax(0), (2 * torch.rand(12, generator=g)).softmax(0)
    n = 400_000
    x = torch.multinomial(q, n, replacement=True, generator=g)
    kept = (torch.rand(n, generator=g) < (p[x] / q[x]).clamp(max=1)).double().mean().item()
    a = acceptance_from_tv(p, q)
    assert abs(kept - a) < 4 * (a * (1 - a) / n) ** 0.5


@pytest.mark.parametrize("p, q, name", [
    ([0.5, 0.5], [0.5, 0.5], "p"),                                         # not tensors
    (torch.tensor([0.5, 0.6]), torch.tensor([0.5, 0.5]), "p"),             # does not sum to 1
    (torch.tensor([1.2, -0.2]), torch.tensor([0.5, 0.5]), "p"),            # negative
    (torch.tensor([0.5, 0.5]), torch.tensor([1, 0]), "q"),                 # integer tensor
    (torch.tensor([0.5, 0.5]), torch.tensor([0.2, 0.3, 0.5]), "q"),        # shapes differ
])
def test_acceptance_from_tv_bad_input(p, q, name):
    with pytest.raises(ValueError, match=rf"^{name}:"): acceptance_from_tv(p, q)


def test_measure_verify_cost_shape_on_a_tiny_model():
    cfg = ModelConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=128)
    model = random_model(cfg, 0)
    ms = measure_verify_cost(model, ks=(0, 1, 3), batch_sizes=(1, 3), repeats=2, block_size=4, prompt_len=6,
                             warmup_s=0)
    assert set(ms) == {1, 3} and all(set(row) == {0, 1, 3} for row in ms.values())
    assert all(t > 0 and math.isfinite(t) for row in ms.values() for t in row.values())
    v = verify_ratios(ms[3])
    assert v[0] == 1 and list(v) == [0, 1, 3]
    with pytest.raises(ValueError, match="^times_ms:"): verify_ratios({1: 2.0})
    with pytest.raises(ValueError, match="^ks:"): measure_verify_cost(model, ks=())
    with pytest.raises(ValueError, match="^batch_sizes:"): measure_verify_cost(model, batch_sizes=(0,))
    with pytest.raises(ValueError, match="^repeats:"): measure_verify_cost(model, repeats=0)
