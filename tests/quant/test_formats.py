"""Number formats (chapter 20) and block formats (chapter 21) against independent references.

Acceptance 1: encode/decode match `ml_dtypes` (and torch's float8 dtypes) bit for bit on every code, on every rounding
tie and one float32 ulp either side of it, past the largest value, on zeros, subnormals, Inf and NaN. Where the
libraries' semantics differ from the chapter's (saturation, NaN in formats without NaN, ml_dtypes' integer casts,
E8M0 on float32 subnormals) the test says so and checks the difference itself.

Acceptance 2: MX and NVFP4 quantize/dequantize agree with a direct implementation of the spec's scale rules written
here, per block in plain Python (exact `Fraction` arithmetic for the rounding), on random and adversarial blocks.
"""
import math
from bisect import bisect_right
from fractions import Fraction

import ml_dtypes
import numpy as np
import pytest
import torch

from inferlab.quant.formats import (FORMATS, encode, decode, round_to_format, pack_nibbles, unpack_nibbles,
                                    quantize_symmetric, quantize_asymmetric, dequantize_int)
from inferlab.quant.block_formats import (MX_FORMATS, mx_quantize, mx_dequantize, nvfp4_quantize, nvfp4_dequantize,
                                  quantize_dequantize, bits_per_element)

MLD = {"fp8_e4m3": ml_dtypes.float8_e4m3fn, "fp8_e5m2": ml_dtypes.float8_e5m2, "fp6_e2m3": ml_dtypes.float6_e2m3fn,
       "fp6_e3m2": ml_dtypes.float6_e3m2fn, "fp4_e2m1": ml_dtypes.float4_e2m1fn, "e8m0": ml_dtypes.float8_e8m0fnu}
NBITS = {"fp8_e4m3": 8, "fp8_e5m2": 8, "fp6_e2m3": 6, "fp6_e3m2": 6, "fp4_e2m1": 4, "e8m0": 8}
FLOATS = list(MLD)
TORCH = {"fp8_e4m3": torch.float8_e4m3fn, "fp8_e5m2": torch.float8_e5m2, "e8m0": torch.float8_e8m0fnu}
F32 = np.float32


# ---------------------------------------------------------------------------------------------- helpers
def ml_values(name):
    "Every code's value according to ml_dtypes (float32), index = code."
    return np.arange(1 << NBITS[name], dtype=np.uint8).view(MLD[name]).astype(F32)

def ml_cast(x, name):
    "ml_dtypes' own cast, as codes."
    with np.errstate(invalid="ignore", over="ignore"): return x.astype(MLD[name]).view(np.uint8)

def ml_clamp_cast(x, name):
    "Saturating conversion expressed with ml_dtypes: clamp into the finite range, then cast (NaN stays NaN)."
    fi = ml_dtypes.finfo(MLD[name])
    lo = -float(fi.max) if name != "e8m0" else float(fi.smallest_normal)       # E8M0: no sign, no zero
    return ml_cast(np.clip(x, F32(lo), F32(fi.max)), name)

def ours(x, name, saturate=True):
    return encode(torch.from_numpy(np.ascontiguousarray(x)), name, saturate=saturate).numpy()

def same_float_bits(a, b):
    a, b = np.asarray(a, F32), np.asarray(b, F32)
    return (a.view(np.uint32) == b.view(np.uint32)) | (np.isnan(a) & np.isnan(b))

def with_neighbours(v):
    "Each value and its float32 neighbours one ulp above and below (values past float32's range become Inf)."
    with np.errstate(over="ignore"): v = np.asarray(v, F32)
    with np.errstate(over="ignore"): return np.concatenate([v, np.nextafter(v, F32(np.inf)), np.nextafter(v, F32(-np.inf))])

