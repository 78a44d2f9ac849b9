#!/usr/bin/env python
"""GPU check: every Triton kernel against its torch reference on realistic shapes, with times and rooflines.

    python tools/gpu_check.py                      # all checks on the first CUDA device (H200 peak: 4800 GB/s)
    python tools/gpu_check.py --peak-gbps 3350     # another GPU's peak memory bandwidth (H100 SXM)
    python tools/gpu_check.py --only decode,store_kv
    python tools/gpu_check.py --only decode_kv8               # decode over fp8 / int8 KV blocks
    python tools/gpu_check.py --only w4a16,w8a16,w8a8,nvfp4   # the quantized matmuls (chapter 24)
    python tools/gpu_check.py --interpret-smoke    # no GPU: the same code on tiny shapes in Triton's interpreter

Each check prints one line per case: max |kernel - reference|, PASS/FAIL against the dtype's tolerance, the kernel's
and the reference's time (CUDA events, after warm-up) and what the kernel achieves against the device's roofline
(GB/s for memory-bound kernels, TFLOP/s for compute-bound ones). Exit status: 0 all pass, 1 a case failed, 2 no CUDA.

A new kernel (e.g. a quantized matmul) adds one function decorated with `@check("name")` that yields `Row`s; see
`check_decode` for the pattern. The whole run is sized to finish in well under 5 minutes on one GPU.
"""
from __future__ import annotations
import argparse
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

if "--interpret-smoke" in sys.argv:       # Triton reads this when first imported: before anything imports it
    os.environ["TRITON_INTERPRET"] = "1"

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # run from a checkout without installing
import torch
from inferlab.model.hardware import H200      # the default peaks: chapter 09's datasheet table

TOL = {torch.float32: 1e-3, torch.float16: 5e-3, torch.bfloat16: 3e-2}   # max abs error; outputs reach ~4, where
                                                                          # a bf16 ulp is 0.03 and an fp16 ulp 0.004


@dataclass
class Ctx:
    "What every check gets: the device, the rooflines, and whether this is the tiny CPU smoke run."
    device: torch.device
    peak_gbps: float
    peak_tflops: float
    smoke: bool

    def time_ms(self, fn, warmup: int = 3, iters: int = 10) -> float:
        "Mean milliseconds per call of `fn` (CUDA events on a GPU; one wall-clock call in the smoke run)."
        if self.smoke:
            t = time.perf_counter(); fn(); return (time.perf_counter() - t) * 1e3
        for _ in range(warmup): fn()
        torch.cuda.synchronize(self.device)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(iters): fn()
        end.record(); torch.cuda.synchronize(self.device)
        return start.elapsed_time(end) / iters


@dataclass
class Row:
    "One checked case."
    check: str
    case: str
    dtype: torch.dtype
    max_err: float
    tol: float
    kernel_ms: float
    ref_ms: float
    gbps: float | None = None       # achieved bytes / kernel time (memory-bound kernels)
    tflops: float | None = None     # achieved FLOPs / kernel time (compute-bound kernels)
    note: str = ""                  # anything else worth printing (e.g. the time of an unquantized baseline)

    @property
    def passed(self) -> bool: return self.max_err <= self.tol      # NaN fails

    def line(self, ctx: Ctx) -> str:
        dt = str(self.dtype).replace("torch.", "")
        s = (f"{'PASS' if self.passed else 'FAIL'}  {self.check:9} {self.case:44} {dt:8} err {self.max_err:8.1e} "
             f"(tol {self.tol:.0e})  kernel {self.kernel_ms:8.3f} ms  torch {self.ref_ms:8.3f} ms "
             f"({self.ref_ms / max(self.kernel_ms, 1e-9):5.1f}x)")
        if self.gbps is not None: s += f"  {self.gbps:7.0f} GB/s = {self.gbps / ctx.peak_gbps:4.0%} of peak"
        if self.tflops is not None: s += f"  {self.tflops:6.1f} TFLOP/s = {self.tflops / ctx.peak_tflops:4.0%} of peak"
        return s + self.note


CHECKS: dict = {}

def check(name: str):
    "Register a check: a function `(ctx) -> iterable of Row`."
    def register(fn): CHECKS[name] = fn; return fn
    return register


def max_err(a: torch.Tensor, b: torch.Tensor) -> float: return (a.float() - b.float()).abs().max().item()


