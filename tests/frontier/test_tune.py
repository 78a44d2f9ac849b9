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
