"""Chapter 15d's C decode step against chapter 15's NumPy step (the torch path's agreement is tests/engine/
test_numpy_decode.py, which runs through the engine's default decoder): the same hidden states and K/V writes, for
GQA, q/k norms, biases, sliding windows and several rows of one sequence; where the C cannot run, the NumPy step."""
import pytest
import torch
from inferlab.model.config import ModelConfig
from inferlab.model.model import load_model
from inferlab.model.random_weights import random_model
from inferlab.model.sampling import SamplingParams
from inferlab.engine.llm_engine import LLMEngine, EngineConfig
from inferlab.engine.model_runner import NumpyDecoder, prepare_batch
from inferlab.engine.c_decode import CDecoder, decode_library

needs_lib = pytest.mark.skipif(decode_library()[0] is None, reason=f"no C library: {decode_library()[1]}")

def _engine(model, prompts, block_size=16, out=3):
    eng = LLMEngine(model, None, EngineConfig(block_size=block_size))
    for p in prompts: eng.add_request(p, SamplingParams(temperature=0, max_tokens=64, ignore_eos=True))
    while any(s.num_output_tokens < out for s in eng.requests.values()): eng.step()
    return eng

def _both(eng):
    "One decode-only step's hidden states and K/V, through C and through NumPy, from the same cache."
    batch = eng.scheduler.schedule()
    ids, pos, meta, _, _ = prepare_batch(batch, eng.config.block_size)
    cache, dec = eng.runner.kv_cache, eng.runner.numpy_decoder
    saved = [t.clone() for t in cache.k + cache.v]
    h_c = CDecoder.__call__(dec, ids, pos, meta)                            # 15d's own step (15f: one call)
    kv_c = [t.clone() for t in cache.k + cache.v]
    for t, s in zip(cache.k + cache.v, saved): t.copy_(s)
    h_np = NumpyDecoder.__call__(dec, ids, pos, meta)
    return h_c, h_np, max((a - b).abs().max().item() for a, b in zip(kv_c, cache.k + cache.v))

def _qwen_like(head_dim=16, seed=3, **overrides):
    "GQA, q/k norms, biases and sliding windows, its biases and norms far from their defaults (`overrides`: config)."
    cfg = dict(architecture="Qwen3ForCausalLM", vocab_size=300, hidden_size=64, intermediate_size=96,
               num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2, head_dim=head_dim,
               attention_bias=True, qk_norm=True, layer_windows=[None, 6, 9], max_position_embeddings=256)
    model = random_model(ModelConfig(**{**cfg, **overrides}), seed=seed)
    for m in model.modules():
        if getattr(m, "bias", None) is not None: m.bias.data.normal_(0, 0.5)
    for name, p in model.named_parameters():
        if "norm" in name: p.data.uniform_(0.5, 1.5)
    return model

@needs_lib
def test_tiny_dense_default_engine_decodes_in_c():
    eng = _engine(load_model(dtype=torch.float32), [list(range(5, 5 + n)) for n in (1, 15, 16, 17, 40, 70, 3)])
    assert isinstance(eng.runner.numpy_decoder, CDecoder) and eng.runner.numpy_decoder.c_off is None
    h_c, h_np, kv_err = _both(eng)
    assert (h_c - h_np).abs().max() < 1e-4 and kv_err < 1e-5
    assert (h_c - h_np.roll(1, 0)).abs().max() > 0.1                      # the check can tell rows apart

@needs_lib
def test_qk_norm_bias_windows_gqa():
    eng = _engine(_qwen_like(), [list(range(1, 1 + n)) for n in (2, 9, 13, 30)], block_size=4)
    h_c, h_np, kv_err = _both(eng)
    assert (h_c - h_np).abs().max() < 1e-4 and kv_err < 1e-5

def test_head_dim_not_multiple_of_8_takes_the_numpy_step():
    eng = _engine(_qwen_like(head_dim=12), [[1, 2, 3], [4, 5, 6, 7, 8]], block_size=4)
    dec = eng.runner.numpy_decoder
    assert isinstance(dec, CDecoder) and ("head_dim 12" in dec.c_off or decode_library()[0] is None)
    h_c, h_np, kv_err = _both(eng)
    assert torch.equal(h_c, h_np) and kv_err == 0                          # the same code ran

@needs_lib
def test_greedy_tokens_and_speculative_rows_match_numpy():
    "Rows of one sequence in one step (a verification) read each other's keys: the C writes them all first."
    from inferlab.llm import LLM
    prompts = ["def read_text(path):", "import os\n\ndef list_files(path):"]
    outs = []
    for dec in ("c", "numpy"):
        llm = LLM("tiny-dense", dtype="float32", speculative_config={"method": "ngram", "num_speculative_tokens": 4})
        if dec == "numpy": llm.engine.runner.numpy_decoder.c_off = "forced off for the test"
        outs.append([o.token_ids for o in llm.generate(prompts, SamplingParams(temperature=0, max_tokens=40))])
    assert outs[0] == outs[1]

def test_unwritable_cache_is_a_reason_not_a_crash(tmp_path):
    from inferlab.engine.c_decode import build_c_library
    blocker = tmp_path / "a-file"; blocker.write_text("")
    lib, why = build_c_library("x", "int x(void) { return 1; }", blocker / "cache")
    assert lib is None and why

