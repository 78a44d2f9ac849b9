"`inferlab bench serve` (chapter 53) against a fake OpenAI-compatible streaming server with known delays."
import asyncio, contextlib, io, json, math, socket, threading, time
import numpy as np
import pytest
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse
from inferlab.llm import LLM
from inferlab.model.tokenizer import load_tokenizer
from inferlab.serve.bench import (BenchRun, RequestResult, arrival_times, benchmark, build_parser, check_args,
                                  format_report, is_good, main, offline_throughput, parse_goodput, serve_requests,
                                  sse_data, summarize)

# --- the fake server: sleeps `ttft` before the first token and `tpot` before each further one -----------------------

def _sse(obj) -> str: return f"data: {json.dumps(obj)}\n\n"

def _chunk(text, finish=None, usage=None):
    choices = [] if text is None else [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish}]
    return {"id": "cmpl-fake", "object": "text_completion", "created": int(time.time()), "model": "fake-model",
            "choices": choices, "usage": usage}

def fake_app(ttft=0.02, tpot=0.005, serial=False, max_queue=None, usage=True, done=True, tokens_per_chunk=1,
             api_key=None) -> FastAPI:
    app = FastAPI()
    st = app.state.bench = type("State", (), dict(in_flight=0, peak=0, served=0, bodies=[]))()
    lock = asyncio.Lock() if serial else contextlib.nullcontext()

    def denied(request):
        if api_key and request.headers.get("authorization") != f"Bearer {api_key}":
            return JSONResponse({"error": {"message": "bad key", "type": "auth", "param": None, "code": 401}}, 401)

    @app.get("/v1/models")
    async def models(request: Request):
        return denied(request) or {"object": "list", "data": [{"id": "fake-model", "object": "model"}]}

    @app.post("/v1/completions")
    async def completions(request: Request):
        if (d := denied(request)): return d
        body = await request.json(); st.bodies.append(body)
        n = int(body["max_tokens"])
        if max_queue is not None and st.in_flight >= max_queue:
            err = {"message": "the server's queue is full", "type": "server_overloaded", "param": None, "code": 503}
            return JSONResponse({"error": err}, status_code=503)
        st.in_flight += 1; st.peak = max(st.peak, st.in_flight)
        async def stream():
            try:
                async with lock:
                    st.served += 1
                    for i in range(0, n, tokens_per_chunk):
                        await asyncio.sleep(ttft if i == 0 else tpot * tokens_per_chunk)
                        yield _sse(_chunk("".join(f" t{j}" for j in range(i, min(n, i + tokens_per_chunk)))))
                    if usage:
                        p = len(body["prompt"])
                        yield _sse(_chunk(None, usage={"prompt_tokens": p, "completion_tokens": n, "total_tokens": p + n}))
                    if done: yield "data: [DONE]\n\n"
            finally: st.in_flight -= 1
        return StreamingResponse(stream(), media_type="text/event-stream")
    return app

@contextlib.contextmanager
def fake_server(**kw):
    "The fake on a free port, in a uvicorn server on a thread, stopped (and the thread joined) on exit."
    app = fake_app(**kw)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)   # so asyncio sets TCP_NODELAY
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=sock.getsockname()[1], log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs=dict(sockets=[sock]), daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 10
        while not server.started and thread.is_alive() and time.monotonic() < deadline: time.sleep(0.01)
        assert server.started, "the fake server did not start"
        yield f"http://127.0.0.1:{sock.getsockname()[1]}", app.state.bench
    finally:
        server.should_exit = True; thread.join(10); sock.close()
        assert not thread.is_alive(), "the fake server's thread is still running"

@pytest.fixture(autouse=True)
def no_thread_left_behind():
    "Every fake server's thread is joined. (tqdm's own monitor thread is tqdm's: `LLM.generate` starts it.)"
    before = set(threading.enumerate())
    yield
    for _ in range(100):                                   # a thread that is ending may take a moment
        left = [t for t in threading.enumerate() if t not in before and t.is_alive() and t.name != "tqdm_monitor"]
        if not left: return
        time.sleep(0.01)
    pytest.fail(f"threads left running: {left}")

@pytest.fixture(scope="module")
def tok(): return load_tokenizer()

@pytest.fixture(scope="module")
def small(tok): return serve_requests(tok, 12, seed=0, prompt_len=(16, 64), output_len=(16, 0.3, 4, 32))

