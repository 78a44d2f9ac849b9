#!/usr/bin/env python3
"""GPU check: every Triton kernel against its torch reference on realistic shapes, decode against the HBM roofline,
CUDA graphs, batch-1 MBU of a 1B-class Llama, offline throughput, and GPU = CPU greedy tokens.

    make gpu-check                                  # = PYTHONPATH=. python3 tools/gpu_check.py (no venv, no pip)
    python3 tools/gpu_check.py --only decode,prefill
    python3 tools/gpu_check.py --cpu-smoke          # no GPU: every check on tiny shapes on CPU (Triton's interpreter)

It needs only a Python that already has torch (with CUDA) and triton, and the working tree on PYTHONPATH: nothing is
installed or downloaded. Each check runs in its own process on a GPU (a kernel that corrupts the CUDA context, hangs
or crashes costs only its own check, whose error goes in the report), within a time budget (default 290 s in all).
The report goes to $OUT when that variable is set (the device tool brings that folder back), else to gpu_check_out/:
gpu_check.json (every figure) and gpu_check.txt (what was printed, ending with the summary table).

Rows: PASS/FAIL (a case checked against its reference or its condition) or INFO (a measurement); a performance goal
is reported met or MISSED but does not fail the run (timings in the smoke run mean nothing: goals read n/a there).
Exit status: 0 nothing failed, 1 a case failed, a check raised, timed out or was skipped (the time budget was spent),
2 no CUDA (without --cpu-smoke).
"""
from __future__ import annotations
import os
import sys

SMOKE_FLAGS = ("--cpu-smoke", "--interpret-smoke")
if any(f in sys.argv for f in SMOKE_FLAGS):    # Triton reads this when first imported: before anything imports it
    os.environ["TRITON_INTERPRET"] = "1"

import argparse
import datetime
import json
import subprocess
import tempfile
import threading
import time
import traceback
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
for p in (str(ROOT), str(HERE)):               # the working tree's inferlab, and this folder's gpu_checks
    if p not in sys.path: sys.path.insert(0, p)
import torch
from inferlab.model.hardware import H200      # the default peaks: chapter 09's datasheet table
from gpu_checks.common import Ctx, Row
from gpu_checks import kernels, engine

CHECKS = {**kernels.CHECKS, **engine.CHECKS}   # run in this order: the copy first (the roofline of the rest)
TIMEOUT_S = {"copy": 60, "graphs": 90, "greedy": 120, "decode_1b": 150, "throughput": 150}   # others: 90 s


def default_out() -> Path:
    return Path(os.environ["OUT"]) if os.environ.get("OUT") else ROOT / "gpu_check_out"


def run_check(name: str, ctx: Ctx, echo=print) -> dict:
    "One check in this process: its rows (printed as they come), status, seconds, and the error if it raised."
    t0, rows, error = time.perf_counter(), [], None
    try:
        for row in CHECKS[name](ctx):
            rows.append(row.as_dict()); echo(row.line())
    except Exception as e:                      # a crashing kernel is a failure, and the other checks still run
        error = f"{type(e).__name__}: {e}\n{traceback.format_exc(limit=8)}"
        echo(f"FAIL  {name:10} raised {type(e).__name__}: {e}")
    status = ("error" if error else "fail" if any(r["status"] == "FAIL" for r in rows)
              else "pass" if any(r["status"] == "PASS" for r in rows) else "info")
    return dict(name=name, status=status, seconds=round(time.perf_counter() - t0, 2), rows=rows, error=error)


