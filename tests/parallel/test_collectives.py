"The collectives chapter: what each collective computes on gloo ranks, run_spmd's failure paths, the ring cost model."
import multiprocessing, os, time
from pathlib import Path
import numpy as np
import pytest
import torch
from inferlab.model.config import ModelConfig
from inferlab.parallel.collectives import (LINKS, OPS, all_to_all_time, bandwidths, bus_factor, collective_time,
    demo_collectives, ep_all_to_all_bytes, fit_alpha_beta, measure_collectives, ring_allgather_time,
    ring_allreduce_time, ring_reduce_scatter_time, run_spmd, tp_allreduce_bytes, tp_comm_time)

LLAMA_70B = ModelConfig(hidden_size=8192, num_hidden_layers=80, num_attention_heads=64, num_key_value_heads=8,
                        head_dim=128, intermediate_size=28672, vocab_size=128256)
MIXTRAL = ModelConfig(architecture="MixtralForCausalLM", hidden_size=4096, num_hidden_layers=32, num_attention_heads=32,
                      num_key_value_heads=8, intermediate_size=14336, vocab_size=32000, num_experts=8, num_experts_per_tok=2)

# run by run_spmd's spawned children: module level, so they can import them from this file
def _rank1_dies(rank, world_size, stamp):
    if rank == 1: Path(stamp).write_text(repr(time.time())); os._exit(3)
    time.sleep(60)                                        # rank 0 neither returns nor fails: run_spmd must notice and kill it
    return rank

def _rank1_raises(rank, world_size, stamp):
    if rank == 1: Path(stamp).write_text(repr(time.time())); raise ValueError("boom from rank 1")
    time.sleep(60)
    return rank

def _check_collectives(results):
    xs = [d["input"] for d in results]
    p = len(xs)
    for r, d in enumerate(results):
        assert torch.equal(d["all_reduce"], sum(xs)) and torch.equal(d["ring_all_reduce"], sum(xs))
        assert torch.equal(d["all_gather"], torch.cat(xs))
        assert torch.equal(d["reduce_scatter"], sum(xs).chunk(p)[r])
        assert torch.equal(d["all_to_all"], torch.cat([x.chunk(p)[r] for x in xs]))

@pytest.mark.parametrize("world", [2, 3])
def test_collectives_match_torch_math(world, no_stray_processes):
    res = run_spmd(demo_collectives, world)
    assert [d["input"][0].item() for d in res] == [10.0 * (r + 1) for r in range(world)]   # rank order
    _check_collectives(res)
    assert multiprocessing.active_children() == []

def test_measure_collectives_small(no_stray_processes):
    sizes = (16, 4096)
    a, b = run_spmd(measure_collectives, 2, sizes, 3)
    assert a == b and set(a) == set(OPS)                  # the ranks agree on the slower rank's medians
    assert all(len(a[op]) == 2 and min(a[op]) > 0 for op in OPS)
    with pytest.raises(RuntimeError, match="sizes_bytes"):
        run_spmd(measure_collectives, 2, (12,), 1)        # not a multiple of 4 · world_size = 8

@pytest.mark.parametrize("fn, what", [(_rank1_dies, r"rank 1 exited \(code 3\)"),
                                      (_rank1_raises, "(?s)rank 1 failed:.*ValueError: boom from rank 1")])
def test_run_spmd_fails_fast_and_cleans_up(fn, what, tmp_path, no_stray_processes):
    stamp = tmp_path / "rank1_failed_at"
    with pytest.raises(RuntimeError, match=what):
        run_spmd(fn, 2, str(stamp), timeout_s=60)
    # timed from rank 1's failure, not from the launch (spawning two torch processes is slow on a loaded machine):
    # noticed within seconds, not after the 60 s timeout nor the process group's own
    assert time.time() - float(stamp.read_text()) < 15
    assert multiprocessing.active_children() == []

def test_ring_closed_forms():
    a, b = 2e-6, 100e9
    assert ring_allreduce_time(8_000_000, 8, a, b) == pytest.approx(14 * a + 2 * 7 / 8 * 8e6 / b)
    for f in (ring_allgather_time, ring_reduce_scatter_time, all_to_all_time):
        assert f(8_000_000, 8, a, b) == pytest.approx(7 * a + 7 / 8 * 8e6 / b)
    assert ring_allreduce_time(123, 1, a, b) == 0          # one rank: nothing to send
    assert ring_allreduce_time(2 ** 30, 2, 0, 1e9) == pytest.approx(2 ** 30 / 1e9)   # p = 2: each rank sends n
    assert collective_time("all_gather", np.array([0, 800]), 4, 1.0, 100.0).tolist() == [3.0, 9.0]
    with pytest.raises(ValueError, match="op"): bus_factor("broadcast", 4)

