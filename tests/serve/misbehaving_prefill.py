"""A prefill worker that misbehaves on purpose, for test_remote.py. It registers with a router as `inferlab worker
--role prefill` does and prefills for real, then hands its KV over wrong. `die`: it sends half of the first frame a
decode worker pulls, then the process exits (a worker dying mid-transfer). `corrupt`: it sends every frame whole
with one byte of the KV flipped (the checksum must catch it). Usage: misbehaving_prefill.py MODE ROUTER HOST."""
import json, os, socket, struct, sys, threading, time
from inferlab.serve.disagg import connect, hello, recv, send
from inferlab.serve.kv_net import encode_payload
from inferlab.serve.kv_transfer import prefill_engine, prefill

mode, router, host = sys.argv[1:4]
engine = prefill_engine("tiny-dense")
frames: dict[str, bytes] = {}
server = socket.create_server((host, 0))

def serve_one(conn: socket.socket):
    (n,) = struct.unpack("<I", conn.recv(4, socket.MSG_WAITALL))
    token = json.loads(conn.recv(n, socket.MSG_WAITALL))["token"]
    frame = frames.pop(token)
    if mode == "die":
        conn.sendall(frame[:len(frame) // 2])
        print(f"sent {len(frame) // 2} of {len(frame)} bytes, exiting", flush=True)
        os._exit(1)
    conn.sendall(frame); conn.close()

def accept():
    while True:
        conn, _ = server.accept()
        threading.Thread(target=serve_one, args=(conn,), daemon=True).start()

threading.Thread(target=accept, daemon=True).start()
conn, lock = connect(router, bytes.fromhex(os.environ["INFERLAB_AUTHKEY"]), host), threading.Lock()
def say(msg: dict):
    with lock: send(conn, msg)
def heartbeat():                                   # like a real worker: alive while quiet
    while True: time.sleep(1.0); say(dict(op="heartbeat"))
say(hello(engine, "prefill", f"inferlab-prefill-misbehaving-{mode}", None))
threading.Thread(target=heartbeat, daemon=True).start()
while True:
    m = recv(conn)
    if m["op"] == "stop": break
    if m["op"] != "prefill": continue
    [payload] = prefill(engine, [m["prompt"]])
    frame = bytearray(b"".join(bytes(x) for x in encode_payload(payload)))
    if mode == "corrupt": frame[len(frame) // 2] ^= 0x01; print("flipped one byte", flush=True)
    token = os.urandom(8).hex(); frames[token] = bytes(frame)
    say(dict(op="kv", rid=m["rid"], address="%s:%d" % server.getsockname(), token=token,
                    blocks=payload.kv.shape[2], nbytes=payload.nbytes))
