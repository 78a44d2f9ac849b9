"""The engine checks of tools/gpu_check.py: CUDA-graph replay against the eager forward, the GPU engine's greedy tokens
against the CPU engine's, batch-1 decode of a random-weight 1B-class Llama in bf16 through `LLM(..., device="cuda")` as
MBU with and without CUDA graphs, and an offline batch throughput figure. The smoke run uses tiny models on CPU."""
from __future__ import annotations
import gc
import shutil
import statistics
import time
from pathlib import Path
import torch
from .common import Ctx, Row, rel_err

MBU_GOAL_PCT = 60.0       # batch-1 decode through the engine, with CUDA graphs: this share of the measured copy
# Llama-3.2-1B's shape (its config.json on the Hugging Face hub): 1.24 B parameters, 2.47 GB in bf16
LLAMA_1B = dict(architecture="LlamaForCausalLM", vocab_size=128256, hidden_size=2048, intermediate_size=8192,
                num_hidden_layers=16, num_attention_heads=32, num_key_value_heads=8, head_dim=64, rms_norm_eps=1e-5,
                rope_theta=500000.0, max_position_embeddings=131072, tie_word_embeddings=True, eos_token_id=0)
TINY_LLAMA = dict(architecture="LlamaForCausalLM", vocab_size=512, hidden_size=64, intermediate_size=128,
                  num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16, rms_norm_eps=1e-5,
                  max_position_embeddings=512, tie_word_embeddings=True, eos_token_id=0)
PROMPTS = ["import os\n\ndef list_files(path):", "class Config:\n    def __init__(self", "def read_text(path):",
           "for i in range(10):", "# Small helpers for files\nimport json\n", "def main(argv):"]


def free(ctx: Ctx):
    "Give back what the last engine held, so the next one measures on an empty device."
    gc.collect()
    if ctx.device.type == "cuda": torch.cuda.empty_cache()


def small_kv(ctx: Ctx) -> dict:
    "The smoke run's engines keep a 16 MiB KV pool: a loaded CI machine may have little memory to spare."
    return dict(kv_cache_memory=16 * 2**20) if ctx.smoke else {}


