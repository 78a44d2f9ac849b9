"Helpers of the server tests (a module of its own name: two `conftest` modules would shadow each other). A real `inferlab serve` process on a free loopback port, shared by a module's tests; stopped (never left behind) at the end."
import contextlib, os, socket, subprocess, sys, tempfile, time
import httpx, pytest

def free_port() -> int:
    with contextlib.closing(socket.socket()) as s:
        s.bind(("127.0.0.1", 0)); return s.getsockname()[1]

@contextlib.contextmanager
def serve_process(*args, timeout: float = 90.0):
    "Start `inferlab serve` with `args`; yield (base_url, process); terminate it (kill if it lingers) afterwards."
    port = free_port()
    log = tempfile.NamedTemporaryFile("w+", suffix=".log", delete=False)
    cmd = [sys.executable, "-c", "import sys; from inferlab.cli import main; sys.exit(main())", "serve",
           "--port", str(port), "--log-level", "warning", *args]
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    base = f"http://127.0.0.1:{port}"
    try:
        t0 = time.monotonic()
        while True:
            if proc.poll() is not None: raise RuntimeError(f"inferlab serve exited: {open(log.name).read()[-2000:]}")
            try:
                if httpx.get(base + "/health", timeout=1).status_code == 200: break
            except httpx.TransportError: pass
            if time.monotonic() - t0 > timeout: raise RuntimeError(f"inferlab serve did not start: {open(log.name).read()[-2000:]}")
            time.sleep(0.1)
        yield base, proc
    finally:
        proc.terminate()
        try: proc.wait(15)
        except subprocess.TimeoutExpired: proc.kill(); proc.wait(5)
        log.close(); os.unlink(log.name)

def metric(base: str, name: str, **labels) -> float:
    "One sample of the server's /metrics (summed over series matching `labels`)."
    total, found = 0.0, False
    for line in httpx.get(base + "/metrics").text.splitlines():
        if line.startswith("#") or not line.startswith(name): continue
        head, value = line.rsplit(" ", 1)
        if head.split("{")[0] != name or not all(f'{k}="{v}"' in head for k, v in labels.items()): continue
        total, found = total + float(value), True
    assert found, f"{name} {labels} not in /metrics"
    return total
