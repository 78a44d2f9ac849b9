"""What every check of tools/gpu_check.py shares: its context (device, rooflines, smoke mode), result rows, timing."""
from __future__ import annotations
import math
import statistics
import time
from dataclasses import dataclass, field
import torch


@dataclass
class Ctx:
    "What every check gets: the device, the rooflines, whether this is the tiny CPU smoke run, a scratch folder."
    device: torch.device
    smoke: bool
    peak_gbps: float                   # datasheet memory bandwidth (chapter 09's table)
    peak_tflops: float                 # datasheet dense bf16
    copy_gbps: float | None = None     # measured device-to-device copy: the bandwidth a kernel can hope for
    workdir: str = ""                  # files kept between checks (and their processes): the random 1B checkpoint

    @property
    def roofline_gbps(self) -> float:
        "The bandwidth achieved figures are compared with: the measured copy, else the datasheet."
        return self.copy_gbps or self.peak_gbps

    def sync(self):
        if self.device.type == "cuda": torch.cuda.synchronize(self.device)

    def time_ms(self, fn, warmup: int = 3, iters: int = 10) -> float:
        "Median ms per call of `fn` (CUDA events around each call, after warm-up); one wall-clock call when smoking."
        if self.smoke:
            t = time.perf_counter(); fn(); return (time.perf_counter() - t) * 1e3
        for _ in range(warmup): fn()
        events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(iters)]
        for start, end in events: start.record(); fn(); end.record()
        torch.cuda.synchronize(self.device)
        return statistics.median(s.elapsed_time(e) for s, e in events)


@dataclass
class Row:
    """One result line: a checked case (`passed` True/False) or a measurement (`passed` None), its figures (JSON), the
    printed text, and a performance goal with whether it was met (None in the smoke run: its timings mean nothing)."""
    check: str
    case: str
    passed: bool | None = None
    figures: dict = field(default_factory=dict)
    text: str = ""
    goal: str = ""
    goal_met: bool | None = None

    @property
    def status(self) -> str: return "INFO" if self.passed is None else "PASS" if self.passed else "FAIL"

    def line(self) -> str:
        s = f"{self.status}  {self.check:10} {self.case:46} {self.text}"
        if self.goal:
            s += f"  [goal {self.goal}: {'n/a' if self.goal_met is None else 'met' if self.goal_met else 'MISSED'}]"
        return s

    def as_dict(self) -> dict:
        return dict(check=self.check, case=self.case, status=self.status, figures=self.figures, text=self.text,
                    goal=self.goal, goal_met=self.goal_met)


def finite(x: float) -> bool: return isinstance(x, (int, float)) and math.isfinite(x)


def max_err(a: torch.Tensor, b: torch.Tensor) -> float: return (a.float() - b.float()).abs().max().item()


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    "max |a - b| / max |b|."
    return ((a.float() - b.float()).abs().max() / b.float().abs().max().clamp(min=1e-30)).item()


def kernel_row(ctx: Ctx, check: str, case: str, dtype, err: float, tol: float, ms: float, ref_ms: float,
               gbps: float | None = None, tflops: float | None = None, note: str = "",
               goal_pct: float | None = None) -> Row:
    """A kernel against its torch reference: max error within `tol` (NaN fails), times, and what the kernel achieves
    against the roofline: GB/s against the measured copy (memory-bound kernels), TFLOP/s against the datasheet peak.
    `goal_pct`: the share of the copy bandwidth this case should reach."""
    dt = str(dtype).replace("torch.", "")
    figs = dict(dtype=dt, max_err=err, tol=tol, kernel_ms=ms, torch_ms=ref_ms, speedup=ref_ms / max(ms, 1e-9))
    text = (f"{dt:8} err {err:8.1e} (tol {tol:.0e})  kernel {ms:8.3f} ms  torch {ref_ms:8.3f} ms "
            f"({ref_ms / max(ms, 1e-9):5.1f}x)")
    if gbps is not None:
        pct = 100 * gbps / ctx.roofline_gbps
        figs.update(gbps=gbps, pct_of_copy=pct)
        text += f"  {gbps:7.0f} GB/s = {pct:3.0f}% of copy"
    if tflops is not None:
        figs.update(tflops=tflops, pct_of_peak=100 * tflops / ctx.peak_tflops)
        text += f"  {tflops:6.1f} TFLOP/s = {tflops / ctx.peak_tflops:4.0%} of peak"
    row = Row(check, case, bool(err <= tol), figs, text + note)
    if goal_pct is not None and gbps is not None:
        row.goal = f">= {goal_pct:.0f}% of copy"
        row.goal_met = None if ctx.smoke else bool(figs["pct_of_copy"] >= goal_pct)
    return row
