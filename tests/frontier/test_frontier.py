"""`inferlab frontier`: every row marked, exactly the non-dominated ones true (checked by brute force), the marked
file written, bad input answered with exit code 2 and a message naming the file and line or the axis."""
import json, random
import pytest
from inferlab.cli import main
from inferlab.frontier.frontier import mark_frontier, read_rows

AXES = dict(maximize=("output_throughput", "top1_agreement"), minimize=("tpot_p50",))

def brute_force(rows):
    "Row i is dominated when some j is at least as good on every axis and better on one."
    def at_least(o, r): return (o["output_throughput"] >= r["output_throughput"] and o["top1_agreement"] >= r["top1_agreement"]
                                and o["tpot_p50"] <= r["tpot_p50"])
    def better(o, r): return (o["output_throughput"] > r["output_throughput"] or o["top1_agreement"] > r["top1_agreement"]
                              or o["tpot_p50"] < r["tpot_p50"])
    return [not any(at_least(o, r) and better(o, r) for j, o in enumerate(rows) if j != i) for i, r in enumerate(rows)]

def random_rows(rng, n):
    return [dict(config={"i": i}, output_throughput=rng.choice([100, 200, 300, 400]), top1_agreement=rng.choice([0.9, 0.95, 1.0]),
                 tpot_p50=rng.choice([0.01, 0.02, 0.03])) for i in range(n)]

def test_marks_exactly_the_non_dominated_rows():
    rng = random.Random(0)
    for _ in range(400):
        rows = random_rows(rng, rng.randint(1, 20))
        assert [r["pareto"] for r in mark_frontier(rows, **AXES)] == brute_force(rows)

def test_cli_writes_every_row_marked(tmp_path, capsys):
    rows = random_rows(random.Random(1), 48)
    src, out = tmp_path / "results.jsonl", tmp_path / "marked.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert main(["frontier", str(src), "--out", str(out), "--plot", str(tmp_path / "f.png")]) == 0
    marked = read_rows(out)
    assert [r["config"] for r in marked] == [r["config"] for r in rows] and [r["pareto"] for r in marked] == brute_force(rows)
    assert (tmp_path / "f.png").stat().st_size > 1000
    assert f"{sum(brute_force(rows))} of 48 configurations on the frontier" in capsys.readouterr().out

@pytest.mark.parametrize("text, args, message", [
    ('{"output_throughput": 1}\n[1]\n', [], "results.jsonl:2: expected a JSON object"),
    ('{"output_throughput": 1\n', [], "results.jsonl:1: not JSON"),
    ('{"output_throughput": 1, "tpot_p50": 0.1, "top1_agreement": "high"}\n', [], "top1_agreement: row 0"),
    ('{"output_throughput": 1, "tpot_p50": 0.1}\n', ["--maximize", "output_throughput"], None)])
def test_bad_input_exits_2_naming_it(tmp_path, capsys, text, args, message):
    src = tmp_path / "results.jsonl"; src.write_text(text)
    code = main(["frontier", str(src), *args])
    if message is None: assert code == 0; return
    assert code == 2 and message in capsys.readouterr().err