def random_checkpoint(ctx: Ctx, name: str, spec: dict, dtype: str) -> Path:
    """A random-weight checkpoint (PyTorch's default initialisation) with a word-level tokenizer over its whole
    vocabulary, made once in `ctx.workdir` and reused by later checks and their processes."""
    path = Path(ctx.workdir) / name
    if (path / "config.json").exists() and (path / "tokenizer.json").exists(): return path
    from tokenizers import Tokenizer, models, pre_tokenizers
    from inferlab.model.config import ModelConfig
    from inferlab.model.model import CausalLM, save_model
    cfg = ModelConfig(**spec, torch_dtype=dtype)
    torch.manual_seed(0)
    with torch.device(ctx.device): model = CausalLM(cfg)      # on the device: a 1B init takes seconds, not minutes
    tmp = path.with_name(path.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    save_model(model, tmp, dtype=dtype)
    tok = Tokenizer(models.WordLevel({f"t{i}": i for i in range(cfg.vocab_size)}, unk_token="t0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.save(str(tmp / "tokenizer.json"))
    del model; free(ctx)
    tmp.rename(path)                                          # whole or absent: a killed check leaves no half model
    return path


def time_forward(runner, ctx: Ctx) -> list:
    """Wrap `runner.forward` so each decode-only call is timed (CUDA events: the GPU's span from the call's first
    kernel to its last, launch gaps included); returns the list the (start, end) pairs go to."""
    inner, spans = runner.forward, []
    def forward(ids, pos, meta, logits_idx, sample=True, *rest):          # rest: aux_layers, when a speculator asks
        cuda = ctx.device.type == "cuda"
        start = torch.cuda.Event(enable_timing=True) if cuda else time.perf_counter()
        if cuda: start.record()
        out = inner(ids, pos, meta, logits_idx, sample, *rest)
        end = torch.cuda.Event(enable_timing=True) if cuda else time.perf_counter()
        if cuda: end.record()
        if meta.num_prefill_tokens == 0: spans.append((start, end))
        return out
    runner.forward = forward
    return spans


def spans_ms(spans: list, ctx: Ctx) -> list[float]:
    ctx.sync()
    return [s.elapsed_time(e) if ctx.device.type == "cuda" else (e - s) * 1e3 for s, e in spans]


def decode_step(runner, n: int, seed: int = 0, lens: tuple = (5, 60)):
    "Prefill `n` random prompts through a scheduler and `runner`, then pack the next step (all decodes): ids, pos, meta"
    from inferlab.engine.block_manager import BlockManager
    from inferlab.engine.scheduler import Scheduler, SchedulerConfig
    from inferlab.engine.sequence import Sequence
    from inferlab.engine.model_runner import prepare_batch, sample_batch
    from inferlab.model.sampling import SamplingParams
    sch = Scheduler(SchedulerConfig(max_num_seqs=n, max_num_batched_tokens=8192),
                    BlockManager(runner.kv_cache.num_blocks, runner.block_size))
    g = torch.Generator().manual_seed(seed)
    V = runner.model.config.vocab_size
    for _ in range(n):
        L = int(torch.randint(*lens, (1,), generator=g))
        sch.add(Sequence(torch.randint(1, V, (L,), generator=g).tolist(),
                         SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)))
    batch = sch.schedule()
    samplers, logits = runner.execute(batch); sch.update(batch)
    for s, t in zip(samplers, sample_batch(logits, samplers)): s.append_token(t)
    ids, pos, meta, _, _ = prepare_batch(sch.schedule(), runner.block_size, runner.device)
    return ids, pos, meta


def check_graphs(ctx: Ctx):
    """CUDA-graph replay against the eager forward on the same decode steps of tiny-dense (fp32): 1, 3, 17 and 64 rows,
    padded to their buckets; times of both. The smoke run replays a tiny random Llama by rerunning
    (`capture_by_rerun`) with the Triton kernels in the interpreter: the same buckets, padding and static buffers."""
    from inferlab.model.model import load_model
    from inferlab.engine.model_runner import ModelRunner, pack_model
    from inferlab.engine.cuda_graphs import DecodeGraphs, capture_by_rerun, bucket_for
    source = model_for(ctx)[0] if ctx.smoke else None            # smoke: the tiny random Llama; else tiny-dense
    model = pack_model(load_model(source, dtype=torch.float32, device=ctx.device))
    runner = ModelRunner(model, num_blocks=512, block_size=16)
    if ctx.smoke:
        from inferlab.engine.triton_attention import TritonAttention
        runner.attention = TritonAttention()
        runner.cuda_graphs = DecodeGraphs(runner.hidden_states, model, runner.kv_cache, capture=capture_by_rerun)
    if runner.cuda_graphs is None:
        yield Row("graphs", "decode steps replayed", False, dict(graphs_off=runner.graphs_off),
                  f"no graphs: {runner.graphs_off}"); return
    graphs = runner.cuda_graphs
    with torch.inference_mode():
        for n in ((1, 3) if ctx.smoke else (1, 3, 17, 64)):
            ids, pos, meta = decode_step(runner, n, seed=n, lens=(3, 12) if ctx.smoke else (5, 60))
            replays = graphs.replays
            h_graph = graphs.run(ids, pos, meta)
            h_eager = runner.hidden_states(ids, pos, meta)
            if h_graph is None:
                yield Row("graphs", f"{n} rows", False, dict(eager_reason=graphs.eager_reason(ids, meta)),
                          f"not replayed: {graphs.eager_reason(ids, meta)}"); continue
            err = rel_err(h_graph, h_eager)
            graph_ms = ctx.time_ms(lambda: graphs.run(ids, pos, meta))
            eager_ms = ctx.time_ms(lambda: runner.hidden_states(ids, pos, meta))
            b = bucket_for(n, graphs.sizes)
            yield Row("graphs", f"{n} rows (bucket {b})", bool(err <= 1e-4 and graphs.replays > replays),
                      dict(rows=n, bucket=b, rel_err=err, eager_ms=eager_ms, graph_ms=graph_ms,
                           speedup=eager_ms / max(graph_ms, 1e-9)),
                      f"rel err {err:8.1e} (tol 1e-04)  eager {eager_ms:7.3f} ms  graph {graph_ms:7.3f} ms "
                      f"({eager_ms / max(graph_ms, 1e-9):4.1f}x)")
    yield Row("graphs", "captured buckets", None, dict(buckets=sorted(graphs.graphs), off=graphs.off),
              f"{sorted(graphs.graphs)}; {graphs.replays} replays, {graphs.eager_steps} eager steps")


def check_greedy(ctx: Ctx):
    """tiny-dense's greedy tokens through `LLM` on the device (fp32, with CUDA graphs and eager) against the CPU
    engine's: identical sequences, or the first position where they part and how close the CPU model's two
    candidates were there (a near-tie flipped by summation order, or a real difference)."""
    from inferlab.llm import LLM
    from inferlab.model.model import load_model
    from inferlab.model.sampling import SamplingParams
    params = SamplingParams(temperature=0, max_tokens=8 if ctx.smoke else 48, ignore_eos=True)
    prompts = PROMPTS[:3] if ctx.smoke else PROMPTS
    def tokens(**kw):
        llm = LLM(dtype=torch.float32, **small_kv(ctx), **kw)
        try: return [o.token_ids for o in llm.generate(prompts, params)], llm.engine.runner.graphs_off, llm.tokenizer
        finally: del llm; free(ctx)
    cpu, _, tok = tokens(device="cpu")
    runs = {"CUDA graphs": tokens(device=ctx.device.type), "eager": tokens(device=ctx.device.type, enforce_eager=True)}
    reference = []                                  # the CPU model, loaded only if some sequence parts
    def gap(i: int, p: int, got: list, want: list) -> float:
        "CPU logit of the CPU's token minus that of the other's, at position p of sequence i."
        if not reference: reference.append(load_model(dtype=torch.float32, device="cpu"))
        ids = torch.tensor([tok.encode(prompts[i]) + want[i][:p]])
        with torch.inference_mode(): logits = reference[0](ids)[0, -1]
        return (logits[want[i][p]] - logits[got[i][p]]).item()
    for name, (toks, off, _) in runs.items():
        yield same_tokens(f"{ctx.device.type} ({name}) = CPU", toks, cpu, off, gap)
    yield same_tokens(f"{ctx.device.type}: CUDA graphs = eager", runs["CUDA graphs"][0], runs["eager"][0], None, None)


def same_tokens(case: str, got: list, want: list, graphs_off, gap=None) -> Row:
    "Sequences `got` against `want`: how many are identical, where the first pair parts (and the CPU's logit gap)."
    equal = sum(a == b for a, b in zip(got, want))
    first = next(((i, next((p for p, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b))))
                  for i, (a, b) in enumerate(zip(got, want)) if a != b), None)
    figs = dict(equal=equal, sequences=len(want), first_divergence=first, graphs_off=graphs_off)
    text = f"{equal}/{len(want)} sequences identical ({sum(map(len, want))} tokens)"
    if first:
        text += f"; sequence {first[0]} parts at token {first[1]}"
        i, p = first
        if gap is not None and p < min(len(got[i]), len(want[i])):
            figs["cpu_logit_gap"] = g = gap(i, p, got, want)
            text += f" (the CPU model's logits there differ by {g:.2e}: {'a near-tie' if abs(g) < 1e-3 else 'no tie'})"
    if graphs_off: text += f"  (graphs off: {graphs_off})"
    return Row("greedy", case, bool(equal == len(want) and len(got) == len(want)), figs, text)


def model_for(ctx: Ctx) -> tuple:
    "(checkpoint path, dtype, case name): the random 1B-class Llama in bf16 on a GPU, a tiny one in fp32 on CPU."
    if ctx.smoke: return random_checkpoint(ctx, "tiny-llama", TINY_LLAMA, "float32"), torch.float32, "tiny Llama fp32"
    return random_checkpoint(ctx, "llama-1b", LLAMA_1B, "bfloat16"), torch.bfloat16, "Llama 1B bf16"


def check_decode_1b(ctx: Ctx):
    """Batch-1 decode through `LLM(..., device=...)`, with CUDA graphs and with `enforce_eager=True`: tokens/s, the
    forward's own time (CUDA events), and MBU = bytes a step must read x tokens/s / the measured copy bandwidth."""
    from inferlab.llm import LLM
    from inferlab.model.sampling import SamplingParams
    from inferlab.frontier.bench import decode_bytes_per_token
    path, dtype, name = model_for(ctx)
    prompt_len, warm, steps = (16, 4, 16) if ctx.smoke else (128, 8, 256)
    rates = {}
    for eager in (False, True):
        llm = LLM(str(path), device=ctx.device.type, dtype=dtype, enforce_eager=eager, **small_kv(ctx))
        eng = llm.engine
        spans = time_forward(eng.runner, ctx)
        g = torch.Generator().manual_seed(0)
        prompt = torch.randint(1, eng.model.config.vocab_size, (prompt_len,), generator=g).tolist()
        eng.add_request(prompt, SamplingParams(temperature=0, max_tokens=warm + steps + 4, ignore_eos=True))
        for _ in range(warm): eng.step()                    # prefill, then decodes: compiled and captured
        spans_ms(spans, ctx); spans.clear()
        t = time.perf_counter()
        for _ in range(steps): eng.step()
        ctx.sync(); dt = time.perf_counter() - t
        fwd_ms = statistics.median(spans_ms(spans, ctx))
        while eng.has_unfinished(): eng.step()
        nbytes = decode_bytes_per_token(eng.model, prompt_len + warm + steps // 2)
        tok_s = steps / dt
        mbu, fwd_mbu = (100 * nbytes / 1e9 / s / ctx.roofline_gbps for s in (1 / tok_s, fwd_ms * 1e-3))
        graphs = eng.runner.cuda_graphs
        replays = graphs.replays if graphs is not None else 0
        rates[eager] = tok_s
        figs = dict(tok_s=tok_s, step_ms=1e3 / tok_s, forward_ms=fwd_ms, mbu_pct=mbu, forward_mbu_pct=fwd_mbu,
                    bytes_per_token=nbytes, replays=replays, graphs_off=eng.runner.graphs_off)
        text = (f"{tok_s:7.1f} tok/s  step {1e3 / tok_s:6.3f} ms  forward {fwd_ms:6.3f} ms  MBU {mbu:4.1f}% "
                f"(forward alone {fwd_mbu:4.1f}%) of {ctx.roofline_gbps:.0f} GB/s, {nbytes / 1e9:.2f} GB/token")
        if eager: row = Row("decode_1b", f"{name}, batch 1, eager", None, figs, text)
        else:   # with graphs on a GPU every timed step must have been replayed
            ok = None if ctx.device.type != "cuda" else bool(graphs is not None and replays >= steps and not graphs.off)
            row = Row("decode_1b", f"{name}, batch 1, CUDA graphs", ok, figs,
                      text + (f"  ({replays} replays)" if graphs else f"  (graphs off: {eng.runner.graphs_off})"),
                      f"MBU >= {MBU_GOAL_PCT:.0f}% of copy", None if ctx.smoke else bool(mbu >= MBU_GOAL_PCT))
        yield row
        del llm, eng; free(ctx)
    yield Row("decode_1b", f"{name}, batch 1: graphs / eager", None, dict(speedup=rates[False] / rates[True]),
              f"{rates[False] / rates[True]:.2f}x tokens/s")


def check_throughput(ctx: Ctx):
    "Offline batch throughput through `LLM.generate`: many prompts at once, greedy, a fixed number of tokens each."
    from inferlab.llm import LLM
    from inferlab.model.sampling import SamplingParams
    path, dtype, name = model_for(ctx)
    n, prompt_len, out_len = (8, 16, 8) if ctx.smoke else (256, 128, 128)
    kw = small_kv(ctx) if ctx.smoke else dict(max_num_seqs=n, max_num_batched_tokens=8192, kv_cache_memory=4 * 2**30)
    llm = LLM(str(path), device=ctx.device.type, dtype=dtype, **kw)
    V = llm.engine.model.config.vocab_size
    g = torch.Generator().manual_seed(1)
    warm = [torch.randint(1, V, (8,), generator=g).tolist() for _ in range(n)]
    llm.generate(warm, SamplingParams(temperature=0, max_tokens=3, ignore_eos=True))   # compile, capture n's bucket
    prompts = [torch.randint(1, V, (prompt_len,), generator=g).tolist() for _ in range(n)]
    steps0 = llm.engine.num_steps
    ctx.sync(); t = time.perf_counter()
    outs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=out_len, ignore_eos=True))
    ctx.sync(); dt = time.perf_counter() - t
    made = sum(len(o.token_ids) for o in outs)
    graphs = llm.engine.runner.cuda_graphs
    figs = dict(prompts=n, prompt_tokens=n * prompt_len, output_tokens=made, seconds=dt, output_tok_s=made / dt,
                total_tok_s=(made + n * prompt_len) / dt, steps=llm.engine.num_steps - steps0,
                replays=graphs.replays if graphs else 0)
    yield Row("throughput", f"{name}, {n} prompts x {prompt_len} -> {out_len}", bool(made == n * out_len), figs,
              f"{made / dt:8.0f} output tok/s  {(made + n * prompt_len) / dt:8.0f} total tok/s  {dt:6.2f} s, "
              f"{figs['steps']} steps")
    del llm; free(ctx)


CHECKS = {"graphs": check_graphs, "greedy": check_greedy, "decode_1b": check_decode_1b, "throughput": check_throughput}