def copy_bandwidth_gbps(ctx: Ctx) -> float:
    "Measured device-to-device copy bandwidth: bytes read + written per second."
    n = (1 << 12) if ctx.smoke else (1 << 30)                 # 1 GiB on the GPU
    src = torch.empty(n, dtype=torch.uint8, device=ctx.device)
    dst = torch.empty_like(src)
    ms = ctx.time_ms(lambda: dst.copy_(src), warmup=3, iters=20)
    return 2 * n / (ms * 1e-3) / 1e9


def paged_inputs(ctx: Ctx, seq_lens: list[int], q_lens: list[int], hq: int, hkv: int, d: int, bs: int, dtype,
                 seed: int = 0):
    "Random queries and a paged pool (shuffled block ids, -1 padded tables) for the given lengths, on the device."
    g = torch.Generator(device=ctx.device).manual_seed(seed)
    n_blocks = [-(-L // bs) for L in seq_lens]
    pool = sum(n_blocks) + 8
    perm = torch.randperm(pool, device=ctx.device, generator=g).int()
    tables = torch.full((len(seq_lens), max(n_blocks)), -1, dtype=torch.int32, device=ctx.device)
    used = 0
    for i, n in enumerate(n_blocks): tables[i, :n] = perm[used:used + n]; used += n
    kc = torch.randn(pool, bs, hkv, d, device=ctx.device, generator=g).to(dtype)
    vc = torch.randn(pool, bs, hkv, d, device=ctx.device, generator=g).to(dtype)
    q = torch.randn(sum(q_lens), hq, d, device=ctx.device, generator=g).to(dtype)
    cu = torch.tensor([0] + list(q_lens), device=ctx.device).cumsum(0).int()
    return q, kc, vc, tables, cu, torch.tensor(seq_lens, dtype=torch.int32, device=ctx.device)


def ragged_lengths(ctx: Ctx, n: int, lo: int, hi: int, seed: int = 0) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(lo, hi + 1, (n,), generator=g).tolist()


# ------------------------------------------------------------------------------------------------------- the checks

@check("store_kv")
def check_store_kv(ctx: Ctx):
    from inferlab.engine.paged_attention import store_kv_reference
    from inferlab.engine.triton_attention import store_kv_triton
    T, hkv, d, bs = (40, 2, 32, 16) if ctx.smoke else (16384, 8, 128, 16)
    for dtype in (torch.bfloat16, torch.float32):
        pool = T // bs + 4
        kc, vc = (torch.zeros(pool, bs, hkv, d, dtype=dtype, device=ctx.device) for _ in range(2))
        kc2, vc2 = kc.clone(), vc.clone()
        k, v = (torch.randn(T, hkv, d, device=ctx.device).to(dtype) for _ in range(2))
        slots = torch.randperm(pool * bs, device=ctx.device)[:T]
        slots[::7] = -1                                           # tokens not to write
        store_kv_reference(k, v, kc, vc, slots); store_kv_triton(k, v, kc2, vc2, slots)
        err = max(max_err(kc, kc2), max_err(vc, vc2))
        ms = ctx.time_ms(lambda: store_kv_triton(k, v, kc2, vc2, slots))
        ref_ms = ctx.time_ms(lambda: store_kv_reference(k, v, kc, vc, slots))
        moved = 2 * 2 * T * hkv * d * k.element_size()              # K and V, read and written
        yield Row("store_kv", f"{T} tokens, Hkv {hkv}, D {d}", dtype, err, 0.0, ms, ref_ms,
                  gbps=moved / (ms * 1e-3) / 1e9)


def decode_cases(ctx: Ctx):
    "(name, seq_lens, hq, hkv, d, block size, window, splits); splits None = the kernel's own choice."
    if ctx.smoke:
        return [("ragged, group 2", [1, 16, 45], 4, 2, 32, 16, None, None),
                ("group 4, block 32, window 20", [50, 7], 4, 1, 64, 32, 20, 2)]
    return [("B=64 ctx 1-4k ragged, Hq 32 Hkv 8 D 128", ragged_lengths(ctx, 64, 1, 4096), 32, 8, 128, 16, None, None),
            ("B=64 ctx 4096, Hq 32 Hkv 8 D 128", [4096] * 64, 32, 8, 128, 16, None, None),
            ("B=4 ctx 4096 (split-K)", [4096] * 4, 32, 8, 128, 16, None, None),
            ("B=64 ctx 1-4k, block 32, window 1024", ragged_lengths(ctx, 64, 1, 4096, 1), 32, 8, 128, 32, 1024, None),
            ("B=64 ctx 1-2k, Hq 8 Hkv 4 D 64 (no GQA pad)", ragged_lengths(ctx, 64, 1, 2048, 2), 8, 8, 64, 16, None, None)]


@check("decode")
def check_decode(ctx: Ctx):
    from inferlab.engine.paged_attention import paged_decode_reference
    from inferlab.engine.triton_attention import paged_decode_triton, decode_num_splits
    for name, lens, hq, hkv, d, bs, window, splits in decode_cases(ctx):
        for dtype in (torch.bfloat16, torch.float32):
            q, kc, vc, bt, _, sl = paged_inputs(ctx, lens, [1] * len(lens), hq, hkv, d, bs, dtype)
            args = (q, kc, vc, bt, sl, d ** -0.5, window)
            out = paged_decode_triton(*args, num_splits=splits)
            err = max_err(out, paged_decode_reference(*args))
            ms = ctx.time_ms(lambda: paged_decode_triton(*args, num_splits=splits))
            ref_ms = ctx.time_ms(lambda: paged_decode_reference(*args), iters=3)
            read = [min(L, window) if window else L for L in lens]
            moved = 2 * sum(read) * hkv * d * kc.element_size() + 2 * q.numel() * q.element_size()
            n_split = splits or decode_num_splits(len(lens), hkv, bt.shape[1] * bs, q.device)
            yield Row("decode", f"{name}, {n_split} split{'s' * (n_split > 1)}", dtype, err, TOL[dtype], ms, ref_ms,
                      gbps=moved / (ms * 1e-3) / 1e9)


@check("decode_kv8")
def check_decode_kv8(ctx: Ctx):
    "Paged decode over 8-bit KV blocks (fp8 E4M3 needs sm89+, int8 any GPU): codes x per-head scale on read."
    from inferlab.engine.paged_attention import paged_decode_reference, kv_quantize, kv_scale
    from inferlab.engine.triton_attention import paged_decode_triton
    name, lens, hq, hkv, d, bs, window, splits = decode_cases(ctx)[0]
    for code in (torch.float8_e4m3fn, torch.int8):
        q, kc, vc, bt, _, sl = paged_inputs(ctx, lens, [1] * len(lens), hq, hkv, d, bs, torch.bfloat16)
        ks, vs = kv_scale(kc, code), kv_scale(vc, code)
        kq, vq = (kv_quantize(t.view(-1, hkv, d), s, code).view(t.shape) for t, s in ((kc, ks), (vc, vs)))
        kn, vn = (torch.randn(len(lens), hkv, d, device=ctx.device).to(torch.bfloat16) for _ in range(2))
        args = (q, kq, vq, bt, sl, d ** -0.5, window, ks, vs, kn, vn)
        out = paged_decode_triton(*args, num_splits=splits)
        err = max_err(out, paged_decode_reference(*args[:7], None, *args[7:]))
        ms = ctx.time_ms(lambda: paged_decode_triton(*args, num_splits=splits))
        ref_ms = ctx.time_ms(lambda: paged_decode_reference(*args[:7], None, *args[7:]), iters=3)
        moved = 2 * sum(lens) * hkv * d * 1 + 2 * q.numel() * q.element_size()
        yield Row("decode_kv8", f"{name}, {str(code).replace('torch.', '')} blocks", torch.bfloat16, err,
                  TOL[torch.bfloat16], ms, ref_ms, gbps=moved / (ms * 1e-3) / 1e9)


def prefill_cases(ctx: Ctx):
    "(name, seq_lens, q_lens, hq, hkv, d, block size, window)."
    if ctx.smoke:
        return [("cached prefix + full, group 2", [37, 20], [5, 20], 4, 2, 32, 16, None),
                ("window 9", [40], [40], 2, 1, 64, 32, 9)]
    return [("4 x 2k full prompts, Hq 32 Hkv 8 D 128", [2048] * 4, [2048] * 4, 32, 8, 128, 16, None),
            ("chunks after cached prefixes (1-4k)", [4096, 3000, 1500, 1024], [512, 1000, 1500, 256], 32, 8, 128, 16,
             None),
            ("2 x 4k, block 32, window 1024", [4096, 4096], [4096, 2048], 32, 8, 128, 32, 1024)]


def prefill_flops(seq_lens, q_lens, hq, d, window) -> float:
    "Useful FLOPs (q k^T and p v) of the causal, windowed attention: 4 * visible keys * Hq * D per query."
    total = 0
    for L, n in zip(seq_lens, q_lens):
        for p in range(L - n, L):
            total += min(p + 1, window) if window else p + 1
    return 4.0 * total * hq * d


@check("prefill")
def check_prefill(ctx: Ctx):
    from inferlab.engine.paged_attention import paged_prefill_reference
    from inferlab.engine.triton_attention import paged_prefill_triton
    for name, lens, q_lens, hq, hkv, d, bs, window in prefill_cases(ctx):
        flops = prefill_flops(lens, q_lens, hq, d, window)
        for dtype in (torch.bfloat16, torch.float32):
            q, kc, vc, bt, cu, sl = paged_inputs(ctx, lens, q_lens, hq, hkv, d, bs, dtype)
            args = (q, kc, vc, bt, cu, sl, d ** -0.5, window)
            out = paged_prefill_triton(*args)
            err = max_err(out, paged_prefill_reference(*args))
            ms = ctx.time_ms(lambda: paged_prefill_triton(*args))
            ref_ms = ctx.time_ms(lambda: paged_prefill_reference(*args), iters=3)
            yield Row("prefill", name, dtype, err, TOL[dtype], ms, ref_ms, tflops=flops / (ms * 1e-3) / 1e12)


# ------------------------------------------------------------------------------- quantized matmuls (chapter 24)

QTOL = {torch.float32: 1e-4, torch.float16: 5e-3, torch.bfloat16: 2e-2}   # max |kernel - ref| / max |ref|: a few
                                                                           # ulps of the output dtype, at any K


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.float() - b.float()).abs().max() / b.float().abs().max().clamp(min=1e-30)).item()


