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