def _fixed(tok, n, max_tokens, seed=0):
    return [(p, max_tokens) for p, _ in serve_requests(tok, n, seed=seed, prompt_len=(16, 64))]

# --- workload and arrivals -----------------------------------------------------------------------------------------

def test_serve_requests(tok):
    reqs = serve_requests(tok, 300, seed=0)
    plens, olens = np.array([len(p) for p, _ in reqs]), np.array([m for _, m in reqs])
    assert len(reqs) == 300 and plens.min() >= 16 and plens.max() <= 512 and olens.min() >= 1 and olens.max() <= 256
    assert plens.max() - plens.min() > 400 and abs(olens.mean() - 64) < 6
    assert all(isinstance(i, int) for i in reqs[0][0]) and all(isinstance(m, int) for _, m in reqs)
    assert serve_requests(tok, 300, seed=0) == reqs != serve_requests(tok, 300, seed=1)
    text = "def f(x):\n    return x + 1\n" * 50
    ids = tok.encode(text)
    for p, m in serve_requests(tok, 5, seed=0, prompt_len=(10, 20), output_len=(8, 0.0, 8, 8), text=text):
        assert 10 <= len(p) <= 20 and m == 8 and any(ids[s:s + len(p)] == p for s in range(len(ids) - len(p) + 1))

def test_serve_requests_long_mix(tok):
    "A fraction of long prompts mixed into short ones; the short ones are those of the unmixed run's lengths range."
    plain, mixed = serve_requests(tok, 400, seed=3, prompt_len=(16, 64)), serve_requests(tok, 400, seed=3, prompt_len=(16, 64), long=(0.25, 1000, 1200))
    lens = np.array([len(p) for p, _ in mixed])
    long = (lens >= 1000) & (lens <= 1200)
    assert 0.18 < long.mean() < 0.32 and np.all((lens[~long] >= 16) & (lens[~long] <= 64))
    assert serve_requests(tok, 400, seed=3, prompt_len=(16, 64), long=(0.0, 1000, 1200)) == plain

@pytest.mark.parametrize("kw, name", [(dict(n=0), "n"), (dict(prompt_len=(64, 16)), "prompt_len"),
                                      (dict(prompt_len=(0, 16)), "prompt_len"), (dict(output_len=(64, 0.5, 1)), "output_len"),
                                      (dict(output_len=(500, 0.5, 1, 256)), "output_len"),
                                      (dict(output_len=(64, -1, 1, 256)), "output_len"),
                                      (dict(prompt_len=(16, 10**7)), "prompt_len"),
                                      (dict(long=(1.5, 100, 200)), "long_fraction"),
                                      (dict(long=(-0.1, 100, 200)), "long_fraction"),
                                      (dict(long=(0.2, 300, 200)), "long_len")])
def test_serve_requests_validation(tok, kw, name):
    with pytest.raises(ValueError, match=name): serve_requests(tok, **({"n": 3} | kw))

@pytest.mark.parametrize("k", [0.25, 1.0, 4.0])
def test_arrival_gaps_mean_and_cv(k):
    t = arrival_times(20_001, 10.0, k, seed=0)
    gaps = np.diff(t)
    assert t[0] == 0 and (gaps >= 0).all()
    assert gaps.mean() == pytest.approx(0.1, rel=0.03) and gaps.std() / gaps.mean() == pytest.approx(k ** -0.5, rel=0.05)

def test_arrival_times_inf_seed_and_validation():
    assert (arrival_times(7) == 0).all() and len(arrival_times(7)) == 7
    assert np.array_equal(arrival_times(30, 5, seed=2), arrival_times(30, 5, seed=2))
    assert not np.array_equal(arrival_times(30, 5, seed=2), arrival_times(30, 5, seed=3))
    for kw, name in [(dict(request_rate=0), "request_rate"), (dict(request_rate=math.nan), "request_rate"),
                     (dict(burstiness=0), "burstiness"), (dict(burstiness=math.inf), "burstiness"), (dict(n=0), "n")]:
        with pytest.raises(ValueError, match=name): arrival_times(**({"n": 3} | kw))

# --- one request, the run ------------------------------------------------------------------------------------------

def test_sse_data():
    assert sse_data("data: [DONE]") == "[DONE]" and sse_data('data:{"a": 1}') == '{"a": 1}'
    assert sse_data("") is None and sse_data(": keep-alive") is None and sse_data("event: x") is None