def quant_cases(ctx: Ctx):
    "(name, M, N, K): decode GEMVs of a 7-8B model's projections, and one prefill GEMM."
    if ctx.smoke:
        return [("M=1, N 48, K 200 (K tail)", 1, 48, 200), ("M=5, N 64, K 96", 5, 64, 96)]
    return [("decode M=1, 4096x4096 (q/o)", 1, 4096, 4096), ("decode M=16, 4096x4096", 16, 4096, 4096),
            ("decode M=1, 14336x4096 (up)", 1, 14336, 4096), ("decode M=16, 4096x14336 (down)", 16, 4096, 14336),
            ("prefill M=2048, 4096x4096", 2048, 4096, 4096)]


def quant_layer(ctx: Ctx, weights: str, N: int, K: int, activations=None, seed: int = 0):
    "A QuantLinear quantized (round to nearest) on the device from random N(0, 0.02) weights."
    from inferlab.quant.quantize import QuantLinear
    torch.manual_seed(seed)
    lin = torch.nn.Linear(K, N, bias=False, device=ctx.device)
    with torch.no_grad(): lin.weight.normal_(0, 0.02)
    return QuantLinear.from_linear(lin, weights, activations)


def quant_rows(ctx: Ctx, check_name: str, weights: str, activations, kernel, reference):
    "One Row per case and dtype: the kernel against its reference; decode in GB/s, prefill in TFLOP/s."
    for name, M, N, K in quant_cases(ctx):
        q = quant_layer(ctx, weights, N, K, activations)
        w16 = None if ctx.smoke else q.dequantize().to(torch.bfloat16)   # the unquantized layer, for comparison
        for dtype in ((torch.float32, torch.bfloat16) if ctx.smoke else (torch.bfloat16, torch.float16)):
            x = torch.randn(M, K, device=ctx.device).to(dtype)
            err = rel_err(kernel(q, x), reference(q, x))
            ms = ctx.time_ms(lambda: kernel(q, x))
            ref_ms = ctx.time_ms(lambda: reference(q, x), iters=3)
            note = ""
            if w16 is not None and dtype == torch.bfloat16:
                bf_ms = ctx.time_ms(lambda: torch.nn.functional.linear(x, w16))
                note = f"  | bf16 F.linear {bf_ms:.3f} ms: kernel {bf_ms / ms:.2f}x"
            moved = q.nbytes() + x.numel() * x.element_size() + M * N * x.element_size()
            prefill = M >= 256
            yield Row(check_name, f"{weights}{' A:' + activations if activations else ''} {name}", dtype, err,
                      QTOL[dtype], ms, ref_ms, gbps=None if prefill else moved / (ms * 1e-3) / 1e9,
                      tflops=2 * M * N * K / (ms * 1e-3) / 1e12 if prefill else None, note=note)


