"""`inferlab tune`: the hypervolume is exact (against Monte Carlo and hand cases), the search measures each
configuration once, is seeded, and its report scores it against the grid; replay and bad options from the CLI."""
import json
import numpy as np
import pytest
from inferlab.cli import main
from inferlab.frontier.sweep import config_key, default_grid
from inferlab.frontier.tune import Normalizer, hypervolume, replay, tune, tune_report, with_slo

def test_hypervolume_exact():
    assert hypervolume(np.array([[0.5, 0.5]]), np.ones(2)) == pytest.approx(0.25)
    assert hypervolume(np.array([[0.0, 0.5], [0.5, 0.0]]), np.ones(2)) == pytest.approx(0.75)
    rng = np.random.default_rng(3)
    P, U = rng.random((8, 3)), rng.random((300_000, 3))
    mc = np.mean((P[None] <= U[:, None]).all(-1).any(-1))
    assert hypervolume(P, np.ones(3)) == pytest.approx(mc, abs=0.006)
    assert hypervolume(np.vstack([P, P[:1] + 0.01]), np.ones(3)) == pytest.approx(hypervolume(P, np.ones(3)))   # dominated adds nothing

def fake_rows(seed=0):
    rng = np.random.default_rng(seed)
    return [dict(config=c, output_throughput=float(rng.uniform(50, 300)), top1_agreement=float(rng.choice([0.9, 0.97, 1.0])),
                 tpot_p50=float(rng.uniform(0.005, 0.05)), goodput=float(rng.uniform(0, 10))) for c in default_grid()]

def test_tune_measures_each_configuration_once_and_is_seeded():
    rows, calls = fake_rows(), []
    look = replay(rows)
    found = tune(lambda c: calls.append(config_key(c)) or look(c), runs=24, seed=1)
    assert len(calls) == len(set(calls)) == len(found) == 24
    assert [r["config"] for r in tune(look, runs=24, seed=1)] == [r["config"] for r in found]
    rep = tune_report(found, rows)
    assert 0 < rep["hv_fraction"] <= 1 + 1e-12 and rep["default_goodput"] == rows[32]["goodput"]   # batch 64, defaults
    assert Normalizer(rows).hv(rows) >= Normalizer(rows).hv(found)

def test_cli_replay(tmp_path, capsys):
    src = tmp_path / "grid.jsonl"; src.write_text("".join(json.dumps(r) + "\n" for r in fake_rows()))
    assert main(["tune", "--replay", str(src), "--runs", "12", "--out", str(tmp_path / "t.jsonl")]) == 0
    out = capsys.readouterr().out
    assert "of the grid's (48 runs)" in out and "best goodput" in out and (tmp_path / "t.jsonl").exists()
    assert main(["tune", "--runs", "0"]) == 2
    bad = tmp_path / "bad.jsonl"; bad.write_text(json.dumps(fake_rows()[0]) + "\n")
    assert main(["tune", "--replay", str(bad), "--runs", "6"]) == 2 and "not in the sweep's rows" in capsys.readouterr().err

def rows_with_requests(seed=0):
    rng = np.random.default_rng(seed)
    rows = []
    for r in fake_rows(seed):
        reqs = [[float(rng.uniform(0.05, 1.5)), float(rng.uniform(0.004, 0.04)), 32] for _ in range(10)]
        rows.append(r | dict(requests=reqs, wall_s=2.0))
    return rows

def test_with_slo_rescores_goodput():
    rows = rows_with_requests()
    strict, loose = with_slo(rows, 0.5, 0.01), with_slo(rows, 10.0, 1.0)
    assert all(r["goodput"] == 5.0 for r in loose)                          # 10 requests in 2 s, all good
    assert all(s["goodput"] == sum(q[0] <= 0.5 and q[1] <= 0.01 for q in r["requests"]) / 2 for s, r in zip(strict, rows))
    with pytest.raises(ValueError, match="per-request"): with_slo(fake_rows(), 0.5, 0.01)