def test_timings_match_the_fakes_delays(tok):
    reqs = _fixed(tok, 8, 24)
    with fake_server(ttft=0.02, tpot=0.005) as (url, state):
        run = benchmark(url, reqs, max_concurrency=2, progress=False)
    assert run.model == "fake-model" and all(r.success and r.status == 200 for r in run.results)
    assert all(r.output_tokens == 24 and len(r.itl) == 23 for r in run.results)
    ttft, tpot = np.median([r.ttft for r in run.results]), np.median([r.tpot for r in run.results])
    itl = np.median([x for r in run.results for x in r.itl])
    assert 0.0195 <= ttft < 0.06 and 0.0049 <= tpot < 0.012 and 0.0049 <= itl < 0.012
    for r in run.results:
        assert r.e2el == pytest.approx(r.ttft + sum(r.itl), abs=0.005)
        assert r.tpot == pytest.approx((r.e2el - r.ttft) / 23)
    body = state.bodies[0]
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True} and body["ignore_eos"] is True
    assert body["temperature"] == 0 and body["model"] == "fake-model" and body["prompt"] in [p for p, _ in reqs]

def test_output_tokens_from_usage_and_fallback(tok):
    reqs = _fixed(tok, 3, 12)
    with fake_server(ttft=0.005, tpot=0.001, tokens_per_chunk=4) as (url, _):     # 3 chunks of 4 tokens
        run = benchmark(url, reqs, progress=False)
    assert all(r.success and r.output_tokens == 12 and len(r.itl) == 2 for r in run.results)
    with fake_server(ttft=0.005, tpot=0.001, usage=False) as (url, _):            # no usage: count the chunks
        run = benchmark(url, reqs, progress=False)
    assert all(r.success and r.output_tokens == 12 for r in run.results)

def test_stream_without_done_is_a_failure(tok):
    with fake_server(ttft=0.005, tpot=0.001, done=False) as (url, _):
        run = benchmark(url, _fixed(tok, 2, 4), progress=False)
    assert not any(r.success for r in run.results) and all("[DONE]" in r.error for r in run.results)

def test_503_is_recorded_as_failed(small):
    with fake_server(ttft=0.2, max_queue=2) as (url, _):
        run = benchmark(url, small[:6], progress=False)
    assert sum(r.success for r in run.results) == 2 and [r.status for r in run.results].count(503) == 4
    rep = summarize(run)
    assert rep["completed"] == 2 and rep["failed"] == 4 and rep["errors"] == {"HTTP 503: the server's queue is full": 4}
    assert "queue is full" in format_report(rep)

def test_max_concurrency_is_respected(small):
    with fake_server(ttft=0.02, tpot=0.002) as (url, state):
        run = benchmark(url, small, max_concurrency=3, progress=False)
        assert state.peak == 3
        state.peak = 0
        benchmark(url, small, progress=False)
        assert state.peak > 3
    assert all(r.success for r in run.results) and max(r.start - r.scheduled for r in run.results) > 0.02

def test_serial_server_queueing_shows_in_ttft_not_itl(tok):
    reqs = _fixed(tok, 12, 8)
    with fake_server(ttft=0.01, tpot=0.001, serial=True) as (url, _):
        burst = benchmark(url, reqs, progress=False)                     # all at once: a queue of 12
        one = benchmark(url, reqs, max_concurrency=1, progress=False)    # one at a time: no queue
    t_burst, t_one = sorted(r.ttft for r in burst.results), sorted(r.ttft for r in one.results)
    assert t_burst[-1] > 5 * np.median(t_one)                             # the last waited for the other 11
    i_burst, i_one = np.median([x for r in burst.results for x in r.itl]), np.median([x for r in one.results for x in r.itl])
    assert i_burst < 3 * i_one

def test_open_loop_keeps_its_schedule(tok):
    reqs = _fixed(tok, 10, 4)
    with fake_server(ttft=0.005, tpot=0.001) as (url, _):
        run = benchmark(url, reqs, request_rate=50, seed=1, progress=False)
    want = arrival_times(10, 50, seed=1)
    assert [r.scheduled for r in run.results] == pytest.approx(want.tolist())
    assert all(0 <= r.start - r.scheduled < 0.05 for r in run.results)
    assert run.duration >= want[-1]

