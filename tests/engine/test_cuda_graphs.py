"""CUDA graphs for decode (chapter 15b), on CPU: bucket choice, static inputs and padding, the fallback decision, the
`enforce_eager` flag through config, engine and runner, and replays (by `capture_by_rerun`, through the Triton kernels
in their interpreter) sliced back to each step's rows. The capture itself needs CUDA: `make gpu-check` runs it."""
import dataclasses
import pytest
import torch
from inferlab.model.config import ModelConfig
from inferlab.model.model import load_model
from inferlab.model.sampling import SamplingParams
from inferlab.engine.block_manager import BlockManager
from inferlab.engine.scheduler import Scheduler, SchedulerConfig
from inferlab.engine.sequence import Sequence
from inferlab.engine.model_runner import ModelRunner, PagedKVCache, pack_model, prepare_batch, sample_batch
from inferlab.engine.llm_engine import LLMEngine, EngineConfig
from inferlab.engine.paged_attention import TorchAttention
from inferlab.engine.triton_attention import TritonAttention
from inferlab.engine.triton_runtime import interpreter_ready
from inferlab.engine.cuda_graphs import (capture_sizes, bucket_for, StaticDecodeInputs, graphs_unsupported,
                                         capture_cuda_graph, capture_by_rerun, DecodeGraphs)
from inferlab.model.random_weights import random_model

TINY = ModelConfig(architecture="LlamaForCausalLM", vocab_size=256, hidden_size=32, intermediate_size=64,
                   num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                   max_position_embeddings=128)
needs_interpreter = pytest.mark.skipif(not interpreter_ready(), reason="Triton's interpreter is not active")


def decode_step(runner, prompts):
    "Prefill `prompts` through a scheduler and `runner`, then pack the next step (one decode row each)."
    sch = Scheduler(SchedulerConfig(max_num_seqs=len(prompts)),
                    BlockManager(runner.kv_cache.num_blocks, runner.block_size))
    for p in prompts: sch.add(Sequence(p, SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)))
    batch = sch.schedule()
    samplers, logits = runner.execute(batch); sch.update(batch)
    for s, t in zip(samplers, sample_batch(logits, samplers)): s.append_token(t)
    return prepare_batch(sch.schedule(), runner.block_size, runner.device)[:3]


@pytest.fixture(scope="module")
def runner():
    r = ModelRunner(pack_model(random_model(TINY)), num_blocks=32, block_size=4, enforce_eager=True)
    r.attention = TritonAttention()               # what a graph needs: metadata read on the device, no host plans
    return r


# ------------------------------------------------------------------------------------------------ buckets

def test_capture_sizes_and_buckets():
    sizes = capture_sizes(512)
    assert sizes[:5] == [1, 2, 4, 8, 16] and sizes[-1] == 512 and sizes == sorted(set(sizes))
    assert all(b - a == 16 for a, b in zip(sizes[4:], sizes[5:]))
    assert capture_sizes(40) == [1, 2, 4, 8, 16, 32, 40] and capture_sizes(3) == [1, 2, 3]
    for n in range(1, 513):                       # the smallest bucket that holds n
        b = bucket_for(n, sizes)
        assert b >= n and all(s < n for s in sizes if s < b)
    assert bucket_for(513, sizes) is None and bucket_for(41, capture_sizes(40)) is None
    for bad in (0, -1, 2.0, True, "8"):
        with pytest.raises(ValueError, match="max_batch"): capture_sizes(bad)


# ------------------------------------------------------------------------------------------- static inputs

def test_static_inputs_fill_pads_and_views(runner):
    ids, pos, meta = decode_step(runner, [list(range(1, 10)), [3, 4], list(range(30, 37)), [9]])
    st = StaticDecodeInputs(max_batch=16, max_blocks=8, device="cpu")
    st.fill(ids, pos, meta, bucket=8)
    w = meta.decode_block_tables.shape[1]
    assert st.input_ids[:4].tolist() == ids.tolist() and st.positions[:4].tolist() == pos.tolist()
    assert st.slot_mapping[:4].tolist() == meta.slot_mapping.tolist()
    assert torch.equal(st.block_tables[:4, :w], meta.decode_block_tables)
    assert st.slot_mapping[4:8].tolist() == [-1] * 4 and st.seq_lens[4:8].tolist() == [0] * 4    # padding
    assert st.input_ids[4:8].tolist() == [0] * 4 and st.positions[4:8].tolist() == [0] * 4
    # a smaller step next: its own rows and its bucket's padding change; rows past the bucket are never read
    before = st.seq_lens.clone()
    st.fill(ids[:1], pos[:1], dataclasses.replace(meta, slot_mapping=meta.slot_mapping[:1],
            decode_seq_lens=meta.decode_seq_lens[:1], decode_block_tables=meta.decode_block_tables[:1]), bucket=1)
    assert torch.equal(st.seq_lens, before)
    m = st.metadata(meta, 8)
    assert m.num_prefill_tokens == 0 and m.decode_seq_lens.data_ptr() == st.seq_lens.data_ptr()
    assert m.slot_mapping.shape == (8,) and m.decode_block_tables.shape == (8, 8)
    assert m.prefill_cu_seqlens_q is meta.prefill_cu_seqlens_q   # prefill fields kept, never read (no prefill rows)