def test_bus_bandwidth_conventions():
    alg, bus = bandwidths("all_reduce", 1e9, 0.5, 8)
    assert alg == pytest.approx(2e9) and bus == pytest.approx(2e9 * 2 * 7 / 8)
    assert bandwidths("all_to_all", 1e9, 0.5, 4)[1] == pytest.approx(2e9 * 3 / 4)
    assert bus_factor("reduce_scatter", 2) == 0.5 and bus_factor("all_reduce", 2) == 1.0

@pytest.mark.parametrize("op, p", [("all_reduce", 2), ("all_reduce", 8), ("all_gather", 4), ("all_to_all", 8)])
def test_fit_recovers_alpha_beta(op, p):
    sizes = np.array([4 ** k for k in range(2, 14)], dtype=float)
    rng = np.random.default_rng(0)
    for alpha, beta in [(5e-6, 450e9), (250e-6, 1.2e9), (1e-6, 32e9)]:
        t = collective_time(op, sizes, p, alpha, beta) * (1 + 1e-3 * rng.standard_normal(sizes.size))
        a, b = fit_alpha_beta(sizes, t, p, op)
        assert a == pytest.approx(alpha, rel=0.01) and b == pytest.approx(beta, rel=0.01)
    with pytest.raises(ValueError, match="sizes"): fit_alpha_beta([16], [1e-5], 2)
    with pytest.raises(ValueError, match="p"): fit_alpha_beta(sizes, t, 1)

def test_tp_allreduce_bytes_and_time():
    assert tp_allreduce_bytes(LLAMA_70B, 1) == 2 * 80 * 8192 * 2 == 2_621_440
    assert tp_allreduce_bytes(LLAMA_70B, 256, dtype_bytes=4) == 2 * 80 * 256 * 8192 * 4
    assert tp_allreduce_bytes(MIXTRAL, 3) == 2 * 32 * 3 * 4096 * 2
    alpha, beta = LINKS["NVLink 4 (H100 SXM)"]
    assert (alpha, beta) == (1e-6, 450e9) and LINKS["PCIe Gen5 x16"][1] == 64e9 and LINKS["InfiniBand NDR 400G"][1] == 50e9
    assert tp_comm_time(LLAMA_70B, 4, 8, "NVLink 4 (H100 SXM)") == pytest.approx(
        160 * (14 * alpha + 1.75 * 4 * 8192 * 2 / beta))
    assert tp_comm_time(LLAMA_70B, 4, 1, "PCIe Gen4 x16") == 0
    with pytest.raises(ValueError, match="link"): tp_comm_time(LLAMA_70B, 1, 8, "carrier pigeon")

def test_ep_all_to_all_bytes():
    # one owned token, 8 ranks: 2 (dispatch + combine) x 2 experts x 7/8 remote x 4096 x 2 bytes x 32 layers
    assert ep_all_to_all_bytes(MIXTRAL, 1, 8) == 2 * 2 * 7 / 8 * 4096 * 2 * 32 == 917_504
    assert ep_all_to_all_bytes(MIXTRAL, 10, 2) == 2 * 10 * 2 * 1 / 2 * 4096 * 2 * 32
    assert ep_all_to_all_bytes(MIXTRAL, 10, 1) == 0       # every expert local
    # per batch token per layer, 8 ranks, attention data-parallel: TP's all-reduces send 2p/k = 8x EP's all-to-alls
    tp_rank = bus_factor("all_reduce", 8) * tp_allreduce_bytes(MIXTRAL, 256) / 32 / 256
    ep_rank = ep_all_to_all_bytes(MIXTRAL, 256 // 8, 8) / 32 / 256
    assert (tp_rank, ep_rank) == (28_672, 3_584)
    with pytest.raises(ValueError, match="cfg"): ep_all_to_all_bytes(LLAMA_70B, 1, 8)
    with pytest.raises(ValueError, match="ep"): ep_all_to_all_bytes(MIXTRAL, 1, 3)