def run_isolated(name: str, args: list[str], timeout: float, echo=print) -> dict:
    """One check in a child process of this same script (`--child`), its output echoed line by line; a child that
    dies, hangs past `timeout` or writes no result becomes an error result with the end of its output."""
    with tempfile.TemporaryDirectory() as tmp:
        result = Path(tmp) / "result.json"
        cmd = [sys.executable, str(Path(__file__).resolve()), "--child", name, "--result", str(result)] + args
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        t0, lines = time.perf_counter(), []
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
        def pump():
            for line in proc.stdout: lines.append(line.rstrip("\n")); echo(line.rstrip("\n"))
        reader = threading.Thread(target=pump, daemon=True); reader.start()
        try: rc = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill(); proc.wait(); rc = None
        reader.join(timeout=5)
        if result.exists() and rc == 0: return json.loads(result.read_text())
        why = f"timed out after {timeout:.0f} s" if rc is None else f"its process exited with status {rc}"
        partial = json.loads(result.read_text()).get("rows", []) if result.exists() else []
        echo(f"FAIL  {name:10} {why}")
        return dict(name=name, status="error", seconds=round(time.perf_counter() - t0, 2), rows=partial,
                    error=why + "\n" + "\n".join(lines[-40:]))


def headline(res: dict) -> str:
    "One summary line per check: its cases, and its goals met or missed."
    rows = res["rows"]
    n_pass, n_fail = sum(r["status"] == "PASS" for r in rows), sum(r["status"] == "FAIL" for r in rows)
    parts = [f"{n_pass} pass, {n_fail} fail" if n_pass + n_fail else f"{len(rows)} rows"]
    for r in rows:
        if r["goal"]:
            got = r["figures"].get("pct_of_copy", r["figures"].get("mbu_pct"))
            parts.append(f"{r['case'][:40]}: {'?' if got is None else f'{got:.0f}'}% (goal {r['goal']}: "
                         f"{'n/a' if r['goal_met'] is None else 'met' if r['goal_met'] else 'MISSED'})")
    if res["error"]: parts.append(res["error"].splitlines()[0][:80])
    return "; ".join(parts)


def write_report(out: Path, report: dict, log: list[str]):
    out.mkdir(parents=True, exist_ok=True)
    (out / "gpu_check.json").write_text(json.dumps(report, indent=1, default=str) + "\n")
    (out / "gpu_check.txt").write_text("\n".join(log) + "\n")