# --------------------------------------------------------------------------------------------- what stops it

def test_graphs_unsupported_names_the_reason(runner):
    model = runner.model
    moe = load_model("tiny-moe", dtype=torch.float32)
    assert "MoEBlock" in graphs_unsupported(moe, PagedKVCache(moe.config, 4, 4), TritonAttention())
    int8 = PagedKVCache(TINY, 4, 4, kv_cache_dtype="int8")
    assert "int8 KV blocks" in graphs_unsupported(model, int8, TritonAttention())
    assert "torch attention backend" in graphs_unsupported(model, runner.kv_cache, TorchAttention())
    assert "CUDA device" in graphs_unsupported(model, runner.kv_cache, TritonAttention())


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is present: it would capture for real")
def test_capture_cuda_graph_without_cuda_says_so():
    with pytest.raises(RuntimeError, match="need a CUDA device"): capture_cuda_graph(lambda: None)


def test_flag_plumbing():
    assert EngineConfig().enforce_eager is False
    for bad in ("no", 1, None):
        with pytest.raises(ValueError, match="enforce_eager"): EngineConfig(enforce_eager=bad)
    model = random_model(TINY)
    eager = LLMEngine(model, None, EngineConfig(num_kv_blocks=16, enforce_eager=True)).runner
    assert eager.graphs_off == "enforce_eager" and eager.cuda_graphs is None
    default = LLMEngine(model, None, EngineConfig(num_kv_blocks=16)).runner    # CPU: the torch backend's reason
    assert default.cuda_graphs is None and "plans each step on the host" in default.graphs_off
    from inferlab.llm import LLM
    llm = LLM(enforce_eager=True, num_kv_blocks=16)                           # through the facade's **engine_config
    assert llm.engine.config.enforce_eager and llm.engine.runner.graphs_off == "enforce_eager"


# ------------------------------------------------------------------------------------------ replay and slicing

class FakeModelStep:
    "A forward whose rows can be told apart: row i = token id + 1000 x position, in every hidden unit."
    def __init__(self, hidden: int): self.hidden, self.calls = hidden, 0
    def __call__(self, ids, pos, meta):
        self.calls += 1
        return (ids + 1000 * pos).float()[:, None].expand(-1, self.hidden).clone()   # [T, hidden]


def test_replay_is_sliced_back_to_the_steps_rows(runner):
    fake = FakeModelStep(TINY.hidden_size)
    graphs = DecodeGraphs(fake, runner.model, runner.kv_cache, max_batch=8, capture=capture_by_rerun)
    ids, pos, meta = decode_step(runner, [[5, 6, 7], list(range(10, 20)), [40, 41]])
    h = graphs.run(ids, pos, meta)
    assert h.shape == (3, TINY.hidden_size) and h[:, 0].tolist() == (ids + 1000 * pos).float().tolist()
    assert fake.calls == 2 and sorted(graphs.graphs) == [4]         # warm-up + replay; captured once, bucket 4
    assert graphs.out[3].abs().max() == 0                           # the padded row: token 0 at position 0
    h.add_(1)                                                       # the caller's copy, not the graph's output
    assert graphs.out[0, 0] == ids[0] + 1000 * pos[0]
    h2 = graphs.run(ids[:2], pos[:2], dataclasses.replace(meta, slot_mapping=meta.slot_mapping[:2],
                    decode_seq_lens=meta.decode_seq_lens[:2], decode_block_tables=meta.decode_block_tables[:2]))
    assert h2.shape == (2, TINY.hidden_size) and sorted(graphs.graphs) == [2, 4] and graphs.replays == 2
    assert h[0, 0] == ids[0] + 1000 * pos[0] + 1                    # the earlier result survives the next replay


