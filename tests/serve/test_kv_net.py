"""Chapter 56a's frame and KV server: a payload round-trips bit for bit; a frame cut anywhere or damaged anywhere raises
`KVTransferError` and never yields a payload; the server hands a payload out once, drops it after its lease or over its
byte bound, and a fetch from a server that is gone is an error naming its address."""
import socket, threading, time
import pytest, torch
from inferlab.serve.kv_net import (DIGEST_BYTES, KVServer, KVTransferError, choose_transport, encode_payload,
                                   fetch_payload, read_frame)
from inferlab.serve.kv_transfer import KVPayload

def payload(blocks=3, dtype=torch.float32, scales=True) -> KVPayload:
    g = torch.Generator().manual_seed(blocks)
    kv = torch.randn(2, 2, blocks, 4, 2, 8, generator=g).to(dtype)
    return KVPayload(kv, torch.rand(2, 2, 2, generator=g) if scales else None, list(range(blocks * 4 - 1)), 7)

def wire(p: KVPayload) -> bytes: return b"".join(bytes(x) for x in encode_payload(p))

def read(data: bytes) -> KVPayload:
    a, b = socket.socketpair()
    sender = threading.Thread(target=lambda: (a.sendall(data), a.shutdown(socket.SHUT_WR)))
    sender.start()
    try: return read_frame(b, "peer")
    finally: sender.join(); a.close(); b.close()

@pytest.mark.parametrize("dtype,scales", [(torch.float32, False), (torch.bfloat16, False), (torch.int8, True)])
def test_a_payload_round_trips_bit_for_bit(dtype, scales):
    p = payload(dtype=dtype, scales=scales)
    q = read(wire(p))
    assert q.kv.dtype == dtype and torch.equal(q.kv.view(torch.uint8), p.kv.view(torch.uint8))
    assert (q.scales is None) == (not scales) and (not scales or torch.equal(q.scales, p.scales))
    assert (q.prompt_token_ids, q.first_token) == (p.prompt_token_ids, p.first_token)

def test_a_frame_cut_or_damaged_anywhere_is_an_error_never_a_payload():
    data = wire(payload())
    body_start = len(data) - payload().nbytes - DIGEST_BYTES
    for cut in [0, 3, 8, body_start - 1, body_start + 100, len(data) - DIGEST_BYTES, len(data) - 1]:
        with pytest.raises(KVTransferError, match="the stream ended after"): read(data[:cut])
    for at in [4, body_start - 2, body_start + 7, len(data) - DIGEST_BYTES - 1, len(data) - 1]:
        damaged = bytearray(data); damaged[at] ^= 0x40
        with pytest.raises(KVTransferError): read(bytes(damaged))   # checksum, or a header that no longer adds up

def test_a_header_that_does_not_add_up_is_refused_before_allocating():
    import json, struct
    head = json.dumps(dict(shape=[1, 2, 1, 1, 1, 4], dtype=0, kv_bytes=1 << 40, scale_bytes=0, prompt_token_ids=[1],
                           first_token=2)).encode()
    with pytest.raises(KVTransferError, match="'kv_bytes' 1099511627776 does not match"):
        read(b"IKV1" + struct.pack("<I", len(head)) + head)

def test_the_server_hands_out_once_and_stays_bounded():
    p = payload()
    srv = KVServer("127.0.0.2", max_bytes=2 * p.nbytes, lease_s=0.3)
    try:
        assert srv.address.startswith("127.0.0.2:")
        t = srv.put(p)
        assert torch.equal(fetch_payload(srv.address, t, "127.0.0.3").kv, p.kv)
        with pytest.raises(KVTransferError, match="no KV held for that token"): fetch_payload(srv.address, t)
        tokens = [srv.put(p) for _ in range(3)]
        assert srv.dropped == 1 and srv.held_bytes == 2 * p.nbytes          # the oldest went
        with pytest.raises(KVTransferError, match="no KV held"): fetch_payload(srv.address, tokens[0])
        time.sleep(0.4)
        with pytest.raises(KVTransferError, match="no KV held"): fetch_payload(srv.address, tokens[2])   # leased out
        assert srv.held_bytes == 0
    finally: srv.close()
    with pytest.raises(KVTransferError, match=f"KV from {srv.address}: .*refused"): fetch_payload(srv.address, "x", timeout=2)

def test_transport_choice():
    assert choose_transport("auto", "a", "a") == "shm" and choose_transport("auto", "a", "b") == "tcp"
    with pytest.raises(ValueError, match="^--kv-transport: expected one of auto, shm, tcp, got 'rdma'"):
        choose_transport("rdma", "a", "a")
