"`inferlab serve -tp 2`: the official client gets the single process's tokens; the workers go with the server, however it ends; a dead worker ends the server."
import os, signal, subprocess, sys, tempfile, time
import httpx, openai, pytest
from parallel_helpers import children_of
from inferlab.llm import LLM
from inferlab.model.sampling import SamplingParams
from inferlab.parallel.collectives import free_port

def start(*args):
    port, log = free_port(), tempfile.NamedTemporaryFile("w+", suffix=".log", delete=False)
    cmd = [sys.executable, "-c", "import sys; from inferlab.cli import main; sys.exit(main())", "serve", "--port", str(port),
           "--log-level", "warning", *args]
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    base, t0 = f"http://127.0.0.1:{port}", time.monotonic()
    while True:
        assert proc.poll() is None, open(log.name).read()[-2000:]
        try:
            if httpx.get(base + "/health", timeout=1).status_code == 200: return proc, base, log
        except httpx.TransportError: pass
        assert time.monotonic() - t0 < 120, open(log.name).read()[-2000:]
        time.sleep(0.2)

def gone(pids, timeout: float) -> bool:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if not any(os.path.exists(f"/proc/{p}") and "Z" not in open(f"/proc/{p}/stat").read().rsplit(")", 1)[1][:3]
                   for p in pids): return True
        time.sleep(0.2)
    return False

@pytest.mark.parametrize("stop", ["kill"])   # the hard case: SIGKILL leaves the workers to notice on their own
def test_serve_tp2(stop):
    proc, base, log = start("-tp", "2")
    try:
        workers = children_of(proc.pid)
        assert len(workers) >= 1, "the server should have spawned its rank-1 worker"
        client = openai.OpenAI(base_url=base + "/v1", api_key="none", max_retries=0)
        got = client.completions.create(model="tiny-dense", prompt="Once upon a time", max_tokens=16, temperature=0)
        want = LLM("tiny-dense", dtype="float32").generate("Once upon a time", SamplingParams(max_tokens=16, temperature=0))[0]
        assert got.choices[0].text == want.text
    finally:
        proc.send_signal(signal.SIGTERM if stop == "terminate" else signal.SIGKILL)
        proc.wait(20)
        log.close(); os.unlink(log.name)
    assert gone(workers, 30), f"worker(s) {workers} outlived a server stopped by {stop}"

def test_serve_exits_when_its_worker_dies():
    "A killed TP worker is an EngineDeadError: the request in flight gets a 5xx error object, the server exits 1."
    proc, base, log = start("-tp", "2")
    try:
        workers = children_of(proc.pid)
        assert len(workers) >= 1, "the server should have spawned its rank-1 worker"
        client = openai.OpenAI(base_url=base + "/v1", api_key="none", max_retries=0, timeout=60)
        client.completions.create(model="tiny-dense", prompt="import os", max_tokens=4, temperature=0)
        for w in workers: os.kill(w, signal.SIGKILL)
        with pytest.raises(openai.APIStatusError) as err:
            client.completions.create(model="tiny-dense", prompt="def f():", max_tokens=32, temperature=0)
        assert err.value.status_code >= 500 and "rank" in err.value.message
        assert proc.wait(30) == 1, "the server should exit when its engine is dead"
        assert "the engine died" in open(log.name).read()
    finally:
        if proc.poll() is None: proc.kill(); proc.wait(20)
        log.close(); os.unlink(log.name)
    assert gone(workers, 30)

def test_serve_dp2_answers_concurrent_streams():
    "`inferlab serve --data-parallel-size 2`: 32 concurrent streams from the official client, each one replica's text."
    import concurrent.futures as cf
    from inferlab.model.config import data_dir
    text = (data_dir() / "corpus" / "valid.txt").read_text()
    ps = [text[i * 700:i * 700 + 40 + (i * 37) % 200] for i in range(32)]
    want = [o.text for o in LLM("tiny-dense", dtype="float32").generate(ps, SamplingParams(max_tokens=24, temperature=0))]
    proc, base, log = start("--data-parallel-size", "2")
    try:
        client = openai.OpenAI(base_url=base + "/v1", api_key="none", max_retries=0, timeout=120)
        def stream(p):
            chunks = client.completions.create(model="tiny-dense", prompt=p, max_tokens=24, temperature=0, stream=True)
            return "".join(c.choices[0].text for c in chunks)
        with cf.ThreadPoolExecutor(32) as ex: got = list(ex.map(stream, ps))
        running = [float(l.split()[-1]) for l in httpx.get(base + "/metrics").text.splitlines()
                   if l.startswith("inferlab:num_requests_running")]
    finally:
        proc.send_signal(signal.SIGTERM); proc.wait(30)
        log.close(); os.unlink(log.name)
    print(f"\n{sum(a == b for a, b in zip(got, want))}/32 streams equal the one-process text")
    assert got == want and running == [0.0]
