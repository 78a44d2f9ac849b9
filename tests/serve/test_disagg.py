"`inferlab serve --disaggregation`: the aggregated server's greedy text, KV moved for long prompts, survivable worker faults (the router's own fault paths: test_router.py)."
import concurrent.futures as cf, json, os, signal, time
import httpx, jsonschema, openai, pytest, torch
from serve_helpers import serve_process, metric, prompts, complete_all

def worker_pid(server_pid: int, name: str) -> int:
    for d in os.listdir("/proc"):
        if d.isdigit():
            try: cmd = open(f"/proc/{d}/cmdline").read().split("\0")
            except OSError: continue
            if name in cmd: return int(d)
    raise AssertionError(f"no process {name}")

DISAGG = ["--max-local-prefill-length", "96", "--max-prefill-queue", "1000", "--num-kv-blocks", "2048"]
SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 8},
          "n": {"type": "integer", "minimum": 0, "maximum": 9}}, "required": ["name", "n"]}

def structured_replies(base: str, ps) -> list[str]:
    "JSON-schema replies with penalties and min_tokens on: constraints compose with disaggregation."
    client = openai.OpenAI(base_url=base + "/v1", api_key="none", max_retries=0, timeout=120)
    body = {"structured_outputs": {"json": SCHEMA}, "repetition_penalty": 1.2, "min_tokens": 2}
    return [client.completions.create(model="tiny-dense", prompt=p, max_tokens=120, temperature=1.0, seed=i,
                                      extra_body=body).choices[0].text for i, p in enumerate(ps)]

def test_1p1d_equals_aggregated_and_moves_long_prompts():
    ps = prompts(100)
    with serve_process("--num-kv-blocks", "2048") as (base, _):
        want = complete_all(base, ps)
    with serve_process("--disaggregation", "1P1D", *DISAGG) as (base, proc):
        assert worker_pid(proc.pid, "inferlab-prefill-0") and worker_pid(proc.pid, "inferlab-decode-0")
        got = complete_all(base, ps)
        moved, blocks = metric(base, "inferlab:kv_transfer_bytes_total"), metric(base, "inferlab:kv_transfer_blocks_total")
        by = {t: metric(base, "inferlab:kv_transfers_total", transport=t) for t in ("shm", "tcp")}
    assert all(isinstance(t, str) for t in want + got)
    assert by == {"shm": 34, "tcp": 0}                  # --kv-transport auto: workers of one machine share memory
    assert sum(a == b for a, b in zip(got, want)) == 100
    long_blocks = sum(-(-len(p) // 16) for i, p in enumerate(ps) if i % 3 == 0)
    assert blocks == long_blocks and moved == blocks * 16 * 6 * 2 * 4 * 32 * 4     # fp32: layers × K/V × heads × dim

@pytest.mark.parametrize("spec,victim", [("1P1D", "inferlab-prefill-0"), ("1P2D", "inferlab-decode-1")])
def test_a_dead_worker_never_hangs_a_request(spec, victim):
    ps = prompts(40, seed=1)
    with serve_process("--disaggregation", spec, *DISAGG) as (base, proc):
        pid = worker_pid(proc.pid, victim)
        with cf.ThreadPoolExecutor(1) as ex:
            fut = ex.submit(complete_all, base, ps, 32)
            while metric(base, "inferlab:generation_tokens_total") < 100: time.sleep(0.01)
            assert not fut.done()                                # the kill lands mid-load (40 x 32 tokens)
            os.kill(pid, signal.SIGKILL)
            results = fut.result(timeout=120)                    # every request answered: text or an error
        assert httpx.get(base + "/health").status_code == 200
        errors = [r for r in results if not isinstance(r, str)]
        assert all(e.status_code >= 500 for e in errors), errors
        if "prefill" in victim: assert not errors, errors    # a dead prefill worker: local prefill instead
        after = complete_all(base, ps[:5], 4)                   # the survivors still serve
        assert all(isinstance(t, str) for t in after), after
        time.sleep(0.5)
        assert metric(base, "inferlab:kv_cache_usage_perc") == 0   # no block leaked on the survivors

def test_1p1d_composes_with_fp8_weights_fp8_kv_and_speculation():
    "Every engine flag reaches the workers: the aggregated server's text, and fp8 KV moves about a quarter of fp32's."
    from inferlab.model.config import data_dir
    text = (data_dir() / "corpus" / "valid.txt").read_text()
    ps = [text[i * 1500:i * 1500 + (900 if i % 2 else 120)] for i in range(24)]      # half well above 96 tokens
    flags = ["--quantization", "fp8", "--kv-cache-dtype", "fp8",
             "--speculative-config", '{"method": "ngram", "num_speculative_tokens": 4}']
    with serve_process("--num-kv-blocks", "2048", *flags) as (base, _):
        want = complete_all(base, ps, 16)
    with serve_process("--disaggregation", "1P1D", *DISAGG, *flags) as (base, proc):
        got = complete_all(base, ps, 16)
        moved, blocks = metric(base, "inferlab:kv_transfer_bytes_total"), metric(base, "inferlab:kv_transfer_blocks_total")
        spec_drafts = metric(base, "inferlab:spec_decode_num_draft_tokens_total")
        shaped = structured_replies(base, ps[:6])        # long prompts prefill remotely: the first token too
    assert all(isinstance(t, str) for t in want + got) and got == want
    for text in shaped: jsonschema.validate(json.loads(text), SCHEMA)
    fp32_bytes = blocks * 16 * 6 * 2 * 4 * 32 * 4                    # the same blocks in float32 (the test above)
    print(f"\n{blocks:.0f} blocks moved: {moved / 2**10:.0f} KiB in fp8, {fp32_bytes / 2**10:.0f} KiB in float32 "
          f"({moved / fp32_bytes:.1%})")
    assert blocks >= 12 and moved <= 0.30 * fp32_bytes and spec_drafts > 0

@pytest.mark.slow
@pytest.mark.parametrize("method", ["eagle3", "dflash", "suffix"])
def test_1p1d_with_each_new_drafter_equals_aggregated(method):
    """The drafters that read the target's features (EAGLE-3, DFlash) or a request's own tokens (suffix) under 1P1D,
    half the prompts prefilled remotely: the text is the aggregated server's, KV moves, and drafts are accepted."""
    from inferlab.model.config import data_dir
    text = (data_dir() / "corpus" / "valid.txt").read_text()
    ps = [text[i * 1500:i * 1500 + (900 if i % 2 else 120)] for i in range(12)]      # half prefill remotely
    flags = ["--speculative-config", json.dumps({"method": method, "num_speculative_tokens": 4})]
    with serve_process("--num-kv-blocks", "2048", *flags) as (base, _):
        want = complete_all(base, ps, 24)
    with serve_process("--disaggregation", "1P1D", *DISAGG, *flags) as (base, _):
        got = complete_all(base, ps, 24)
        blocks = metric(base, "inferlab:kv_transfer_blocks_total")
        accepted = metric(base, "inferlab:spec_decode_num_accepted_tokens_total")
    assert all(isinstance(t, str) for t in want + got) and got == want
    assert blocks >= 6 and accepted > 0