def tie_probes(name):
    """Every midpoint between consecutive representable magnitudes, the overflow midpoint past the largest value,
    values far past it, each +- one ulp, both signs; plus zeros, Inf, NaN, float32 subnormals."""
    v = ml_values(name).astype(np.float64)
    pos = np.unique(v[np.isfinite(v) & (v >= 0)])
    mids = (pos[1:] + pos[:-1]) / 2
    top = pos[-1]
    next_up = 2 * top if name == "e8m0" else top + (top - pos[-2])               # the value the format lacks
    mids = np.append(mids, (top + next_up) / 2)
    assert np.all(mids.astype(F32) == mids), "ties must be exact in float32"
    far = [top * 1.5, top * 4, 3.0e38, float(np.finfo(F32).max)]
    tiny = [2.0 ** -149, 1e-45, 1e-40, 2.0 ** -127, 2.0 ** -126]
    core = with_neighbours(np.concatenate([pos, mids, far, tiny]))
    specials = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, -np.nan], F32)
    return np.concatenate([core, -core, specials]).astype(F32), len(mids)

def random_probes(name, n=1 << 16, seed=0):
    "Random float32 bit patterns plus log-uniform values around the format's range, both signs."
    rng = np.random.default_rng(seed)
    bits = rng.integers(0, 1 << 32, n, dtype=np.uint64).astype(np.uint32).view(F32)
    v = ml_values(name); pos = v[np.isfinite(v) & (v > 0)]
    lo, hi = math.log2(pos.min()) - 3, math.log2(pos.max()) + 3
    with np.errstate(over="ignore"): logu = (np.exp2(rng.uniform(lo, hi, n)) * rng.choice([-1, 1], n)).astype(F32)
    return np.concatenate([bits, logu])

E8M0_QUIRK = (F32(2.0 ** -127), F32(1.5 * 2.0 ** -127))   # float32 subnormals ml_dtypes/torch round up to 2^-126
def e8m0_quirk(x): return (x > E8M0_QUIRK[0]) & (x < E8M0_QUIRK[1])


# ---------------------------------------------------------------------------------------------- acceptance 1
@pytest.mark.parametrize("name", FLOATS)
def test_decode_every_code(name):
    codes = torch.arange(1 << NBITS[name], dtype=torch.uint8)
    got = decode(codes, name).numpy()
    assert same_float_bits(got, ml_values(name)).all()
    if name in TORCH:
        assert same_float_bits(got, codes.view(TORCH[name]).float().numpy()).all()

@pytest.mark.parametrize("name", FLOATS)
def test_every_code_round_trips(name):
    codes = torch.arange(1 << NBITS[name], dtype=torch.uint8)
    vals = decode(codes, name)
    keep = ~torch.isnan(vals)
    assert torch.equal(encode(vals, name, saturate=False)[keep], codes[keep])
    fin = torch.isfinite(vals)
    assert torch.equal(encode(vals, name)[fin], codes[fin])
    # NaN codes: encode(NaN) gives a NaN code of the same sign
    nan_codes = codes[~keep]
    if len(nan_codes): assert decode(encode(vals[~keep], name), name).isnan().all()

@pytest.mark.parametrize("name", FLOATS)
def test_ties_saturating_equals_clamp_then_cast(name):
    x, n_ties = tie_probes(name)
    x = np.concatenate([x, random_probes(name)])
    got, ref = ours(x, name), ml_clamp_cast(x, name)
    if NBITS[name] < 8:        # no NaN code: ml_dtypes writes a zero of the opposite sign, ours +0 (see below)
        keep = ~np.isnan(x)
        got, ref = got[keep], ref[keep]
    else: keep = np.ones(len(x), bool)
    if name == "e8m0":
        q = e8m0_quirk(x[keep]); got, ref = got[~q], ref[~q]
    assert n_ties >= 8 and np.array_equal(got, ref), np.flatnonzero(got != ref)[:10]

@pytest.mark.parametrize("name", FLOATS)
def test_ties_nonsaturating_equals_ml_dtypes_cast(name):
    "saturate=False is IEEE-style overflow: E4M3FN -> NaN, E5M2 -> Inf, E8M0 -> NaN; FP6/FP4 have neither and saturate."
    x, _ = tie_probes(name)
    x = np.concatenate([x, random_probes(name, seed=1)])
    keep = ~np.isnan(x) if NBITS[name] < 8 else np.ones(len(x), bool)
    if name == "e8m0": keep &= ~e8m0_quirk(x)
    assert np.array_equal(ours(x, name, saturate=False)[keep], ml_cast(x, name)[keep])

