"Suffix decoding: the trees against brute-force n-gram counts, drafting by hand, the proposer's bounds and errors."
import random
from collections import Counter
import pytest
from inferlab.engine.sequence import Sequence, SequenceStatus
from inferlab.model.sampling import SamplingParams
from inferlab.spec_decode.suffix import SuffixTree, SuffixProposer, TokenIndex, speculate, index_speculate

def ngrams(seqs, depth) -> Counter:
    return Counter(tuple(s[i:j]) for s in seqs for i in range(len(s)) for j in range(i + 1, min(i + depth, len(s)) + 1))

def walk(tree) -> Counter:
    "The tree's n-gram counts; asserts every node's total and favourite on the way."
    out, todo = Counter(), [((), tree.root)]
    while todo:
        path, node = todo.pop()
        kids = node.children
        assert node.total == sum(c.count for c in kids.values())
        assert node is tree.root or node.best == max(kids, key=lambda u: (kids[u].count, -u), default=None)
        for t, c in kids.items():
            assert c.count > 0
            out[path + (t,)] = c.count; todo.append((path + (t,), c))
    return out

@pytest.mark.parametrize("seed", range(20))
def test_tree_counts_every_ngram_and_forgets_exactly(seed):
    rng = random.Random(seed)
    depth = rng.randint(2, 7)
    seqs = [[rng.randint(0, 4) for _ in range(rng.randint(1, 40))] for _ in range(rng.randint(1, 6))]
    tree = SuffixTree(depth)
    for key, s in enumerate(seqs):                     # grown in random pieces, as a request grows
        cuts = sorted(rng.sample(range(len(s) + 1), min(3, len(s) + 1)))
        for a, b in zip([0] + cuts, cuts + [len(s)]): tree.extend(key, s[a:b])
        tree.close(key)
    assert walk(tree) == ngrams(seqs, depth) and tree.num_nodes() == len(ngrams(seqs, depth))
    gone = rng.sample(range(len(seqs)), rng.randint(0, len(seqs)))
    for i in gone: tree.remove(seqs[i])
    kept = [s for i, s in enumerate(seqs) if i not in gone]
    assert walk(tree) == ngrams(kept, depth) and tree.num_nodes() == len(ngrams(kept, depth))

def test_speculate_by_hand():
    A, B, C, D, E, X = 1, 2, 3, 4, 5, 6
    t = SuffixTree(8)
    for i, s in enumerate([[A, B, C, D], [A, B, C, D, X], [A, B, E], [X, A, B, C, D]]): t.extend(i, s); t.close(i)
    assert speculate(t, [A, B], 8) == ([C, D], 1.5, 2)            # 3/4, then 3/4 * 3/3
    assert speculate(t, [A, B], 8, min_prob=0.8)[0] == []
    assert speculate(t, [A, B], 8, factor=0.5)[0] == [C]
    assert speculate(t, [A, B], 1) == ([C], 0.75, 2)
    assert speculate(t, [9, 9], 8) == ([], 0.0, 0)                # nothing matches

def finished(prompt, output, reason="stop") -> Sequence:
    s = Sequence(prompt, SamplingParams(temperature=0)); s.token_ids += output
    s.status, s.finish_reason = SequenceStatus.FINISHED, reason
    return s

@pytest.mark.parametrize("seed", range(200))
def test_the_index_drafts_exactly_as_the_trie(seed):
    "Random sequences, grown in pieces or added and partly dropped: the same (tokens, score, n) for every setting."
    rng = random.Random(seed)
    D, V = rng.randint(2, 8), rng.randint(2, 5)
    seqs = [[rng.randint(0, V - 1) for _ in range(rng.randint(1, 20))] for _ in range(rng.randint(1, 6))]
    tree, ix = SuffixTree(D), TokenIndex(D)
    if seed % 2:
        s = sum(seqs, []); tree.extend(0, s); ix.add(s[:3]); ix.add(s[3:], new=False); ctx = s
    else:
        for i, s in enumerate(seqs): tree.extend(i, s); tree.close(i); ix.add(s)
        for s in seqs[:rng.randint(0, len(seqs) - 1)]: tree.remove(s); ix.drop_oldest()
        ctx = [rng.randint(0, V - 1) for _ in range(rng.randint(1, 12))]
    ctx = ctx[-(D - 1):]
    for k in (1, 3, 8):
        for f in (0.5, 1.0, 2.0):
            for mp in (0.0, 0.1, 0.5): assert speculate(tree, ctx, k, f, mp) == index_speculate(ix, ctx, k, f, mp)