def parse(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--only", default="", help=f"comma-separated subset of: {', '.join(CHECKS)}")
    p.add_argument("--cpu-smoke", "--interpret-smoke", dest="smoke", action="store_true",
                   help="no GPU needed: every check on tiny shapes on CPU, Triton kernels in the interpreter")
    p.add_argument("--out", type=Path, default=None, help="report folder (default: $OUT, else gpu_check_out/)")
    p.add_argument("--workdir", default=None, help="scratch folder kept between checks (default: a temp folder)")
    p.add_argument("--budget-s", type=float, default=290.0, help="seconds for all checks (a check past it is skipped)")
    iso = p.add_mutually_exclusive_group()
    iso.add_argument("--isolate", dest="isolate", action="store_true", default=None,
                     help="each check in its own process (the default on a GPU)")
    iso.add_argument("--no-isolate", dest="isolate", action="store_false", help="all checks in this process")
    p.add_argument("--peak-gbps", type=float, default=H200.mem_gbps, help="datasheet memory bandwidth, GB/s")
    p.add_argument("--peak-tflops", type=float, default=H200.bf16_tflops, help="datasheet dense bf16 TFLOP/s")
    p.add_argument("--copy-gbps", type=float, default=None, help=argparse.SUPPRESS)   # from the parent's copy check
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    p.add_argument("--result", default=None, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    names = [n for n in a.only.split(",") if n] or list(CHECKS)
    unknown = [n for n in names + ([a.child] if a.child else []) if n not in CHECKS]
    if unknown: p.error(f"unknown check(s) {unknown}; known: {list(CHECKS)}")
    return a, names


def main(argv=None) -> int:
    a, names = parse(argv)
    if a.smoke:
        from inferlab.engine.triton_runtime import interpreter_ready
        if not interpreter_ready():
            print("gpu_check: triton was imported before TRITON_INTERPRET=1 could be set; run the script itself")
            return 2
        device = torch.device("cpu")
    elif not torch.cuda.is_available():
        print("gpu_check: no CUDA device visible (torch.cuda.is_available() is False); nothing to check. Run it on a "
              "GPU machine, or with --cpu-smoke for a tiny CPU run of every check.")
        return 2
    else: device = torch.device("cuda")
    workdir = a.workdir or str(Path(tempfile.gettempdir()) / "inferlab_gpu_check")
    ctx = Ctx(device, a.smoke, a.peak_gbps, a.peak_tflops, a.copy_gbps, workdir)
    if a.child:                                  # one check, for the parent process that started this one
        Path(a.result).write_text(json.dumps(run_check(a.child, ctx), default=str)); return 0

    out, log = a.out or default_out(), []
    isolate = (not a.smoke) if a.isolate is None else a.isolate
    def echo(s: str): print(s, flush=True); log.append(s)
    echo(f"gpu_check {'CPU smoke run: tiny shapes, timings mean nothing' if a.smoke else 'on ' + str(device)}; "
         f"checks {', '.join(names)}; {'one process each' if isolate else 'one process'}; report -> {out}")
    report = dict(tool="tools/gpu_check.py", mode="cpu-smoke" if a.smoke else "gpu",
                  argv=sys.argv[1:] if argv is None else argv, python=sys.version.split()[0],
                  started=datetime.datetime.now().isoformat(timespec="seconds"), torch=torch.__version__,
                  peak_gbps=a.peak_gbps, peak_tflops=a.peak_tflops, checks=[])
    t0 = time.monotonic()
    for name in names:
        left = a.budget_s - (time.monotonic() - t0)
        if left < 5:
            res = dict(name=name, status="skipped", seconds=0, rows=[], error="the time budget was spent before it")
            echo(f"SKIP  {name:10} the time budget ({a.budget_s:.0f} s) was spent")
        elif isolate:
            args = (["--cpu-smoke"] * a.smoke + ["--workdir", workdir, "--peak-gbps", str(a.peak_gbps),
                     "--peak-tflops", str(a.peak_tflops)]
                    + (["--copy-gbps", str(ctx.copy_gbps)] if ctx.copy_gbps else []))
            res = run_isolated(name, args, min(TIMEOUT_S.get(name, 90), left), echo)
        else: res = run_check(name, ctx, echo)
        if name == "copy":                       # the measured roofline, for the checks after it
            ctx.copy_gbps = next((r["figures"]["gbps"] for r in res["rows"] if "gbps" in r["figures"]), ctx.copy_gbps)
        report["checks"].append(res)
        report.update(copy_gbps=ctx.copy_gbps, seconds=round(time.monotonic() - t0, 1))
        write_report(out, report, log)           # after every check: a run cut short still leaves its report

    echo(f"\n{'check':11} {'status':7} {'time':>6}  summary")
    for res in report["checks"]:
        echo(f"{res['name']:11} {res['status'].upper():7} {res['seconds']:5.0f}s  {headline(res)}")
    bad = [r["name"] for r in report["checks"] if r["status"] in ("fail", "error", "skipped")]
    goals = [dict(check=r["check"], case=r["case"], goal=r["goal"], met=r["goal_met"], figures=r["figures"])
             for res in report["checks"] for r in res["rows"] if r["goal"]]
    report.update(goals=goals, failed=bad, summary={s: sum(r["status"] == s for r in report["checks"])
                                                   for s in ("pass", "info", "fail", "error", "skipped")})
    echo(f"{len(report['checks'])} checks in {time.monotonic() - t0:.0f} s: "
         + ", ".join(f"{n} {s}" for s, n in report["summary"].items() if n)
         + (f"; goals missed: {', '.join(g['check'] for g in goals if g['met'] is False)}"
            if any(g["met"] is False for g in goals) else ""))
    echo(f"report: {out / 'gpu_check.json'} and gpu_check.txt")
    write_report(out, report, log)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