def test_tie_counts_and_specific_ties():
    "The ties land where the spec's round-to-nearest-even says (OCP tables, vLLM cast_to_fp4 thresholds)."
    counts = {n: tie_probes(n)[1] for n in FLOATS}
    # one tie per gap between consecutive non-negative values, plus the overflow tie past the largest
    assert counts == {"fp8_e4m3": 127, "fp8_e5m2": 124, "fp6_e2m3": 32, "fp6_e3m2": 32, "fp4_e2m1": 8, "e8m0": 255}
    x = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 7.0])
    assert round_to_format(x, "fp4_e2m1").tolist() == [0, 1, 1, 2, 2, 4, 4, 6]
    assert round_to_format(torch.tensor([464.0, 464.00003, 240.0 + 8]), "fp8_e4m3").tolist() == [448, 448, 256]
    assert encode(torch.tensor([464.00003]), "fp8_e4m3", saturate=False).item() == 0x7F          # overflow: NaN
    assert encode(torch.tensor([61440.0, 61439.996]), "fp8_e5m2", saturate=False).tolist() == [0x7C, 0x7B]

def test_documented_differences_with_the_references():
    # FP6/FP4 have no NaN: ml_dtypes maps NaN to a zero of the opposite sign; ours to +0
    for name in ["fp6_e2m3", "fp6_e3m2", "fp4_e2m1"]:
        x = np.array([np.nan, -np.nan], F32)
        assert ours(x, name).tolist() == [0, 0]
        assert ml_cast(x, name).tolist() == [1 << (NBITS[name] - 1), 0]
    # E8M0 on float32 subnormals strictly inside (2^-127, 1.5 * 2^-127): nearest is 2^-127 (code 0); ml_dtypes and
    # torch give 2^-126 (code 1). At and beyond the tie they agree.
    x = np.array([1.1 * 2.0 ** -127, 1.4 * 2.0 ** -127, 1.5 * 2.0 ** -127, 2.0 ** -127], F32)
    assert ours(x, "e8m0").tolist() == [0, 0, 1, 0]
    import ml_dtypes                          # 0.7 rounds these to nearest, as we do; earlier versions round up
    old_ml = tuple(int(v) for v in ml_dtypes.__version__.split(".")[:2]) < (0, 7)
    assert ml_cast(x, "e8m0").tolist() == ([1, 1, 1, 0] if old_ml else [0, 0, 1, 0])
    assert torch.from_numpy(x).to(torch.float8_e8m0fnu).view(torch.uint8).tolist() == [1, 1, 1, 0]
    # E8M0 saturating mode: zero and negatives -> the smallest scale; ml_dtypes' cast says NaN
    assert ours(np.array([0.0, -2.0], F32), "e8m0").tolist() == [0, 0]
    assert ml_cast(np.array([0.0, -2.0], F32), "e8m0").tolist() == [255, 255]

@pytest.mark.parametrize("name", ["fp8_e4m3", "fp8_e5m2", "e8m0"])
def test_torch_casts(name):
    """torch's casts, where their policy is known: E4M3FN saturates finite overflow and Inf (= our saturate=True,
    NaN sign included); E5M2 overflows to Inf (= saturate=False) with NaN code 0x7F where ml_dtypes and ours write
    0x7E; E8M0 ignores the sign and maps 0 to 2^-127, so it is compared on positive inputs."""
    x, _ = tie_probes(name)
    x = np.concatenate([x, random_probes(name, seed=2)])
    t = torch.from_numpy(x).to(TORCH[name]).view(torch.uint8).numpy()
    if name == "fp8_e4m3":
        assert np.array_equal(t, ours(x, name))
    elif name == "fp8_e5m2":
        nan = np.isnan(x)
        assert np.array_equal(t[~nan], ours(x, name, saturate=False)[~nan])
        assert np.all((t[nan] & 0x7F) == 0x7F) and np.all((ours(x, name)[nan] & 0x7F) == 0x7E)
    else:
        keep = (x > 0) & ~e8m0_quirk(x)
        assert np.array_equal(t[keep], ours(x, name, saturate=False)[keep])