def test_index_compacts_and_keeps_its_counts():
    ix = TokenIndex(6)
    outs = [[i % 7, (i * 3) % 5, 9, i % 4] * 30 for i in range(200)]       # 120 tokens each: compactions happen
    for i, o in enumerate(outs):
        ix.add(o)
        if i >= 20: ix.drop_oldest()
    live = [list(ix.tokens[s + 1:s + 1 + n]) for s, n in ix.spans]
    assert live == outs[-20:] and len(ix.tokens) < 2 * 21 * 121 + 4096
    counts = {(a, b): c for a, kids in ix.after.items() for b, c in kids.items()}
    assert counts == Counter((a, b) for o in outs[-20:] for a, b in zip(o, o[1:]))
    tree = SuffixTree(6)
    for i, o in enumerate(outs[-20:]): tree.extend(i, o); tree.close(i)
    for ctx in ([1, 3, 9], [9, 2], [0, 0, 9, 0]): assert index_speculate(ix, ctx, 5) == speculate(tree, ctx, 5)

def live_outputs(p):
    ix = p.earlier
    return [list(ix.tokens[s + 1:s + 1 + n]) for s, n in ix.spans]

def test_global_index_is_bounded_and_trusts_only_normal_endings():
    p = SuffixProposer(max_tree_depth=6, max_cached_requests=4)
    outs = [[i, i + 1, 7, 8, 9, i] for i in range(20)]
    for o in outs: p.release(finished([0], o))
    assert len(p.cached) == 4 and live_outputs(p) == outs[-4:]
    s = finished([0], [50, 51, 52]); p.release(s); p.release(s)        # released twice: added once
    assert live_outputs(p) == outs[-3:] + [[50, 51, 52]]
    for reason in ("abort", "error"): p.release(finished([0], [60, 61], reason))
    assert 60 not in p.earlier.after
    none = SuffixProposer(max_cached_requests=0); none.release(finished([0], [1, 2]))
    assert len(none.earlier.tokens) == 0

def test_proposer_drafts_from_both_indexes_and_leaves_nothing():
    p = SuffixProposer()
    p.release(finished([1, 2], [10, 11, 12, 13, 14, 15, 16, 17]))
    s = Sequence([5, 10, 11, 12, 13], SamplingParams(temperature=0))   # 4 tokens of the earlier output
    assert p.propose([s], [8])[0].tokens == [14, 15, 16, 17]            # its own index has nothing to offer
    s.token_ids += [14]                                                  # the target accepted one token
    assert p.propose([s], [2])[0].tokens == [15, 16]                     # k bounds the draft
    own = Sequence([3, 4, 5, 6, 3, 4, 5], SamplingParams(temperature=0))   # its own repeat beats the global index
    assert p.propose([own], [8])[0].tokens == [6, 3, 4]
    with pytest.raises(RuntimeError, match="per-request indexes left"): p.check()
    p.release(s); p.release(own); p.check()

@pytest.mark.parametrize("kwargs, field", [(dict(max_tree_depth=1), "suffix_decoding_max_tree_depth"),
                                           (dict(max_cached_requests=-1), "suffix_decoding_max_cached_requests"),
                                           (dict(max_spec_factor=0), "suffix_decoding_max_spec_factor"),
                                           (dict(min_token_prob=1.5), "suffix_decoding_min_token_prob"),
                                           (dict(min_token_prob=True), "suffix_decoding_min_token_prob")])
def test_bad_settings_name_the_field(kwargs, field):
    with pytest.raises(ValueError, match=field): SuffixProposer(**kwargs)
