"""The kernel checks of tools/gpu_check.py: the device and its copy bandwidth, then every Triton kernel against its
torch reference on realistic shapes (tiny ones in the smoke run), with times and rooflines."""
from __future__ import annotations
import platform
import torch
from .common import Ctx, Row, kernel_row, max_err, rel_err

TOL = {torch.float32: 1e-3, torch.float16: 5e-3, torch.bfloat16: 3e-2}   # max abs error; outputs reach ~4, where
                                                                          # a bf16 ulp is 0.03 and an fp16 ulp 0.004
QTOL = {torch.float32: 1e-4, torch.float16: 5e-3, torch.bfloat16: 2e-2}   # max |kernel - ref| / max |ref|: a few
                                                                           # ulps of the output dtype, at any K
DECODE_GOAL_PCT = 80.0    # paged decode attention over 1 GB of KV: this share of the measured copy bandwidth


def check_copy(ctx: Ctx):
    "The machine, then the device-to-device copy bandwidth (bytes read + written per second): the roofline used below."
    env = dict(python=platform.python_version(), torch=torch.__version__, device=str(ctx.device))
    try:
        import triton
        env["triton"] = triton.__version__
    except ImportError: env["triton"] = None
    if ctx.device.type == "cuda":
        p = torch.cuda.get_device_properties(ctx.device)
        env.update(name=p.name, sm_count=p.multi_processor_count, memory_gib=round(p.total_memory / 2**30, 1),
                   capability=f"{p.major}.{p.minor}", cuda=torch.version.cuda)
    yield Row("copy", "environment", None, env, " ".join(f"{k}={v}" for k, v in env.items()))
    n = (1 << 20) if ctx.smoke else (1 << 30)                  # 1 GiB on the GPU: far past its L2
    src = torch.randint(0, 255, (n,), dtype=torch.uint8, device=ctx.device)
    dst = torch.empty_like(src)
    ms = ctx.time_ms(lambda: dst.copy_(src), warmup=3, iters=20)
    gbps = 2 * n / (ms * 1e-3) / 1e9
    ctx.copy_gbps = gbps
    yield Row("copy", f"device-to-device copy, {n / 2**20:g} MiB", bool(torch.equal(src, dst)),
              dict(gbps=gbps, ms=ms, pct_of_peak=100 * gbps / ctx.peak_gbps),
              f"{gbps:7.0f} GB/s = {gbps / ctx.peak_gbps:4.0%} of the {ctx.peak_gbps:.0f} GB/s datasheet peak")


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


def ragged_lengths(n: int, lo: int, hi: int, seed: int = 0) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(lo, hi + 1, (n,), generator=g).tolist()


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
        yield kernel_row(ctx, "store_kv", f"{T} tokens, Hkv {hkv}, D {d}", dtype, err, 0.0, ms, ref_ms,
                         gbps=moved / (ms * 1e-3) / 1e9)


def decode_cases(ctx: Ctx):
    "(name, seq_lens, hq, hkv, d, block size, window, splits, goal?); splits None = the kernel's own choice."
    if ctx.smoke:
        return [("ragged, group 2", [1, 16, 45], 4, 2, 32, 16, None, None, False),
                ("B=4 ctx 64 (the goal's case, tiny)", [64] * 4, 4, 2, 32, 16, None, None, True),
                ("group 4, block 32, window 20", [50, 7], 4, 1, 64, 32, 20, 2, False)]
    return [("B=64 ctx 1-4k ragged, Hq 32 Hkv 8 D 128", ragged_lengths(64, 1, 4096), 32, 8, 128, 16, None, None, False),
            ("B=64 ctx 4096, Hq 32 Hkv 8 D 128", [4096] * 64, 32, 8, 128, 16, None, None, True),
            ("B=4 ctx 4096 (split-K)", [4096] * 4, 32, 8, 128, 16, None, None, False),
            ("B=64 ctx 1-4k, block 32, window 1024", ragged_lengths(64, 1, 4096, 1), 32, 8, 128, 32, 1024, None, False),
            ("B=64 ctx 1-2k, Hq 8 Hkv 8 D 64 (no GQA pad)", ragged_lengths(64, 1, 2048, 2), 8, 8, 64, 16, None, None,
             False)]