@pytest.mark.parametrize("name,lo,hi", [("int8", -128, 127), ("int4", -8, 7), ("uint4", 0, 15)])
def test_integer_formats(name, lo, hi):
    k = np.arange(lo - 3, hi + 3, dtype=np.float64)
    x = with_neighbours(np.concatenate([k, k + 0.5, [1e9, -1e9, 3e38, -3e38]]))
    x = np.concatenate([x, np.array([0.0, -0.0, np.inf, -np.inf], F32)])
    ref = np.clip(np.rint(x.astype(np.float64)), lo, hi).astype(np.int64) & ((1 << (8 if name == "int8" else 4)) - 1)
    assert np.array_equal(ours(x, name), ref)                                        # RNE, saturate
    assert ours(np.array([np.nan], F32), name).tolist() == [0]
    codes = np.arange(1 << (8 if name == "int8" else 4), dtype=np.uint8)
    ref_vals = codes.view(np.int8 if name == "int8" else getattr(ml_dtypes, name)).astype(F32)
    assert np.array_equal(decode(torch.from_numpy(codes), name).numpy(), ref_vals)   # two's complement, ml_dtypes
    ints = np.arange(lo, hi + 1, dtype=F32)                                           # ml_dtypes agrees on integers
    if name != "int8": assert np.array_equal(ours(ints, name), ints.astype(getattr(ml_dtypes, name)).view(np.uint8))

def test_int_quantizers():
    x = torch.tensor([-1.0, -0.25, 0.0, 0.3, 2.0])
    c, s = quantize_symmetric(x, "int8")
    assert s.item() == pytest.approx(2 / 127) and decode(c, "int8").abs().max() == 127
    assert (dequantize_int(c, "int8", s) - x).abs().max() <= s / 2 + 1e-7
    c, s, z = quantize_asymmetric(x, "uint4")
    assert decode(c, "uint4").min() == 0 and decode(c, "uint4").max() == 15
    assert (dequantize_int(c, "uint4", s, z) - x).abs().max() <= s / 2 + 1e-6

def test_pack_nibbles():
    codes = torch.arange(16, dtype=torch.uint8).repeat(3, 2)                     # [3, 32]
    p = pack_nibbles(codes)
    assert p.shape == (3, 16) and p[0, 0].item() == 0x10 and p[0, 7].item() == 0xFE   # low nibble = even element
    assert torch.equal(unpack_nibbles(p), codes)


# ---------------------------------------------------------------------------------------------- acceptance 2
# The spec, written out again from the reference note, per block and per element in plain Python.
SPEC = {  # element: (ebits, mbits, bias, max normal, emax)
    "fp8_e4m3": (4, 3, 7, 448.0, 8), "fp8_e5m2": (5, 2, 15, 57344.0, 15), "fp6_e2m3": (2, 3, 1, 7.5, 2),
    "fp6_e3m2": (3, 2, 3, 28.0, 4), "fp4_e2m1": (2, 1, 1, 6.0, 2)}

def spec_grid(elem):
    "Non-negative values in magnitude-code order, from value(E=0) = 2^(1-b) m/2^M, value(E>0) = 2^(E-b)(1 + m/2^M)."
    ebits, mbits, bias, top, _ = SPEC[elem]
    out = []
    for code in range(1 << (ebits + mbits)):
        E, m = code >> mbits, code & ((1 << mbits) - 1)
        v = Fraction(m, 1 << mbits) * Fraction(2) ** (1 - bias) if E == 0 else (1 + Fraction(m, 1 << mbits)) * Fraction(2) ** (E - bias)
        if v > top: break
        out.append(v)
    return out
GRIDS = {e: spec_grid(e) for e in SPEC}

