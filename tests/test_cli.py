"The routing flags of `inferlab serve` (chapter 08): parsed, handed to the facade and to the disaggregation router, never to a worker."
import contextlib, io
import pytest
from inferlab.cli import build_parser, engine_argv, engine_kwargs, _disaggregated

def parse(*argv):
    return build_parser().parse_args(["serve", *argv])

def test_routing_flags_reach_the_facade_not_the_workers():
    args = parse("--router-mode", "round_robin", "--kv-overlap-score-weight", "0.5", "-dp", "2")
    kw = engine_kwargs(args)
    assert (kw["router_mode"], kw["kv_overlap_score_weight"], kw["data_parallel_size"]) == ("round_robin", 0.5, 2)
    argv = engine_argv(args)
    assert "--router-mode" not in argv and "--kv-overlap-score-weight" not in argv and "--data-parallel-size" in argv
    assert (engine_kwargs(parse())["router_mode"], engine_kwargs(parse())["kv_overlap_score_weight"]) == ("kv", 1.0)
    w = build_parser().parse_args(["worker", "--role", "decode", "--name", "inferlab-decode-0", "--router", "h:1",
                                   "--router-mode", "least_loaded"])            # accepted, and harmless there
    assert engine_kwargs(w)["router_mode"] == "least_loaded"

def test_bad_router_mode_is_a_usage_error():
    err = io.StringIO()
    with contextlib.redirect_stderr(err), pytest.raises(SystemExit) as e: parse("--router-mode", "random")
    assert e.value.code == 2 and "--router-mode: invalid choice: 'random'" in err.getvalue()

def test_disaggregation_router_gets_the_routing_flags(monkeypatch):
    import inferlab.serve.router as router
    seen = {}
    monkeypatch.setattr(router, "DisaggRouter", lambda *a, **kw: seen.update(kw, args=a) or "router")
    args = parse("--disaggregation", "1P2D", "--router-mode", "least_loaded", "--kv-overlap-score-weight", "3")
    assert _disaggregated(args) == "router"
    assert seen["router_mode"] == "least_loaded" and seen["kv_overlap_score_weight"] == 3.0 and seen["args"][1:] == (1, 2)
    assert "--router-mode" not in seen["worker_args"]
