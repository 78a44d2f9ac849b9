"""Expert parallelism's traffic, counted without a process group: dispatch_rows on hand-made routings,
remote_rows_per_token against a simulated uniform router, and comm_bytes_per_gpu against chapter 40's counts and
the 2p/k ratio. (The block itself, across processes, is tested in test_parallel_engine.py.)"""
import pytest
import torch
from inferlab.model.config import ModelConfig
from inferlab.model.moe import route
from inferlab.parallel.collectives import bus_factor, ep_all_to_all_bytes, tp_allreduce_bytes
from inferlab.parallel.expert_parallel import SCHEMES, comm_bytes_per_gpu, dispatch_rows, remote_rows_per_token

MOE = ModelConfig(architecture="MixtralForCausalLM", hidden_size=64, intermediate_size=128, num_hidden_layers=4,
                  num_attention_heads=4, num_key_value_heads=2, vocab_size=256, num_experts=16, num_experts_per_tok=4)

def test_dispatch_rows_by_hand():
    experts = torch.tensor([[0, 1], [0, 2], [2, 3]])               # experts 0-1 on rank 0, 2-3 on rank 1
    assert dispatch_rows(experts, 4, 2, 0) == 3 and dispatch_rows(experts, 4, 2, 0, per_rank=True) == 2
    assert dispatch_rows(experts, 4, 2, 1) == 3 and dispatch_rows(experts, 4, 2, torch.tensor([0, 0, 1])) == 1
    assert dispatch_rows(experts, 4, 1, 0) == 0                     # one rank: nothing leaves it

@pytest.mark.parametrize("E,k,ep", [(8, 2, 2), (8, 2, 8), (128, 8, 8), (64, 6, 16)])
def test_remote_rows_match_a_uniform_router(E, k, ep):
    g, n = torch.Generator().manual_seed(0), 20_000
    _, chosen = route(torch.randn(n, E, generator=g), k, True)
    src = torch.randint(0, ep, (n,), generator=g)
    for per_rank in (False, True):
        want = remote_rows_per_token(E, k, ep, per_rank)
        assert abs(dispatch_rows(chosen, E, ep, src, per_rank) / n - want) < 0.01 * want + 0.01
    assert remote_rows_per_token(E, k, ep, True) <= remote_rows_per_token(E, k, ep)

def test_comm_bytes_per_gpu():
    for B, p in ((256, 8), (64, 2), (100, 4)):
        assert comm_bytes_per_gpu(MOE, B, p, "TP") == bus_factor("all_reduce", p) * tp_allreduce_bytes(MOE, B)
        assert comm_bytes_per_gpu(MOE, B, p, "DP+EP") == pytest.approx(ep_all_to_all_bytes(MOE, B / p, p))
        ratio = comm_bytes_per_gpu(MOE, B, p, "TP") / comm_bytes_per_gpu(MOE, B, p, "DP+EP")
        assert ratio == pytest.approx(2 * p / MOE.num_experts_per_tok)
    assert all(comm_bytes_per_gpu(MOE, 256, 1, s) == 0 for s in SCHEMES)
    tp_ep = comm_bytes_per_gpu(MOE, 256, 4, "TP+EP")                 # attention all-reduce + all-gather + dispatch
    row = 64 * 2 * 256
    assert tp_ep == pytest.approx(4 * (1.5 * row + 0.75 * row + 2 * 64 * 4 * 0.75 * 64 * 2))

def test_bad_input_is_refused():
    with pytest.raises(ValueError, match="scheme"): comm_bytes_per_gpu(MOE, 8, 2, "PP")
    with pytest.raises(ValueError, match="ep: 3"): remote_rows_per_token(16, 4, 3)
    dense = ModelConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                        vocab_size=256)
    with pytest.raises(ValueError, match="cfg"): comm_bytes_per_gpu(dense, 8, 2, "DP+EP")