def spec_round(a: Fraction, grid) -> int:
    "Index of the nearest grid value to a >= 0, ties to the even index (= even mantissa), saturating at the top."
    if a >= grid[-1]: return len(grid) - 1
    i = bisect_right(grid, a) - 1
    lo, hi = grid[i], grid[i + 1]
    if a - lo != hi - a: return i if a - lo < hi - a else i + 1
    return i if i % 2 == 0 else i + 1

def spec_element(v: float, elem: str):
    """(code, value) of the real number v (already divided by the scale) in element format `elem`, saturating.
    The value is a float64 with the code's sign (so -0.0 for a negative value that rounds to zero)."""
    neg = math.copysign(1.0, v) < 0
    if elem == "int8":                                   # MXINT8: q * 2^-6, q in [-127, 127], RNE
        a = Fraction(v) * 64
        q = math.floor(a); frac = a - q
        q = q + 1 if frac > Fraction(1, 2) or (frac == Fraction(1, 2) and q % 2) else q
        q = max(-127, min(127, q))
        return q & 0xFF, q / 64                          # integers have no -0
    grid = GRIDS[elem]; nbits = 1 + SPEC[elem][0] + SPEC[elem][1]
    i = spec_round(abs(Fraction(v)), grid)
    return (int(neg) << (nbits - 1)) | i, math.copysign(float(grid[i]), -1.0 if neg else 1.0)

def spec_mx_block(vals, elem, rule):
    "OCP MX for one block: (E8M0 code, element codes, dequantized float32 values)."
    emax, top = (0, Fraction(127, 64)) if elem == "int8" else (SPEC[elem][4], Fraction(SPEC[elem][3]))
    if any(math.isnan(v) or math.isinf(v) for v in vals): return 0xFF, None, [math.nan] * len(vals)
    amax = max(abs(Fraction(v)) for v in vals)
    if amax == 0: e = -127
    else:
        e = math.floor(math.log2(amax))                  # a first guess, corrected exactly below
        while Fraction(2) ** e > amax: e -= 1
        while Fraction(2) ** (e + 1) <= amax: e += 1
        e -= emax                                        # floor rule: shared_exp = floor(log2 amax) - emax
        if rule == "round_up":                           # smallest power of two with amax / X <= max element
            while amax / Fraction(2) ** e > top: e += 1
            while e > -200 and amax / Fraction(2) ** (e - 1) <= top: e -= 1
        e = max(-127, min(127, e))
    X = Fraction(2) ** e
    codes, deq = [], []
    for v in vals:
        c, q = spec_element(math.copysign(float(abs(Fraction(v)) / X), v), elem)   # exact in float64, sign kept
        codes.append(c); deq.append(q * float(X))             # exact: X is a power of two
    return e + 127, codes, deq

def spec_mx(x: np.ndarray, elem: str, rule: str, block=32):
    "The whole tensor [rows, n], blocks along the last dimension, zero padding."
    rows, n = x.shape
    pad = -n % block
    xp = np.concatenate([x, np.zeros((rows, pad), F32)], 1)
    scales, codes, deq = [], [], []
    for r in range(rows):
        srow, crow, drow = [], [], []
        for b in range(0, n + pad, block):
            s, c, d = spec_mx_block([float(v) for v in xp[r, b:b + block]], elem, rule)
            srow.append(s); crow.append(c); drow.extend(d)
        scales.append(srow); codes.append(crow); deq.append(drow[:n])
    with np.errstate(over="ignore"):                    # 4 * 2^126 (round_up of 3e38) is Inf in float32
        return np.array(scales), codes, np.array(deq, F32)