def test_api_key_and_model_name(small):
    with fake_server(ttft=0.005, tpot=0.001, api_key="sekrit") as (url, state):
        run = benchmark(url, small[:2], api_key="sekrit", progress=False)
        assert all(r.success for r in run.results)
        benchmark(url, small[:2], api_key="sekrit", model_name="mine", progress=False)
        assert [b["model"] for b in state.bodies] == ["fake-model"] * 2 + ["mine"] * 2
        bad = benchmark(url, small[:2], api_key="wrong", model_name="mine", progress=False)
    assert all(r.status == 401 and r.error == "HTTP 401: bad key" for r in bad.results)

def test_unreachable_server(small):
    with fake_server() as (url, _): pass
    with pytest.raises(ValueError, match="--base-url"): benchmark(url, small[:2], progress=False)
    run = benchmark(url, small[:2], model_name="m", progress=False)
    assert all(not r.success and r.status is None and "Connect" in r.error for r in run.results)
    with pytest.raises(ValueError, match="--base-url"): benchmark("localhost:8000", small[:2])
    with pytest.raises(ValueError, match="requests"): benchmark(url, [])
    with pytest.raises(ValueError, match="max_concurrency"): benchmark(url, small[:2], max_concurrency=0)

def test_benchmark_inside_a_running_event_loop(small):
    with fake_server(ttft=0.005, tpot=0.001) as (url, _):
        async def inside(): return benchmark(url, small[:3], progress=False)   # as in a Jupyter cell
        run = asyncio.run(inside())
    assert all(r.success for r in run.results)

# --- the report ----------------------------------------------------------------------------------------------------

def test_goodput_loose_equals_throughput_impossible_is_zero(small):
    with fake_server(ttft=0.02, tpot=0.005) as (url, _):
        run = benchmark(url, small, progress=False)
    loose = summarize(run, parse_goodput(["ttft:60000", "tpot:60000", "e2el:600000"]))
    assert loose["request_goodput"] == loose["request_throughput"] == pytest.approx(len(small) / run.duration)
    assert summarize(run, {"ttft": 1.0})["request_goodput"] == 0
    assert summarize(run, {"tpot": 0.5})["request_goodput"] == 0
    mid = np.median([r.e2el for r in run.results]) * 1e3
    assert 0 < summarize(run, {"e2el": mid})["request_goodput"] < loose["request_throughput"]
    assert "request_goodput" not in summarize(run)

def test_summarize_by_hand():
    rs = [RequestResult(10, 3, success=True, ttft=0.1, e2el=0.3, itl=[0.1, 0.1], output_tokens=3),
          RequestResult(20, 1, success=True, ttft=0.2, e2el=0.2, itl=[], output_tokens=1),
          RequestResult(5, 4, error="HTTP 503: full", status=503)]
    rep = summarize(BenchRun(rs, 2.0, "m"), {"tpot": 50})
    assert rep["completed"] == 2 and rep["failed"] == 1 and rep["errors"] == {"HTTP 503: full": 1}
    assert rep["total_input_tokens"] == 30 and rep["total_output_tokens"] == 4
    assert rep["request_throughput"] == 1.0 and rep["output_throughput"] == 2.0 and rep["total_token_throughput"] == 17.0
    assert rep["mean_ttft_ms"] == pytest.approx(150) and rep["mean_e2el_ms"] == pytest.approx(250)
    assert rep["mean_tpot_ms"] == pytest.approx(100) and rep["p99_tpot_ms"] == pytest.approx(100)   # only out > 1
    assert rep["median_itl_ms"] == pytest.approx(100)
    assert rep["request_goodput"] == 0.5                  # the 1-token request has TPOT 0 and passes (vLLM's rule)
    assert not is_good(rs[2], {}) and is_good(rs[1], {"ttft": 200}) and not is_good(rs[1], {"ttft": 199})
    empty = summarize(BenchRun([], 1.0, "m"))
    assert empty["completed"] == 0 and empty["mean_ttft_ms"] == 0 and empty["request_throughput"] == 0
    table = format_report(rep)
    for line in ("Successful requests:", "Request goodput (req/s):", "Mean TTFT (ms):", "P99 ITL (ms):", "Median E2EL (ms):"):
        assert line in table

@pytest.mark.parametrize("bad", ["ttft", "ttft:", "ttft:-5", "ttft:0", "ttfb:10", "tpot:inf", "e2el:nan"])
def test_parse_goodput_rejects(bad):
    with pytest.raises(ValueError, match="--goodput"): parse_goodput([bad])