@check("w4a16")
def check_w4a16(ctx: Ctx):
    from inferlab.quant.kernels import w4a16_matmul_reference, w4a16_matmul_triton
    for fmt in ("int4-g128", "int4-g32"):
        yield from quant_rows(ctx, "w4a16", fmt, None,
                              lambda q, x: w4a16_matmul_triton(x, q.qweight, q.scale, q.spec.group_size),
                              lambda q, x: w4a16_matmul_reference(x, q.qweight, q.scale, q.spec.group_size))


@check("w8a16")
def check_w8a16(ctx: Ctx):
    from inferlab.quant.kernels import w8a16_matmul_reference, w8a16_matmul_triton
    for fmt in ("fp8", "int8"):
        yield from quant_rows(ctx, "w8a16", fmt, None, lambda q, x: w8a16_matmul_triton(x, q.qweight, q.scale),
                              lambda q, x: w8a16_matmul_reference(x, q.qweight, q.scale))


@check("w8a8")
def check_w8a8(ctx: Ctx):
    """int8 x int8 -> int32 tensor cores; the kernel's time includes quantizing the activations (torch), and its
    peak is the INT8 one, twice --peak-tflops (the printed % is against the bf16 peak)."""
    from inferlab.quant.kernels import w8a8_matmul_reference, w8a8_matmul_triton
    yield from quant_rows(ctx, "w8a8", "int8", "int8", lambda q, x: w8a8_matmul_triton(x, q.qweight, q.scale),
                          lambda q, x: w8a8_matmul_reference(x, q.qweight, q.scale))