def test_cli_objectives_and_slo(tmp_path, capsys):
    src = tmp_path / "grid.jsonl"; src.write_text("".join(json.dumps(r) + "\n" for r in rows_with_requests()))
    assert main(["tune", "--replay", str(src), "--runs", "12", "--maximize", "goodput,top1_agreement", "--minimize", "",
                 "--slo-ttft-ms", "500", "--slo-tpot-ms", "10"]) == 0
    out = capsys.readouterr().out
    assert "goodput,top1_agreement up" in out and "TTFT <= 500 ms, TPOT <= 10 ms" in out
    assert main(["tune", "--replay", str(src), "--slo-ttft-ms", "500"]) == 2 and "go together" in capsys.readouterr().err
    assert main(["tune", "--replay", str(src), "--maximize", "nonsense,goodput"]) == 2 and "nonsense" in capsys.readouterr().err
    plain = tmp_path / "plain.jsonl"; plain.write_text("".join(json.dumps(r) + "\n" for r in fake_rows()))
    assert main(["tune", "--replay", str(plain), "--slo-ttft-ms", "500", "--slo-tpot-ms", "10"]) == 2
    assert "per-request" in capsys.readouterr().err

# --- one study shared by processes: --storage, --workers and the claim protocol --------------------------------------
import os, subprocess, sys, threading, time
from pathlib import Path
from inferlab.frontier.tune import claim, open_storage, open_study, study_counts

def live_children() -> set[int]:
    "Pids of this process's live children, from /proc."
    kids = set()
    for task in Path(f"/proc/{os.getpid()}/task").iterdir():
        try: kids |= {int(p) for p in (task / "children").read_text().split()}
        except OSError: pass
    return kids

def grid_file(tmp_path) -> str:
    src = tmp_path / "grid.jsonl"; src.write_text("".join(json.dumps(r) + "\n" for r in fake_rows()))
    return str(src)

def check_study(study, runs):
    "Exactly `runs` trials measured, each a different configuration; every other trial reused one or was over budget."
    trials = study.get_trials()
    keys = [t.user_attrs["config_key"] for t in trials if t.user_attrs.get("measured")]
    assert len(keys) == len(set(keys)) == runs
    for t in trials:
        over = t.user_attrs.get("decision") == "over budget"
        assert (t.state.name, over) in (("COMPLETE", False), ("PRUNED", True)), (t.number, t.state, t.user_attrs)
        assert t.user_attrs.get("measured") or over or t.user_attrs["repeat_of"] < len(trials)

