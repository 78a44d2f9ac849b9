"""Workers that register from other hosts — a router on 127.0.0.1, a prefill worker on 127.0.0.2, a decode worker on
127.0.0.3, each an `inferlab worker` process, KV over TCP (chapters 56a-58): the aggregated server's greedy text, and
the faults across hosts: a prefill worker that dies mid-transfer, a damaged payload, a router restart."""
import contextlib, os, secrets, subprocess, sys, tempfile, time
from pathlib import Path
import pytest
from serve_helpers import serve_process, metric, prompts, complete_all
from inferlab.parallel.collectives import free_port

KEY = secrets.token_hex(16)
ROUTER = ["--disaggregation", "remote", "--kv-transport", "tcp", "--max-local-prefill-length", "96",
          "--max-prefill-queue", "1000", "--num-kv-blocks", "2048"]
PS = prompts(24, seed=3)
LONG = [p for p in PS if len(p) > 96]                              # prefilled remotely
MISBEHAVING = Path(__file__).with_name("misbehaving_prefill.py")

@pytest.fixture(scope="module", autouse=True)
def authkey():
    "The router reads the key from its environment; the workers from theirs."
    os.environ["INFERLAB_AUTHKEY"] = KEY
    yield
    os.environ.pop("INFERLAB_AUTHKEY", None)

@pytest.fixture(scope="module")
def want(authkey) -> list[str]:
    with serve_process("--num-kv-blocks", "2048") as (base, _): return complete_all(base, PS)

@contextlib.contextmanager
def processes(*cmds):
    "Start `cmds` (each its own log); yield (processes, logs); kill whatever still runs at the end."
    logs = [tempfile.NamedTemporaryFile("w+", suffix=".log") for _ in cmds]
    procs = [subprocess.Popen(c, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "OMP_NUM_THREADS": "1"})
             for c, log in zip(cmds, logs)]
    try: yield procs, logs
    finally:
        for p in procs:
            if p.poll() is None: p.kill()
            p.wait(10)
        for log in logs: log.close()

def worker(role: str, host: str, port: int, *extra) -> list[str]:
    return [sys.executable, "-m", "inferlab.cli", "worker", "--role", role, "--router", f"127.0.0.1:{port}",
            "--host", host, "--threads", "1", "--num-kv-blocks", "2048", "--reconnect-timeout", "60", *extra]

def wait_workers(base: str, prefill: int = 1, decode: int = 1, timeout: float = 120.0):
    deadline = time.monotonic() + timeout
    while True:
        try:
            if (metric(base, "inferlab:disagg_workers", role="prefill"),
                    metric(base, "inferlab:disagg_workers", role="decode")) == (prefill, decode): return
        except AssertionError: pass                                   # no step has reported the registry yet
        assert time.monotonic() < deadline, f"workers did not register in {timeout:.0f} s"
        time.sleep(0.2)

def connected_from(host: str, port: int) -> bool:
    "Whether an established TCP connection goes from `host` to 127.0.0.1:`port` (the kernel's table)."
    hexaddr = lambda h: "".join(f"{int(b):02X}" for b in reversed(h.split(".")))
    want_local, want_remote = hexaddr(host) + ":", f"{hexaddr('127.0.0.1')}:{port:04X}"
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        local, remote, state = line.split()[1:4]
        if local.startswith(want_local) and remote == want_remote and state == "01": return True
    return False

def test_workers_on_two_more_hosts_give_the_aggregated_text(want):
    port = free_port()
    with serve_process(*ROUTER, "--worker-port", str(port)) as (base, _), \
            processes(worker("prefill", "127.0.0.2", port), worker("decode", "127.0.0.3", port)) as (procs, logs):
        wait_workers(base)
        assert connected_from("127.0.0.2", port) and connected_from("127.0.0.3", port)
        got = complete_all(base, PS)
        moved, blocks = metric(base, "inferlab:kv_transfer_bytes_total"), metric(base, "inferlab:kv_transfer_blocks_total")
        tcp, shm = (metric(base, "inferlab:kv_transfers_total", transport=t) for t in ("tcp", "shm"))
        timed = metric(base, "inferlab:kv_transfer_seconds_count")
        seconds = metric(base, "inferlab:kv_transfer_seconds_sum")
        fallbacks = metric(base, "inferlab:kv_transfer_fallbacks_total")
    print(f"{sum(a == b for a, b in zip(got, want))}/{len(PS)} texts equal; KV moved over TCP for {tcp:.0f} requests: "
          f"{moved:.0f} bytes in {blocks:.0f} blocks, {seconds / timed * 1e3:.1f} ms each to pull and adopt")
    assert got == want
    assert blocks == sum(-(-len(p) // 16) for p in LONG) and moved == blocks * 16 * 6 * 2 * 4 * 32 * 4   # fp32
    assert (tcp, shm, timed, fallbacks) == (len(LONG), 0, len(LONG), 0)

@pytest.mark.parametrize("mode", ["die", "corrupt"])
def test_a_prefill_worker_failing_mid_transfer_costs_time_not_tokens(want, mode):
    "`die`: half a frame, then the process is gone; `corrupt`: a whole frame, one byte flipped. Same text, no error."
    port = free_port()
    bad = [sys.executable, str(MISBEHAVING), mode, f"127.0.0.1:{port}", "127.0.0.2"]
    with serve_process(*ROUTER, "--worker-port", str(port)) as (base, _), \
            processes(bad, worker("decode", "127.0.0.3", port)) as (procs, logs):
        wait_workers(base)
        got = complete_all(base, PS)
        fallbacks = metric(base, "inferlab:kv_transfer_fallbacks_total")
        died = metric(base, "inferlab:disagg_worker_departures_total", reason="died") if mode == "die" else 0
        logs[0].seek(0); said = logs[0].read()
    assert got == want
    if mode == "corrupt": assert fallbacks == len(LONG) and said.count("flipped one byte") == len(LONG)
    else: assert fallbacks >= 1 and died == 1 and procs[0].returncode == 1 and "bytes, exiting" in said, said

def test_workers_register_again_with_a_restarted_router(want):
    port = free_port()
    with processes(worker("prefill", "127.0.0.2", port), worker("decode", "127.0.0.3", port)) as (procs, logs):
        with serve_process(*ROUTER, "--worker-port", str(port)) as (base, router):
            wait_workers(base)
            before = complete_all(base, PS[:6])
            router.kill(); router.wait()                              # no goodbye: the workers see their connection end
        with serve_process(*ROUTER, "--worker-port", str(port)) as (base, _):
            wait_workers(base, timeout=30)
            after = complete_all(base, PS[:6])
            registered = metric(base, "inferlab:disagg_worker_registrations_total")
        assert all(p.poll() is None for p in procs)                   # the same two processes throughout
    assert before == after == want[:6] and registered == 2

def test_a_worker_of_another_block_size_is_refused_and_says_why():
    port = free_port()
    with serve_process(*ROUTER, "--worker-port", str(port)) as (base, _), \
            processes(worker("decode", "127.0.0.3", port, "--block-size", "32")) as (procs, logs):
        assert procs[0].wait(120) != 0
        logs[0].seek(0); said = logs[0].read()
        assert metric(base, "inferlab:disagg_workers", role="decode") == 0
    assert "the router refused this worker: block_size: this worker has 32, the router 16" in said, said[-2000:]