def check_decode(ctx: Ctx):
    """Paged decode attention: error against the reference, and the HBM bandwidth it reaches (K and V of every
    sequence read once); the 1 GB bf16 case carries the goal."""
    from inferlab.engine.paged_attention import paged_decode_reference
    from inferlab.engine.triton_attention import paged_decode_triton, decode_num_splits
    for name, lens, hq, hkv, d, bs, window, splits, goal in decode_cases(ctx):
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
            yield kernel_row(ctx, "decode", f"{name}, {n_split} split{'s' * (n_split > 1)}", dtype, err, TOL[dtype], ms,
                             ref_ms, gbps=moved / (ms * 1e-3) / 1e9,
                             goal_pct=DECODE_GOAL_PCT if goal and dtype == torch.bfloat16 else None)


def check_decode_kv8(ctx: Ctx):
    "Paged decode over 8-bit KV blocks (fp8 E4M3 needs sm89+, int8 any GPU): codes x per-head scale on read."
    from inferlab.engine.paged_attention import paged_decode_reference, kv_quantize, kv_scale
    from inferlab.engine.triton_attention import paged_decode_triton
    name, lens, hq, hkv, d, bs, window, splits, _ = decode_cases(ctx)[0]
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
        yield kernel_row(ctx, "decode_kv8", f"{name}, {str(code).replace('torch.', '')} blocks", torch.bfloat16, err,
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
            yield kernel_row(ctx, "prefill", name, dtype, err, TOL[dtype], ms, ref_ms,
                             tflops=flops / (ms * 1e-3) / 1e12)


# ------------------------------------------------------------------------------- quantized matmuls (chapter 24)

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
    "One row per case and dtype: the kernel against its reference; decode in GB/s, prefill in TFLOP/s."
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
            yield kernel_row(ctx, check_name, f"{weights}{' A:' + activations if activations else ''} {name}", dtype,
                             err, QTOL[dtype], ms, ref_ms, gbps=None if prefill else moved / (ms * 1e-3) / 1e9,
                             tflops=2 * M * N * K / (ms * 1e-3) / 1e12 if prefill else None, note=note)


def check_w4a16(ctx: Ctx):
    from inferlab.quant.kernels import w4a16_matmul_reference, w4a16_matmul_triton
    for fmt in ("int4-g128", "int4-g32"):
        yield from quant_rows(ctx, "w4a16", fmt, None,
                              lambda q, x: w4a16_matmul_triton(x, q.qweight, q.scale, q.spec.group_size),
                              lambda q, x: w4a16_matmul_reference(x, q.qweight, q.scale, q.spec.group_size))


def check_w8a16(ctx: Ctx):
    from inferlab.quant.kernels import w8a16_matmul_reference, w8a16_matmul_triton
    for fmt in ("fp8", "int8"):
        yield from quant_rows(ctx, "w8a16", fmt, None, lambda q, x: w8a16_matmul_triton(x, q.qweight, q.scale),
                              lambda q, x: w8a16_matmul_reference(x, q.qweight, q.scale))


def check_w8a8(ctx: Ctx):
    """int8 x int8 -> int32 tensor cores; the kernel's time includes quantizing the activations (torch), and its
    peak is the INT8 one, twice --peak-tflops (the printed % is against the bf16 peak)."""
    from inferlab.quant.kernels import w8a8_matmul_reference, w8a8_matmul_triton
    yield from quant_rows(ctx, "w8a8", "int8", "int8", lambda q, x: w8a8_matmul_triton(x, q.qweight, q.scale),
                          lambda q, x: w8a8_matmul_reference(x, q.qweight, q.scale))


def check_nvfp4(ctx: Ctx):
    from inferlab.quant.kernels import nvfp4_matmul_reference, nvfp4_matmul_triton
    yield from quant_rows(ctx, "nvfp4", "nvfp4", None,
                          lambda q, x: nvfp4_matmul_triton(x, q.qweight, q.scale, q.tensor_scale),
                          lambda q, x: nvfp4_matmul_reference(x, q.qweight, q.scale, q.tensor_scale))


CHECKS = {"copy": check_copy, "store_kv": check_store_kv, "decode": check_decode, "prefill": check_prefill,
          "decode_kv8": check_decode_kv8, "w4a16": check_w4a16, "w8a16": check_w8a16, "w8a8": check_w8a8,
          "nvfp4": check_nvfp4}