def adversarial_blocks(rng, elem):
    "Blocks of 32: zeros, one huge outlier, float32 subnormals, element subnormals, exact ties, clip boundaries, -0."
    top = 127 / 64 if elem == "int8" else SPEC[elem][3]
    emax = 0 if elem == "int8" else SPEC[elem][4]
    ties = np.array([float((a + b) / 2) for a, b in zip(GRIDS["fp4_e2m1"], GRIDS["fp4_e2m1"][1:])], F32)
    rows = [np.zeros(32, F32),                                                       # all zeros
            np.concatenate([rng.standard_normal(31), [1e30]]).astype(F32),             # one huge outlier
            (rng.standard_normal(32) * 1e-40).astype(F32),                             # float32 subnormals only
            np.full(32, F32(1.4e-45)),                                                 # the smallest float32
            (rng.standard_normal(32) * 2.0 ** -9).astype(F32) * np.r_[np.ones(31), 2 ** 9].astype(F32),  # element subnormals
            np.resize(np.concatenate([ties, -ties, [4.0]]), 32).astype(F32),           # FP4 ties at scale 1
            np.full(32, F32(top * 2.0 ** 3)),                                          # amax exactly the element max
            np.full(32, np.nextafter(F32(top * 2.0 ** 3), F32(np.inf))),               # just above: clips (floor)
            np.full(32, F32(2.0 ** (emax + 4))),                                       # a power of two
            np.full(32, np.nextafter(F32(2.0 ** (emax + 4)), F32(0))),                 # just below one
            np.concatenate([np.full(31, -0.0), [1.0]]).astype(F32),                    # negative zeros
            np.concatenate([rng.standard_normal(31), [3.0e38]]).astype(F32),           # near float32 max
            ]
    return np.stack(rows)

@pytest.mark.parametrize("rule", ["floor", "round_up"])
@pytest.mark.parametrize("fmt", list(MX_FORMATS))
def test_mx_matches_spec(fmt, rule):
    elem = MX_FORMATS[fmt]
    rng = np.random.default_rng(list(MX_FORMATS).index(fmt) * 2 + (rule == "round_up"))
    rand = np.concatenate([rng.standard_normal((8, 64)), rng.standard_t(2, (8, 64)) * 10,
                           np.exp2(rng.uniform(-20, 20, (8, 64))) * rng.choice([-1, 1], (8, 64))]).astype(F32)
    cases = [rand, adversarial_blocks(rng, elem), rng.standard_normal((3, 45)).astype(F32)]   # 45: padded
    n_blocks = 0
    for x in cases:
        t = mx_quantize(torch.from_numpy(x), fmt, scale_rule=rule)
        s, codes, deq = spec_mx(x, elem, rule)
        assert np.array_equal(t.scales_e8m0.numpy(), s)
        got_codes = (unpack_nibbles(t.codes) if t.packed else t.codes).numpy().reshape(x.shape[0], -1, 32)
        assert np.array_equal(got_codes, np.array(codes))
        assert same_float_bits(mx_dequantize(t).numpy(), deq).all()
        n_blocks += s.size
    assert n_blocks == 24 * 2 + 12 + 6

def test_mx_special_blocks():
    x = np.zeros((2, 32), F32); x[0, 3] = np.nan; x[1, 7] = -np.inf
    for fmt in MX_FORMATS:
        t = mx_quantize(torch.from_numpy(x), fmt)
        assert t.scales_e8m0.tolist() == [[255], [255]] and mx_dequantize(t).isnan().all()

# NVFP4, from the reference note (torchao's nvfp4_quantize, two-level), in numpy float32 scalars.
E4M3_GRID, E2M1_GRID = GRIDS["fp8_e4m3"], GRIDS["fp4_e2m1"]

def spec_nvfp4(x: np.ndarray, block=16):
    rows, n = x.shape
    amax = F32(np.max(np.abs(x)))
    ts = amax / F32(448.0 * 6.0) if amax > 0 else F32(1.0)        # per-tensor scale (decode convention)
    pad = -n % block
    xp = np.concatenate([x, np.zeros((rows, pad), F32)], 1)
    scodes, codes, deq = [], [], []
    for r in range(rows):
        srow, crow, drow = [], [], []
        for b in range(0, n + pad, block):
            blk = xp[r, b:b + block]
            bs = F32(np.max(np.abs(blk))) / F32(6.0)
            ratio = F32(min(max(bs / ts, F32(2.0 ** -6)), F32(448.0)))
            si = spec_round(Fraction(float(ratio)), E4M3_GRID)             # positive E4M3 code = grid index
            total = F32(ts * F32(float(E4M3_GRID[si])))
            srow.append(si)
            for v in blk:
                q = F32(v) / total
                q = F32(min(max(q, F32(-6.0)), F32(6.0)))
                c, val = spec_element(float(q), "fp4_e2m1")
                crow.append(c); drow.append(F32(F32(val) * total))
        scodes.append(srow); codes.append(crow); deq.append(drow[:n])
    return ts, np.array(scodes), np.array(codes), np.array(deq, F32)