@pytest.mark.parametrize("scheme", ["sqlite", "journal"])
def test_two_processes_complete_one_study(tmp_path, scheme):
    url = f"sqlite:///{tmp_path}/tune.db" if scheme == "sqlite" else f"journal:{tmp_path}/tune.journal"
    cmd = [sys.executable, "-m", "inferlab.cli", "tune", "--replay", grid_file(tmp_path), "--storage", url,
           "--study", "s", "--runs", "16"]
    before = live_children()
    procs = [subprocess.Popen(cmd + ["--seed", "0"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(2)]                                    # same seed: the processes' thread ids tell them apart
    try: outs = [p.communicate(timeout=120) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None: p.kill(); p.wait()
    assert [p.returncode for p in procs] == [0, 0], outs
    assert all("study 's':" in out and "16 configurations measured" in out for out, _ in outs)
    check_study(open_study(url, "s"), 16)
    assert live_children() - before == set()

def test_workers_report_like_one_process(tmp_path, capsys):
    before = live_children()
    assert main(["tune", "--replay", grid_file(tmp_path), "--runs", "12", "--workers", "2",
                 "--out", str(tmp_path / "t.jsonl")]) == 0
    out = capsys.readouterr().out
    assert "no --storage: the 2 workers share journal:" in out and "12 configurations measured" in out
    assert "of the grid's (48 runs)" in out and "best goodput" in out
    rows = [json.loads(l) for l in (tmp_path / "t.jsonl").read_text().splitlines()]
    assert len({config_key(r["config"]) for r in rows}) == len(rows) == 12
    journal = out.split("share journal:")[1].split()[0]
    assert not Path(journal).parent.exists()                       # the temporary directory is gone
    assert live_children() - before == set()

def test_a_failing_worker_is_reported_with_its_exit_code(tmp_path, capsys):
    few = tmp_path / "few.jsonl"; few.write_text(json.dumps(fake_rows()[0]) + "\n")
    assert main(["tune", "--replay", str(few), "--runs", "4", "--workers", "1",
                 "--storage", f"journal:{tmp_path}/t.journal"]) == 1
    err = capsys.readouterr().err
    assert "worker 0 (pid" in err and "exited with code 2" in err and "not in the sweep's rows" in err

def test_claim_measures_a_configuration_once_when_two_propose_it_at_once(tmp_path):
    url, calls, barrier = f"journal:{tmp_path}/race.journal", [], threading.Barrier(2)
    axes = dict(maximize=("x",), minimize=("y",))
    def measure(key):
        calls.append(key); time.sleep(0.005)
        return {"x": 1.0, "y": 2.0}
    def proposer(errors):
        try:
            study = open_study(url, "race", axes)
            for i in range(25):
                t = study.ask(); barrier.wait(timeout=30)
                study.tell(t, claim(t, f"c{i}", lambda: measure(f"c{i}"), lambda r: (r["x"], r["y"]), poll=0.001,
                                    timeout=30))
        except Exception as e: errors.append(e); barrier.abort()
    errors = []
    threads = [threading.Thread(target=proposer, args=(errors,)) for _ in range(2)]
    for th in threads: th.start()
    for th in threads: th.join(timeout=60)
    assert not errors and sorted(calls) == sorted(f"c{i}" for i in range(25))
    assert study_counts(open_study(url, "race", axes)) == dict(trials=50, measured=25, repeats=25, over_budget=0,
                                                               failed=0)

def test_threads_share_a_budget(tmp_path):
    "Two searches on one storage, each measurement slowed down so that they overlap: `runs` in all, none twice."
    look, calls = replay(fake_rows()), []
    def evaluate(c):
        calls.append(config_key(c)); time.sleep(0.01)
        return look(c)
    storage = open_storage(f"journal:{tmp_path}/t.journal")
    found = []
    threads = [threading.Thread(target=lambda: found.append(tune(evaluate, runs=14, seed=0, storage=storage,
                                                                 study_name="s", poll=0.005, wait_timeout=30)))
               for _ in range(2)]
    for th in threads: th.start()
    for th in threads: th.join(timeout=120)
    assert len(calls) == len(set(calls)) == 14 and len(found) == 2
    assert all([config_key(r["config"]) for r in f] == [config_key(r["config"]) for r in found[0]] for f in found)
    check_study(open_study(storage, "s"), 14)

def test_cli_shared_study_errors(tmp_path, capsys):
    src = grid_file(tmp_path)
    for argv, flag in [(["--storage", "foo://x"], "--storage 'foo://x'"), (["--storage", "tune.db"], "--storage"),
                       (["--storage", "journal:"], "--storage"), (["--workers", "0"], "--workers"),
                       (["--study", "s"], "--study")]:
        assert main(["tune", "--replay", src, *argv]) == 2
        err = capsys.readouterr().err
        assert err.startswith("inferlab tune: error: ") and flag in err, err
    assert main(["tune", "--replay", src, "--runs", "6", "--storage", f"sqlite:///{tmp_path}/one.db"]) == 0
    assert "study 'tune': " in capsys.readouterr().out                 # one process on a storage: the study's counts
    assert study_counts(open_study(f"sqlite:///{tmp_path}/one.db", "tune"))["measured"] == 6

def test_an_interrupted_parent_stops_its_workers(tmp_path, capsys):
    "SIGTERM to `--workers`: the worker stops, and none of its trials is left running in the study."
    import signal
    url, kids, before = f"sqlite:///{tmp_path}/t.db", set(), live_children()
    def interrupt():                   # once the worker runs trials, this process (inside run_workers) gets a SIGTERM
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            kids.update(live_children() - before)
            if kids and len(open_study(url, "tune").get_trials(deepcopy=False)) >= 4:
                return os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.1)
    th = threading.Thread(target=interrupt); th.start()
    rc = main(["tune", "--replay", grid_file(tmp_path), "--runs", "1000", "--workers", "1", "--storage", url])
    th.join()
    assert rc == 130 and "interrupted: the workers are stopped" in capsys.readouterr().err
    assert len(kids) == 1 and live_children() - before == set()
    assert {t.state.name for t in open_study(url, "tune").get_trials()} <= {"COMPLETE", "FAIL", "PRUNED"}

def test_worker_argv_keeps_the_flags_a_worker_needs():
    from inferlab.frontier.tune import _tune_parser, _worker_argv
    a = _tune_parser().parse_args(["--runs", "6", "--minimize", "", "--slo-ttft-ms", "500", "--slo-tpot-ms", "10",
                                   "--workers", "2", "--out", "x.jsonl", "--storage", "journal:j", "--study", "s"])
    assert _worker_argv(a) == ["--runs", "6", "--minimize", "", "--slo-ttft-ms", "500.0", "--slo-tpot-ms", "10.0"]