@check("nvfp4")
def check_nvfp4(ctx: Ctx):
    from inferlab.quant.kernels import nvfp4_matmul_reference, nvfp4_matmul_triton
    yield from quant_rows(ctx, "nvfp4", "nvfp4", None,
                          lambda q, x: nvfp4_matmul_triton(x, q.qweight, q.scale, q.tensor_scale),
                          lambda q, x: nvfp4_matmul_reference(x, q.qweight, q.scale, q.tensor_scale))


# ------------------------------------------------------------------------------------------------------------- main

def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--peak-gbps", type=float, default=H200.mem_gbps,
                   help=f"peak memory bandwidth, GB/s (H200: {H200.mem_gbps:.0f})")
    p.add_argument("--peak-tflops", type=float, default=H200.bf16_tflops,
                   help=f"peak dense bf16 TFLOP/s (H200: {H200.bf16_tflops:.0f})")
    p.add_argument("--only", default="", help=f"comma-separated subset of: {', '.join(CHECKS)}")
    p.add_argument("--interpret-smoke", action="store_true",
                   help="no GPU needed: run every check on tiny shapes in Triton's interpreter (tests this script)")
    a = p.parse_args(argv)
    names = [n for n in a.only.split(",") if n] or list(CHECKS)
    unknown = [n for n in names if n not in CHECKS]
    if unknown: p.error(f"unknown check(s) {unknown}; known: {list(CHECKS)}")
    if a.interpret_smoke:
        from inferlab.engine.triton_runtime import interpreter_ready
        if not interpreter_ready(): print("triton was imported before TRITON_INTERPRET=1 could be set"); return 2
        ctx = Ctx(torch.device("cpu"), a.peak_gbps, a.peak_tflops, smoke=True)
        print("interpreter smoke run: tiny shapes on the CPU; times and bandwidths mean nothing")
    elif not torch.cuda.is_available():
        print("gpu_check: no CUDA device visible (torch.cuda.is_available() is False); nothing to check. "
              "Run it on a GPU machine, or with --interpret-smoke for a tiny CPU run through Triton's interpreter.")
        return 2
    else:
        ctx = Ctx(torch.device("cuda"), a.peak_gbps, a.peak_tflops, smoke=False)
        import triton
        print(f"{torch.cuda.get_device_name(ctx.device)}, torch {torch.__version__}, triton {triton.__version__}; "
              f"peak {a.peak_gbps:.0f} GB/s, {a.peak_tflops:.0f} TFLOP/s (bf16)")
    copy = copy_bandwidth_gbps(ctx)
    print(f"measured copy bandwidth: {copy:.0f} GB/s = {copy / a.peak_gbps:.0%} of the {a.peak_gbps:.0f} GB/s peak")
    t0, failed, rows = time.perf_counter(), 0, 0
    for name in names:
        try:
            for row in CHECKS[name](ctx):
                print(row.line(ctx), flush=True); rows += 1; failed += not row.passed
        except Exception as e:                       # a crashing kernel is a failure, and the other checks still run
            print(f"FAIL  {name:9} raised {type(e).__name__}: {e}", flush=True); failed += 1
    print(f"{rows} cases, {failed} failed, {time.perf_counter() - t0:.0f} s")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
