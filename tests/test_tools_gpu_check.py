"""tools/gpu_check.py, whose real run needs a GPU: here its --cpu-smoke mode (every check on tiny shapes on CPU, the
Triton kernels in their interpreter), the report it writes, and each check's isolation (in this process and in a
child process: a check that raises, crashes or hangs costs only itself)."""
import importlib.util
import json
import sys
from pathlib import Path
import pytest
import torch
from inferlab.engine.triton_runtime import interpreter_ready

TOOL = Path(__file__).resolve().parents[1] / "tools" / "gpu_check.py"
needs_interpreter = pytest.mark.skipif(not interpreter_ready(), reason="Triton's interpreter is not active")


@pytest.fixture(scope="module")
def gc():
    spec = importlib.util.spec_from_file_location("gpu_check", TOOL)
    mod = importlib.util.module_from_spec(spec)
    sys.modules["gpu_check"] = mod
    spec.loader.exec_module(mod)
    return mod


def report(out: Path) -> dict: return json.loads((out / "gpu_check.json").read_text())


@needs_interpreter
def test_cpu_smoke_runs_every_check(gc, tmp_path, capsys):
    "Every check runs on tiny shapes and passes; the report holds every figure, the text ends with the summary."
    assert gc.main(["--cpu-smoke", "--out", str(tmp_path), "--workdir", str(tmp_path / "work")]) == 0
    printed = capsys.readouterr().out
    r = report(tmp_path)
    assert r["mode"] == "cpu-smoke" and [c["name"] for c in r["checks"]] == list(gc.CHECKS)
    statuses = {c["name"]: c["status"] for c in r["checks"]}
    assert statuses == {n: "info" if n == "decode_1b" else "pass" for n in gc.CHECKS}   # on CPU: no graph to check
    assert r["summary"]["pass"] == len(gc.CHECKS) - 1 and not r["failed"] and "FAIL" not in printed
    rows = {c["name"]: c["rows"] for c in r["checks"]}
    kernel_cases = sum(row["status"] == "PASS" for n in ("store_kv", "decode", "decode_kv8", "prefill", "w4a16",
                                                         "w8a16", "w8a8", "nvfp4") for row in rows[n])
    assert kernel_cases == 38 and all(row["figures"]["max_err"] <= row["figures"]["tol"] for row in rows["decode"])
    assert r["copy_gbps"] > 0 and rows["copy"][0]["figures"]["device"] == "cpu"
    assert [row["case"].split(",")[0] for row in rows["graphs"][:2]] == ["1 rows (bucket 1)", "3 rows (bucket 4)"]
    assert all(row["status"] == "PASS" for row in rows["greedy"]) and len(rows["greedy"]) == 3
    mbu = [row for row in rows["decode_1b"] if row["goal"]]
    assert len(mbu) == 1 and mbu[0]["goal_met"] is None and mbu[0]["figures"]["tok_s"] > 0   # timings: no verdict
    assert {g["check"] for g in r["goals"]} == {"decode", "decode_1b"} and all(g["met"] is None for g in r["goals"])
    text = (tmp_path / "gpu_check.txt").read_text()
    last = text.rstrip().splitlines()[-2:]
    assert "check       status" in text and last[0].startswith(f"{len(gc.CHECKS)} checks in") and "report:" in last[1]


@needs_interpreter
def test_a_raising_check_costs_only_itself(gc, tmp_path, monkeypatch, capsys):
    def boom(ctx):
        yield gc.Row("boom", "first case", True, {}, "fine")
        raise RuntimeError("kernel exploded")
    monkeypatch.setitem(gc.CHECKS, "boom", boom)
    assert gc.main(["--cpu-smoke", "--only", "boom,copy", "--out", str(tmp_path)]) == 1
    r = report(tmp_path)
    boom_res, copy_res = r["checks"]
    assert boom_res["status"] == "error" and "RuntimeError: kernel exploded" in boom_res["error"]
    assert len(boom_res["rows"]) == 1 and copy_res["status"] == "pass" and r["failed"] == ["boom"]
    assert "FAIL  boom       raised RuntimeError: kernel exploded" in capsys.readouterr().out


@needs_interpreter
def test_checks_in_child_processes(gc, tmp_path):
    "--isolate: each check in its own process; the copy's bandwidth reaches the later checks; a dead child is an error."
    out = tmp_path / "out"
    assert gc.main(["--cpu-smoke", "--isolate", "--only", "copy,store_kv", "--out", str(out)]) == 0
    r = report(out)
    assert [c["status"] for c in r["checks"]] == ["pass", "pass"] and r["copy_gbps"] > 0
    pct = r["checks"][1]["rows"][0]["figures"]["pct_of_copy"]        # computed in the child, against the parent's copy
    assert pct == pytest.approx(100 * r["checks"][1]["rows"][0]["figures"]["gbps"] / r["copy_gbps"])
    dead = gc.run_isolated("no_such_check", ["--cpu-smoke"], timeout=120, echo=lambda s: None)
    assert dead["status"] == "error" and "exited with status 2" in dead["error"] and "unknown check" in dead["error"]
    slow = gc.run_isolated("copy", ["--cpu-smoke"], timeout=0.2, echo=lambda s: None)
    assert slow["status"] == "error" and slow["error"].startswith("timed out after")


def test_budget_spent_skips_and_fails(gc, tmp_path):
    assert gc.main(["--cpu-smoke", "--only", "copy", "--budget-s", "0", "--out", str(tmp_path)]) == 1
    assert report(tmp_path)["checks"][0]["status"] == "skipped"


def test_report_goes_to_OUT(gc, monkeypatch, tmp_path):
    monkeypatch.setenv("OUT", str(tmp_path))
    assert gc.default_out() == tmp_path
    monkeypatch.delenv("OUT")
    assert gc.default_out() == TOOL.parents[1] / "gpu_check_out"


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is present: the script would run for real")
def test_without_cuda_it_says_so(gc, capsys):
    assert gc.main([]) == 2 and "no CUDA device" in capsys.readouterr().out


def test_unknown_check_is_refused(gc):
    with pytest.raises(SystemExit): gc.main(["--cpu-smoke", "--only", "decode,nope"])
