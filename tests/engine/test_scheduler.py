"Scheduler on its own, driven by `dry_run` (a fake model): budgets, chunked prefill, preemption, sampled positions."
import pytest
from inferlab.engine.block_manager import BlockManager
from inferlab.engine.scheduler import Scheduler, SchedulerConfig, ScheduledBatch, dry_run
from inferlab.engine.sequence import Sequence


def test_token_and_sequence_budgets_hold_every_step():
    log = dry_run([37, 120, 18, 250, 64, 90], [20, 60, 35, 10, 80, 25], num_blocks=200,
                  config=SchedulerConfig(max_num_seqs=3, max_num_batched_tokens=64))
    assert all(r["prefill"] + r["decode"] <= 64 and r["running"] <= 3 for r in log)
    assert sum(r["decode"] for r in log) + 6 == 20 + 60 + 35 + 10 + 80 + 25   # each prefill's last step samples too


def test_chunked_prefill_off_runs_whole_prompts():
    log = dry_run([40, 40], [2, 2], num_blocks=64, config=SchedulerConfig(max_num_batched_tokens=48, enable_chunked_prefill=False))
    assert [r["prefill"] for r in log if r["prefill"]] == [40, 40]
    with pytest.raises(RuntimeError, match="stalled"):
        dry_run([100], [1], num_blocks=64, config=SchedulerConfig(max_num_batched_tokens=48, enable_chunked_prefill=False))


def test_preemption_recomputes_and_leaks_nothing():
    log = dry_run([20] * 8, [30] * 8, num_blocks=14, config=SchedulerConfig(max_num_seqs=8))   # dry_run asserts no leak
    assert sum(r["preempted"] for r in log) > 0 and log[-1]["running"] == log[-1]["waiting"] == 0


def test_num_sampled_marks_the_steps_that_reach_the_end():
    bm = BlockManager(16, block_size=4)
    sch = Scheduler(SchedulerConfig(max_num_batched_tokens=8), bm)
    long, short = Sequence(list(range(1, 13))), Sequence([5, 6, 7])
    sch.add(long); sch.add(short)
    b = sch.schedule()
    assert b.num_new_tokens == [8] and b.num_sampled == [0]            # an unfinished chunk samples nothing
    sch.update(b)
    b = sch.schedule()
    assert b.seqs == [long, short] and b.num_new_tokens == [4, 3] and b.num_sampled == [1, 1]
    with pytest.raises(ValueError, match="num_sampled"): ScheduledBatch([long], [4], [], [5])   # more rows than tokens


def test_priority_policy_admits_lower_values_first():
    bm = BlockManager(64, block_size=4)
    sch = Scheduler(SchedulerConfig(max_num_seqs=1, policy="priority"), bm)
    late, urgent = Sequence([1, 2, 3], priority=5), Sequence([4, 5, 6], priority=0)
    sch.add(late); sch.add(urgent)
    assert sch.schedule().seqs == [urgent]
    with pytest.raises(ValueError, match="policy"): SchedulerConfig(policy="lifo")