@pytest.mark.parametrize("case", ["gaussian", "heavy", "outlier", "zeros", "subnormal", "ties", "padded", "wide"])
def test_nvfp4_matches_spec(case):
    rng = np.random.default_rng(7)
    x = {"gaussian": lambda: rng.standard_normal((6, 64)),
         "heavy": lambda: rng.standard_t(2, (6, 64)),
         "outlier": lambda: np.concatenate([rng.standard_normal((4, 64)), np.r_[[1e6], np.zeros(63)][None]]),
         "zeros": lambda: np.zeros((3, 32)),
         "subnormal": lambda: rng.standard_normal((4, 32)) * 1e-40,
         "ties": lambda: np.resize(np.array([float(g) for g in E2M1_GRID] + [0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0]), (4, 48)) * np.array([[1], [-1], [0.5], [3]]),
         "padded": lambda: rng.standard_normal((3, 37)),
         "wide": lambda: rng.standard_normal((4, 64)) * np.exp2(rng.uniform(-30, 30, (4, 1)))}[case]().astype(F32)
    t = nvfp4_quantize(torch.from_numpy(x))
    ts, s, codes, deq = spec_nvfp4(x)
    assert t.tensor_scale.numpy().view(np.uint32) == np.asarray(ts, F32).view(np.uint32)
    assert np.array_equal(t.scales_e4m3.numpy(), s)
    assert np.array_equal(unpack_nibbles(t.codes).numpy(), codes)
    assert same_float_bits(nvfp4_dequantize(t).numpy(), deq).all()

def test_bits_and_convenience():
    assert [bits_per_element(f) for f in MX_FORMATS] == [8.25, 8.25, 6.25, 6.25, 4.25, 8.25]
    assert bits_per_element("nvfp4") == 4.5 and bits_per_element("nvfp4", numel=64) == 5.0
    assert bits_per_element("mxfp4", block=16) == 4.5
    x = torch.randn(4, 96)
    assert torch.equal(quantize_dequantize(x, "nvfp4"), nvfp4_dequantize(nvfp4_quantize(x)))
    assert torch.equal(quantize_dequantize(x, "mxfp6_e3m2", scale_rule="round_up"),
                       mx_dequantize(mx_quantize(x, "fp6_e3m2", scale_rule="round_up")))
    with pytest.raises(ValueError, match="fmt_name"): quantize_dequantize(x, "int8")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_matches_cpu():
    rng = np.random.default_rng(3)
    x = torch.from_numpy(np.concatenate([rng.integers(0, 1 << 32, 1 << 16, dtype=np.uint64).astype(np.uint32).view(F32),
                                         rng.standard_normal(1 << 16).astype(F32)]))
    for name in FORMATS:
        for sat in (True, False):
            assert torch.equal(encode(x.cuda(), name, sat).cpu(), encode(x, name, sat)), name
        codes = torch.arange(1 << FORMATS[name].nbits, dtype=torch.uint8)
        assert same_float_bits(decode(codes.cuda(), name).cpu().numpy(), decode(codes, name).numpy()).all()
    w = torch.randn(64, 256) * torch.logspace(-4, 4, 256)
    for fmt in list(MX_FORMATS) + ["nvfp4"]:
        assert same_float_bits(quantize_dequantize(w.cuda(), fmt).cpu().numpy(), quantize_dequantize(w, fmt).numpy()).all(), fmt
