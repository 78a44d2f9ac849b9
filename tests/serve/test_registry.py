"""Chapter 57a's registry: only a holder of the key gets in; a worker of another model is told why; a connection that
never says hello holds no one up; a silent worker is reported gone; a worker registering again under its name
replaces its old entry."""
import os, socket, time
import pytest
from multiprocessing import AuthenticationError
from inferlab.serve.disagg import connect, recv, send
from inferlab.serve.registry import SILENCE_S, WorkerRegistry

EXPECT = dict(vocab_size=4096, layers=6, block_size=16, kv_cache_dtype=None)

@pytest.fixture
def reg():
    r = WorkerRegistry("127.0.0.1", 0, os.urandom(16), EXPECT)
    yield r
    r.close()

def join(reg, name, key=None, host="127.0.0.2", **model):
    c = connect(reg.address, key or reg.authkey, host)
    send(c, dict(op="ready", name=name, role="decode", model={**EXPECT, **model}, pool={}, machine="m1"))
    return c

def admitted(reg, n, lost=lambda w, why: None, timeout=10.0):
    deadline = time.monotonic() + timeout
    while len(reg.workers) + reg.refused < n:
        assert time.monotonic() < deadline, "nobody came in"
        reg.admit(lost); time.sleep(0.02)

def test_the_key_the_model_and_the_greeting(reg):
    host, port = reg.address.rsplit(":", 1)
    mute = socket.create_connection((host, int(port)))                  # connects, never speaks
    with pytest.raises(AuthenticationError): join(reg, "intruder", key=b"not the key")
    other = join(reg, "inferlab-decode-x", kv_cache_dtype="fp8")
    good = join(reg, "inferlab-decode-0")                               # not held up by the mute connection
    admitted(reg, 3)
    assert [w.name for w in reg.workers] == ["inferlab-decode-0"] and reg.refused == 2
    assert recv(other)["error"].startswith("kv_cache_dtype: this worker has 'fp8', the router None")
    w = reg.workers[0]
    assert (w.address, w.machine, w.role, w.proc) == ("127.0.0.2", "m1", "decode", None)
    mute.close(); good.close()

def test_silence_and_reregistration(reg):
    first = join(reg, "inferlab-decode-0")
    admitted(reg, 1)
    old = reg.workers[0]
    assert reg.gone() == []
    old.last_seen -= SILENCE_S + 1
    assert reg.gone() == [(old, "silent")]
    old.last_seen += SILENCE_S + 1
    lost = []
    again = join(reg, "inferlab-decode-0", host="127.0.0.3")            # the same worker, reconnected
    admitted(reg, 2, lambda w, why: (lost.append((w, why)), reg.depart(w, why)))
    assert lost == [(old, "replaced")] and not old.alive and reg.workers[1].address == "127.0.0.3"
    assert reg.stats() == dict(workers_prefill=0, workers_decode=1, worker_registrations=2, worker_refusals=0,
                               worker_departures={"replaced": 1})
    first.close(); again.close()