def test_steps_a_graph_does_not_take(runner):
    fake = FakeModelStep(TINY.hidden_size)
    graphs = DecodeGraphs(fake, runner.model, runner.kv_cache, max_batch=2, capture=capture_by_rerun)
    ids, pos, meta = decode_step(runner, [[5, 6, 7], [8, 9], [1, 2, 3, 4]])
    assert graphs.eager_reason(ids, meta) == "3 rows > the largest bucket 2" and graphs.run(ids, pos, meta) is None
    pre = dataclasses.replace(meta, num_prefill_tokens=1)
    assert graphs.eager_reason(ids[:1], pre) == "the step holds prefill tokens"
    wide = dataclasses.replace(meta, decode_block_tables=torch.zeros(3, 99, dtype=torch.int32))
    assert graphs.eager_reason(ids[:2], wide) == "block tables wider than captured"
    assert fake.calls == 0 and graphs.eager_steps == 1


def test_a_failed_capture_turns_graphs_off(runner):
    fake = FakeModelStep(TINY.hidden_size)
    def refuse(step, pool=None): raise RuntimeError("operation not permitted when stream is capturing")
    graphs = DecodeGraphs(fake, runner.model, runner.kv_cache, max_batch=8, capture=refuse)
    ids, pos, meta = decode_step(runner, [[5, 6, 7]])
    assert graphs.run(ids, pos, meta) is None and graphs.run(ids, pos, meta) is None
    assert graphs.off == "capture failed: RuntimeError: operation not permitted when stream is capturing"
    assert graphs.eager_steps == 2 and not graphs.graphs and graphs.replays == 0


def test_runner_asks_the_graphs_first(runner):
    "The runner's hook: hidden states from `cuda_graphs.run` when it returns them, the eager path when it says None."
    ids, pos, meta = decode_step(runner, [[5, 6, 7], [8, 9]])
    with torch.inference_mode(): eager_h, eager_logits = runner.forward(ids, pos, meta, torch.arange(2))
    class Stub:
        def __init__(self, h): self.h, self.calls = h, 0
        def run(self, ids, pos, meta): self.calls += 1; return self.h
    runner.cuda_graphs = Stub(torch.ones(2, TINY.hidden_size))
    try:
        with torch.inference_mode(): h, logits = runner.forward(ids, pos, meta, torch.arange(2))
        assert runner.cuda_graphs.calls == 1 and torch.equal(h, torch.ones(2, TINY.hidden_size))
        assert torch.allclose(logits, runner.model.lm_head(h).float())
        runner.cuda_graphs = Stub(None)                               # not a graph step: the eager path
        with torch.inference_mode(): h, logits = runner.forward(ids, pos, meta, torch.arange(2))
        assert torch.allclose(h, eager_h, atol=1e-5) and torch.allclose(logits, eager_logits, atol=1e-5)
    finally: runner.cuda_graphs = None


@needs_interpreter
def test_replayed_decode_equals_eager_through_the_kernels(runner):
    graphs = DecodeGraphs(runner.hidden_states, runner.model, runner.kv_cache, max_batch=8, capture=capture_by_rerun)
    with torch.inference_mode():
        for prompts in ([[5, 6, 7]], [[1, 2], list(range(3, 14)), [20, 21, 22]]):
            ids, pos, meta = decode_step(runner, prompts)
            got, want = graphs.run(ids, pos, meta), runner.hidden_states(ids, pos, meta)
            assert got.shape == want.shape and (got - want).abs().max() < 1e-5
    assert sorted(graphs.graphs) == [1, 4] and graphs.replays == 2


@needs_interpreter
def test_engine_tokens_and_kv_with_replayed_steps():
    "A generation whose decode batch shrinks through buckets 4, 2, 1: the eager engine's tokens, K/V in the same slots."
    def generate(graphs: bool):
        eng = LLMEngine(random_model(TINY), None, EngineConfig(num_kv_blocks=32, block_size=4, enforce_eager=True))
        eng.runner.attention, eng.runner.numpy_decoder = TritonAttention(), None
        if graphs:
            eng.runner.cuda_graphs = DecodeGraphs(eng.runner.hidden_states, eng.model, eng.runner.kv_cache,
                                                  max_batch=4, capture=capture_by_rerun)
        for i in range(3):
            params = SamplingParams(temperature=0, max_tokens=2 + 2 * i, ignore_eos=True)
            eng.add_request([1 + i, 2, 3] * (i + 1), params)
        outs = {}
        while eng.has_unfinished():
            for o in eng.step():
                if o.finished: outs[o.request_id] = o.token_ids
        return [outs[k] for k in sorted(outs)], eng
    (want, e0), (got, e1) = generate(False), generate(True)
    assert got == want and sorted(e1.runner.cuda_graphs.graphs) == [1, 2, 4]
    for a, b in zip(e0.runner.kv_cache.k + e0.runner.kv_cache.v, e1.runner.kv_cache.k + e1.runner.kv_cache.v):
        assert torch.equal(a.abs().sum((-1, -2)) != 0, b.abs().sum((-1, -2)) != 0)    # padding wrote no slot
        assert (a - b).abs().max() < 1e-5
