"BlockManager on its own: reference counts, the prefix cache and its eviction order, truncation, no leaks."
import pytest
from inferlab.engine.block_manager import BlockManager
from inferlab.engine.sequence import Sequence


def running(bm, tokens, computed=None):
    "A sequence allocated and computed up to `computed` tokens (default: all), its full blocks cached."
    s = Sequence(tokens); bm.allocate(s)
    s.num_computed_tokens = len(tokens) if computed is None else computed
    bm.cache_computed_blocks(s)
    return s


def test_allocate_free_returns_every_block():
    bm = BlockManager(10, block_size=4)
    seqs = [running(bm, list(range(i, i + n))) for i, n in [(1, 9), (50, 4), (90, 1)]]
    assert [len(s.block_table) for s in seqs] == [3, 1, 1] and bm.num_free_blocks == 5
    for s in seqs: bm.free(s)
    assert bm.num_free_blocks == 10 and all(b.ref_count == 0 for b in bm.blocks)


def test_shared_prefix_is_counted_once_and_freed_last():
    bm = BlockManager(10, block_size=4)
    a = running(bm, list(range(1, 11)))                       # blocks [1-4] [5-8] [9 10]
    b = Sequence(list(range(1, 9)) + [77, 78, 79])            # shares the two full blocks
    assert len(bm.prefix_hits(b)) == 2
    bm.allocate(b)
    assert b.block_table[:2] == a.block_table[:2] and b.num_computed_tokens == 8
    assert [bm.blocks[x].ref_count for x in a.block_table[:2]] == [2, 2]
    bm.free(a)
    assert [bm.blocks[x].ref_count for x in b.block_table[:2]] == [1, 1]
    bm.free(b)
    assert bm.num_free_blocks == 10


def test_never_the_last_token_from_the_cache():
    bm = BlockManager(6, block_size=4)
    running(bm, list(range(1, 9)))
    assert len(bm.prefix_hits(Sequence(list(range(1, 9))))) == 1   # 8 tokens: the second block holds the last one


def test_unhashed_blocks_are_reused_before_cached_ones():
    bm = BlockManager(4, block_size=2)
    cached = running(bm, [1, 2, 3, 4])                        # two full, cached blocks
    scratch = running(bm, [9], computed=0)                    # one partial, never cached
    ids_cached, id_scratch = list(cached.block_table), scratch.block_table[0]
    bm.free(cached); bm.free(scratch)
    queue = list(bm.free_queue)
    assert queue[0] == id_scratch and set(queue[-2:]) == set(ids_cached)   # worthless blocks are reused first
    fresh = Sequence([5]); bm.allocate(fresh)
    assert fresh.block_table == [id_scratch]
    assert len(bm.prefix_hits(Sequence([1, 2, 3, 4, 5]))) == 2            # the cached prefix survived


def test_can_allocate_refuses_beyond_the_pool():
    bm = BlockManager(3, block_size=4)
    assert bm.can_allocate(Sequence(list(range(12)))) and not bm.can_allocate(Sequence(list(range(13))))
    with pytest.raises(RuntimeError, match="not enough free blocks"): bm.allocate(Sequence(list(range(13))))
    assert bm.num_free_blocks == 3


def test_truncate_gives_back_the_tail_and_keeps_the_sequence():
    bm = BlockManager(8, block_size=4)
    s = running(bm, list(range(1, 14)))                       # 13 tokens: 4 blocks, 3 of them full and cached
    bm.truncate(s, 6)
    assert s.num_tokens == s.num_computed_tokens == 6 and len(s.block_table) == 2 and bm.num_free_blocks == 6
    assert len(s.block_hashes) == 1 and bm.blocks[s.block_table[1]].hash is None   # the cut block left the cache
    assert len(bm.prefix_hits(Sequence(list(range(1, 14))))) == 1
    s.token_ids += [100, 101, 102]; bm.append_slots(s, 3)     # it keeps running: new tokens get slots again
    assert len(s.block_table) == 3
    bm.free(s)
    assert bm.num_free_blocks == 8


def test_truncate_refuses_a_shared_tail_and_bad_lengths():
    bm = BlockManager(8, block_size=4)
    a = running(bm, list(range(1, 10)))
    b = Sequence(list(range(1, 9)) + [50]); bm.allocate(b)    # shares a's two full blocks
    with pytest.raises(RuntimeError, match="shared"): bm.truncate(b, 6)
    with pytest.raises(ValueError, match="num_tokens"): bm.truncate(a, 0)
    with pytest.raises(ValueError, match="num_tokens"): bm.truncate(a, 10)
    bm.truncate(b, 8)                                          # on a block boundary: nothing shared is rewritten
    assert len(b.block_table) == 2
    bm.free(a); bm.free(b)
    assert bm.num_free_blocks == 8
