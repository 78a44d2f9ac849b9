"KV cache memory math: hand-computed sizes, errors that name the field, and paging never fitting fewer sequences."
import math
import numpy as np
import pytest, torch
from hypothesis import given, settings, strategies as st
from inferlab.model.config import ModelConfig, load_config, shipped_model_path
from inferlab.engine.kv_memory import (dtype_bytes, kv_bytes_per_token, kv_block_bytes, num_kv_blocks, max_concurrent_seqs,
                                kv_budget_bytes, seqs_that_fit, sample_lengths, contiguous_waste, paged_waste,
                                expected_contiguous_waste)

LLAMA3_8B = ModelConfig(vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                        num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=8192)
LLAMA2_7B = ModelConfig(vocab_size=32000, hidden_size=4096, intermediate_size=11008, num_hidden_layers=32,
                        num_attention_heads=32, max_position_embeddings=4096)   # MHA: 32 KV heads

def test_hand_computed_sizes():
    tiny = load_config(shipped_model_path("tiny-dense"))
    assert kv_bytes_per_token(tiny, "float32") == 2 * 6 * 4 * 32 * 4 == 6144
    assert kv_bytes_per_token(tiny, torch.bfloat16) == 3072
    assert kv_bytes_per_token(LLAMA3_8B, "bfloat16") == 131072
    assert kv_bytes_per_token(LLAMA2_7B, torch.float16) == 524288
    assert kv_bytes_per_token(LLAMA3_8B, "fp8") == 65536
    assert kv_block_bytes(LLAMA3_8B, 16, "bf16") == 2 * 1024 * 1024
    assert num_kv_blocks(LLAMA3_8B, 40e9, 16, "bf16") == 19073
    assert max_concurrent_seqs(LLAMA3_8B, 40e9, 4096, "bf16") == 74          # 512 MiB each
    assert max_concurrent_seqs(LLAMA3_8B, 40e9, 4096, "bf16", block_size=16) == 74
    assert max_concurrent_seqs(LLAMA3_8B, 1e6, 4096, "bf16") == 0
    assert kv_budget_bytes(80e9, 16e9) == 56e9

def test_dtype_bytes():
    assert [dtype_bytes(d) for d in ("float32", "bfloat16", "float16", "fp8", "torch.bfloat16")] == [4, 2, 2, 1, 2]
    assert [dtype_bytes(d) for d in (torch.float32, torch.float16, torch.float8_e4m3fn, torch.float8_e5m2)] == [4, 2, 1, 1]

@pytest.mark.parametrize("call, field", [
    (lambda: dtype_bytes("float12"), "dtype"),
    (lambda: dtype_bytes(torch.bool), "dtype"),
    (lambda: kv_bytes_per_token(LLAMA3_8B, None), "dtype"),
    (lambda: kv_bytes_per_token({"num_hidden_layers": 32}, "bf16"), "cfg"),
    (lambda: kv_block_bytes(LLAMA3_8B, 0, "bf16"), "block_size"),
    (lambda: num_kv_blocks(LLAMA3_8B, 1e6, 16, "bf16"), "budget_bytes"),
    (lambda: num_kv_blocks(LLAMA3_8B, float("nan"), 16, "bf16"), "budget_bytes"),
    (lambda: max_concurrent_seqs(LLAMA3_8B, -1, 4096, "bf16"), "budget_bytes"),
    (lambda: max_concurrent_seqs(LLAMA3_8B, 40e9, 0, "bf16"), "seq_len"),
    (lambda: max_concurrent_seqs(LLAMA3_8B, 40e9, 4096, "bf16", block_size=2.5), "block_size"),
    (lambda: kv_budget_bytes(80e9, 100e9), "total_bytes"),
    (lambda: kv_budget_bytes(80e9, -1), "weight_bytes"),
    (lambda: kv_budget_bytes(80e9, 1e9, utilization=0), "utilization"),
    (lambda: contiguous_waste([10, 5000], 4096), "lengths"),
    (lambda: contiguous_waste([0, 10], 4096), "lengths"),
    (lambda: paged_waste([], 16), "lengths"),
    (lambda: seqs_that_fit(LLAMA3_8B, 40e9, [5000], "bf16", 4096, 16), "lengths"),
    (lambda: expected_contiguous_waste(4096, "zipf"), "dist"),
])
def test_errors_name_the_field(call, field):
    with pytest.raises(ValueError, match=field): call()