def _paged_rows(B, H, Hkv, D, bs, longest, n_blocks, seed=0):
    g = torch.Generator().manual_seed(seed)
    kc, vc = (torch.randn(n_blocks, bs, Hkv, D, generator=g) for _ in range(2))
    lens = torch.randint(1, longest, (B,), generator=g, dtype=torch.int32)
    tables = torch.full((B, -(-int(lens.max()) // bs)), -1, dtype=torch.int32)
    for b, L in enumerate(lens.tolist()):
        n = -(-L // bs); tables[b, :n] = torch.randperm(n_blocks, generator=g)[:n].int()
    return torch.randn(B, H, D, generator=g), kc, vc, tables, lens

@needs_lib
@pytest.mark.parametrize("H,Hkv,D,bs,window", [(8, 2, 32, 16, None), (6, 3, 16, 5, 7), (4, 4, 8, 3, None),
                                                (8, 1, 64, 4, 20)])
def test_batch_attention_matches_the_reference(H, Hkv, D, bs, window):
    "Chapter 13's torch reference is the truth: GQA groups of 1-8, block sizes that are not powers of two, windows."
    from inferlab.engine.c_decode import CAttention
    from inferlab.engine.paged_attention import paged_decode_reference
    q, kc, vc, tables, lens = _paged_rows(23, H, Hkv, D, bs, 90, 400)
    att = CAttention(decode_library()[0])
    got, ref = att.decode(q, kc, vc, tables, lens, 0.3, window), paged_decode_reference(q, kc, vc, tables, lens, 0.3,
                                                                                          window)
    assert (got - ref).abs().max() < 2e-5
    assert (got - ref.roll(1, 0)).abs().max() > 0.05                       # the check can tell rows apart
    t0 = torch.get_num_threads()
    try:
        torch.set_num_threads(1); one = att.decode(q, kc, vc, tables, lens, 0.3, window)
        torch.set_num_threads(2); two = att.decode(q, kc, vc, tables, lens, 0.3, window)
    finally: torch.set_num_threads(t0)
    assert torch.equal(one, two)                                           # bits independent of the thread count
    assert torch.equal(att.decode(q[7:8], kc, vc, tables[7:8], lens[7:8], 0.3, window), one[7:8])   # and of neighbours

@needs_lib
def test_batched_steps_read_decode_rows_in_c_with_the_same_tokens():
    "Steps above 8 rows (and decodes beside a prompt's chunk) take the C rows; greedy tokens equal the reference's."
    from inferlab.engine.c_decode import CAttention
    from inferlab.engine.paged_attention import TorchAttention
    model = load_model(dtype=torch.float32)
    prompts = [list(range(3 + i, 3 + i + 5 + 7 * i)) for i in range(20)]
    outs = []
    for backend in ("c", "torch"):
        eng = LLMEngine(model, None, EngineConfig(max_num_seqs=16, max_num_batched_tokens=64))
        assert isinstance(eng.runner.attention, CAttention)
        eng.runner.numpy_decoder.takes = lambda rows, threads, aux_layers=(), prefill=False: rows <= 8 and not prefill
        if backend == "torch": eng.runner.attention = TorchAttention()
        ids = [eng.add_request(p, SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)) for p in prompts]
        done = {}
        while eng.has_unfinished(): done.update({o.request_id: o.token_ids for o in eng.step() if o.finished})
        outs.append([done[i] for i in ids])
    assert outs[0] == outs[1]
    fp8 = LLMEngine(model, None, EngineConfig(kv_cache_dtype="fp8"))
    assert not isinstance(fp8.runner.attention, CAttention)                 # a quantized cache keeps the reference

@needs_lib
def test_one_thread_sends_larger_float32_steps_here(monkeypatch):
    """At one thread a float32 decode-only step of any size runs on the C step (same greedy tokens as torch's path,
    logits from one OpenBLAS product); with two threads, or quantized layers, steps above 8 rows keep torch's path."""
    from inferlab.engine.cpu_threads import CpuThreads
    from inferlab.quant.presets import quantize_model
    model = load_model(dtype=torch.float32)
    prompts = [list(range(5 + i, 12 + 3 * i)) for i in range(12)]
    rows, real = [], CDecoder.__call__
    monkeypatch.setattr(CDecoder, "__call__", lambda self, ids, *a, **k: (rows.append(len(ids)), real(self, ids, *a,
                                                                                                        **k))[1])
    outs = []
    for here in (True, False):
        eng = LLMEngine(model, None, EngineConfig(max_num_seqs=16))
        eng.runner.threads = CpuThreads(max_threads=1)                      # as beside a busy neighbour
        if not here:                                                        # decode-only steps above 8 rows: torch
            eng.runner.numpy_decoder.takes = lambda rows, threads, aux=(), prefill=False: rows <= 8 and not prefill
        rows.clear()
        ids = [eng.add_request(p, SamplingParams(temperature=0, max_tokens=10, ignore_eos=True)) for p in prompts]
        done = {}
        while eng.has_unfinished(): done.update({o.request_id: o.token_ids for o in eng.step() if o.finished})
        outs.append([done[i] for i in ids])
        assert max(rows, default=0) == (12 if here else 0)                  # 12 decode rows a step, or torch's path
    assert outs[0] == outs[1]
    dec = eng.runner.numpy_decoder
    h = torch.randn(12, model.config.hidden_size, generator=torch.Generator().manual_seed(0))
    assert torch.allclose(dec.head(h), model.lm_head(h), atol=1e-4)         # the many-row lm_head
    assert CDecoder.takes(dec, 48, 1) and not CDecoder.takes(dec, 48, 2) and CDecoder.takes(dec, 8, 2)
    assert not CDecoder.takes(dec, 48, 1, aux_layers=(1, 3, 5))               # EAGLE-3 features: NumPy step
    assert not NumpyDecoder.takes(dec, 48, 1)                                # chapter 15's step: a few rows only
    w8 = LLMEngine(quantize_model(model, "w8a16"), None, EngineConfig()).runner.numpy_decoder
    assert w8.takes(8, 1) and not w8.takes(48, 1)
