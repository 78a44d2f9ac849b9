"""`inferlab calibrate`: the serving stack's two terms act where they should in the simulator, the fit recovers
known terms from a simulated run, bad options exit 2. (Chapter 78 runs the served calibration itself.)"""
import pytest
from inferlab.cli import main
from inferlab.fleet.replica import StepTimeModel
from inferlab.frontier.calibrate import errors, fit_overhead, sim_served
from inferlab.frontier.step_sim import simulate
from inferlab.model.tokenizer import load_tokenizer
from inferlab.serve.bench import serve_requests

STEP = StepTimeModel(prefill_a=1e-3, prefill_b=3e-5, prefill_c=0.0, decode_a=4e-3, decode_b=2e-8, decode_c=2e-4)

def test_terms_act_where_they_should():
    (r,) = simulate(STEP, [(1.0, 100, 4)], request_delay_s=0.05, per_token_s=1e-3)
    prefill = STEP.prefill_time(100, 100 ** 2) + 1e-3                     # the first token pays the per-token cost too
    assert r.times[0] - r.arrival == pytest.approx(0.05 + prefill)
    step = STEP.decode_time(101, 1) + 1e-3
    assert r.times[1] - r.times[0] == pytest.approx(step)

@pytest.mark.parametrize("delay, per_token", [(0.02, 5e-4), (0.0, 1e-4), (0.008, 0.0), (0.0, 0.0)])
def test_fit_recovers_known_terms(delay, per_token):
    reqs = serve_requests(load_tokenizer(), n=50, seed=4, prompt_len=(16, 300), output_len=(40, 0.5, 4, 96))
    truth = sim_served(STEP, reqs, 6.0, seed=1, request_delay_s=delay, per_token_s=per_token)
    d, c = fit_overhead(STEP, reqs, 6.0, truth, seed=1)
    assert d == pytest.approx(delay, abs=5e-4) and c == pytest.approx(per_token, abs=2e-5)
    err = errors(truth, sim_served(STEP, reqs, 6.0, 1, d, c))
    assert all(abs(err[k]) < 0.01 for k in ("output_throughput", "median_ttft_ms", "median_tpot_ms")), err

@pytest.mark.parametrize("args", [["--train-rate", "0"], ["--test-rate", "inf"]])
def test_bad_options_exit_2(capsys, args):
    assert main(["calibrate", *args]) == 2 and "rate" in capsys.readouterr().err