def test_num_kv_blocks_error_message_says_why():
    with pytest.raises(ValueError, match=r"budget_bytes: 1,000,000 bytes hold no KV block \(16 tokens x 131,072 bytes"):
        num_kv_blocks(LLAMA3_8B, 1e6, 16, "bf16")

def test_waste_matches_closed_forms():
    assert contiguous_waste(range(1, 2049), 2048) == expected_contiguous_waste(2048, "uniform") == 2047 / 4096
    lengths = sample_lengths(20_000, median=512, sigma=1.0, max_len=4096, seed=1)
    assert abs(contiguous_waste(lengths, 4096) - expected_contiguous_waste(4096)) < 0.01     # about 0.80
    assert paged_waste(lengths, 16) < 0.01
    assert ((-(-lengths // 16)) * 16 - lengths).max() < 16                                  # under one block each

@settings(max_examples=200, deadline=None)
@given(budget=st.integers(0, 10 ** 9), k=st.integers(1, 300), block=st.sampled_from([1, 2, 8, 16, 32, 128]))
def test_paged_equals_contiguous_when_block_divides_length(budget, k, block):
    tiny = ModelConfig(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
                       num_key_value_heads=2)
    assert max_concurrent_seqs(tiny, budget, k * block, "fp32", block) == max_concurrent_seqs(tiny, budget, k * block, "fp32")

@settings(max_examples=200, deadline=None)
@given(budget=st.integers(0, 10 ** 9), seq_len=st.integers(1, 5000), block=st.sampled_from([1, 3, 16, 32, 256]))
def test_paged_waste_is_under_one_block(budget, seq_len, block):
    "Paged at seq_len fits at least as many as contiguous sequences one token short of a block longer."
    tiny = ModelConfig(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
                       num_key_value_heads=2)
    assert max_concurrent_seqs(tiny, budget, seq_len, "bf16", block) >= max_concurrent_seqs(tiny, budget, seq_len + block - 1, "bf16")

@settings(max_examples=200, deadline=None)
@given(budget=st.floats(0, 2e8), m=st.integers(1, 64), block=st.sampled_from([1, 2, 4, 16, 64]),
       lengths=st.lists(st.integers(1, 64 * 64), min_size=1, max_size=200), dtype=st.sampled_from(["fp32", "bf16", "fp8"]))
def test_paged_never_fits_fewer_than_contiguous(budget, m, block, lengths, dtype):
    "Contiguous reserves max_len per request, paged holds its blocks: when block_size divides max_len, paged >= contiguous."
    max_len = m * block
    lengths = [min(x, max_len) for x in lengths]
    tiny = load_config(shipped_model_path("tiny-dense"))
    assert seqs_that_fit(tiny, budget, lengths, dtype, max_len, block) >= seqs_that_fit(tiny, budget, lengths, dtype, max_len)

def test_paging_can_lose_when_block_does_not_divide_length():
    "The property above needs its condition: 17-token sequences in 16-token blocks hold 32 slots each."
    tiny = load_config(shipped_model_path("tiny-dense"))
    assert max_concurrent_seqs(tiny, 1e6, 17, "fp32", 16) == 5 < max_concurrent_seqs(tiny, 1e6, 17, "fp32") == 9

def test_paged_fits_several_times_more_on_a_chat_workload():
    lengths = sample_lengths(5000, median=512, sigma=1.0, max_len=4096)
    contiguous = seqs_that_fit(LLAMA3_8B, 40e9, lengths, "bf16", 4096)
    paged = seqs_that_fit(LLAMA3_8B, 40e9, lengths, "bf16", 4096, block_size=16)
    assert contiguous == 74 and paged > 4 * contiguous