def test_parse_goodput():
    assert parse_goodput(["ttft:500", "tpot:50", "e2el:5000"]) == {"ttft": 500.0, "tpot": 50.0, "e2el": 5000.0}
    assert parse_goodput(None) == {} == parse_goodput([])

# --- the command ---------------------------------------------------------------------------------------------------

def test_parser_defaults():
    a = build_parser().parse_args([])
    assert a.base_url == "http://127.0.0.1:8000" and a.num_prompts == 200 and math.isinf(a.request_rate)
    assert a.burstiness == 1.0 and a.max_concurrency is None and a.prompt_len == [16, 512] and a.output_len == 64
    assert a.model is None and a.max_num_seqs == 64 and not a.offline_baseline and a.goodput is None
    assert check_args(build_parser().parse_args(["--goodput", "ttft:100"])) == {"ttft": 100.0}

@pytest.mark.parametrize("argv, flag", [(["--request-rate", "0"], "--request-rate"), (["--request-rate", "nan"], "--request-rate"),
                                        (["--burstiness", "0"], "--burstiness"), (["--max-concurrency", "0"], "--max-concurrency"),
                                        (["--num-prompts", "0"], "--num-prompts"), (["--prompt-len", "9", "3"], "--prompt-len"),
                                        (["--output-len", "0"], "--output-len"), (["--max-num-seqs", "0"], "--max-num-seqs"),
                                        (["--goodput", "x:1"], "--goodput"), (["--base-url", "127.0.0.1:8000"], "--base-url"),
                                        (["--out", "/no/such/folder/r.json"], "--out")])
def test_main_rejects_bad_options(argv, flag, capsys):
    with pytest.raises(ValueError, match=flag): check_args(build_parser().parse_args(argv))
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert flag in err and "Traceback" not in err

def _strict(s: str):
    return json.loads(s, parse_constant=lambda c: pytest.fail(f"not strict JSON: {c}"))

def test_main_writes_strict_json(tmp_path, capsys):
    out = tmp_path / "r.json"
    with fake_server(ttft=0.01, tpot=0.002) as (url, state):
        assert main(["--base-url", url, "--num-prompts", "10", "--prompt-len", "16", "48", "--output-len", "6",
                     "--max-concurrency", "4", "--goodput", "ttft:5000", "--out", str(out)]) == 0
    assert state.peak <= 4
    doc = _strict(out.read_text())
    assert doc["args"]["request_rate"] == "inf" and doc["report"]["completed"] == 10 and len(doc["requests"]) == 10
    assert doc["report"]["request_goodput"] == doc["report"]["request_throughput"]
    r0 = doc["requests"][0]
    assert {"ttft", "tpot", "itl", "e2el", "output_tokens", "scheduled", "start", "success", "error"} <= set(r0)
    assert all(16 <= r["prompt_len"] <= 48 and r["output_tokens"] == r["max_tokens"] <= 24 for r in doc["requests"])
    assert "Serving Benchmark Result" in capsys.readouterr().out

def test_main_all_failed_exits_1(capsys):
    with fake_server(ttft=0.3, max_queue=0) as (url, _):
        assert main(["--base-url", url, "--num-prompts", "3", "--prompt-len", "16", "32", "--output-len", "4"]) == 1
    assert "Failed requests:                        3" in capsys.readouterr().out

def test_offline_baseline(tmp_path, capsys):
    out = tmp_path / "r.json"
    with fake_server(ttft=0.005, tpot=0.001) as (url, _):
        assert main(["--base-url", url, "--num-prompts", "4", "--prompt-len", "16", "32", "--output-len", "6",
                     "--offline-baseline", "--max-num-seqs", "4", "--out", str(out)], make_llm=LLM) == 0
    rep = _strict(out.read_text())["report"]
    assert rep["offline_output_throughput"] > 0
    assert rep["online_offline_ratio"] == pytest.approx(rep["output_throughput"] / rep["offline_output_throughput"])
    assert "Online / offline output throughput" in capsys.readouterr().out

def test_offline_throughput_checks(tok):
    llm = LLM(max_num_seqs=4)
    with pytest.raises(ValueError, match="requests"): offline_throughput([], llm)
    reqs = serve_requests(tok, 2, seed=0, prompt_len=(16, 24), output_len=(4, 0.0, 4, 4))
    assert offline_throughput(reqs, llm, warmup_s=0) > 0
