"""Chapter 16c's host and disk tiers: the same tokens with tiers off, host only and host + disk under eviction, no
block leaks, and the faults: damaged files are recomputed, a full disk stops offloading while serving goes on, two
engines share a directory safely, and the disk tier never exceeds its bound."""
import errno, json, os, random, subprocess, sys, textwrap, threading, time
import pytest
from types import SimpleNamespace
import torch
from inferlab.model.config import shipped_model_path, data_dir
from inferlab.model.model import load_model
from inferlab.model.tokenizer import load_tokenizer
from inferlab.model.sampling import SamplingParams
from inferlab.engine.llm_engine import LLMEngine, EngineConfig
from inferlab.engine.kv_tiers import DiskTier, HostTier, decode_block, encode_block

G = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)

@pytest.fixture(scope="module")
def parts():
    path = shipped_model_path()
    return load_model(path, dtype=torch.float32), load_tokenizer(path)

@pytest.fixture(scope="module")
def prompts(parts):
    "200 prompts: 20 shared prefixes of 40 to 110 tokens, each with 10 questions, shuffled."
    tok, text, rng = parts[1], (data_dir() / "corpus" / "valid.txt").read_text(), random.Random(0)
    ids = tok.encode(text[:60000])
    prefixes = [ids[i * 600:i * 600 + rng.randint(40, 110)] for i in range(20)]
    out = [p + ids[30000 + 13 * (10 * i + j):30000 + 13 * (10 * i + j) + rng.randint(3, 12)]
           for i, p in enumerate(prefixes) for j in range(10)]
    rng.shuffle(out)
    return out

def run(parts, prompts, params=G, batch=24, **config):
    "Tokens of every prompt (a few at a time, as a server's traffic comes), the engine (idle, no block leaked)."
    eng = LLMEngine(*parts, EngineConfig(num_kv_blocks=48, max_num_seqs=8, **config))
    outs = {}
    for i in range(0, len(prompts), batch):
        rids = [eng.add_request(p, params) for p in prompts[i:i + batch]]
        while eng.has_unfinished(): outs.update({o.request_id: o for o in eng.step() if o.finished})
        eng.check_idle()
    return [outs[r].token_ids for r in outs], eng

def test_identical_tokens_off_host_disk(parts, prompts, tmp_path):
    "Acceptance: 200 prompts, a 48-block pool (evictions all along), three ways, the same greedy tokens."
    off, e0 = run(parts, prompts)
    host, e1 = run(parts, prompts, kv_offloading_size=0.05)
    both, e2 = run(parts, prompts, kv_offloading_size=0.002, kv_offloading_dir=str(tmp_path))
    e2.shutdown()
    s0, s1, s2 = e0.stats(), e1.stats(), e2.stats()
    assert off == host == both
    assert s1["kv_offload_host_hits"] > 200 and s1["prefill_tokens"] < s0["prefill_tokens"] * 0.7
    assert s2["kv_offload_disk_hits"] > 0 and s2["kv_offload_disk_corrupt"] == 0
    assert s1["kv_offload_host_used_bytes"] <= 0.05 * 2**30 and s2["kv_offload_host_used_bytes"] <= 0.002 * 2**30

def test_block_file_round_trip_and_damage():
    kv = torch.randn(6, 2, 16, 4, 32)
    blob = encode_block(b"h" * 16, range(16), kv)
    assert torch.equal(decode_block(blob, b"h" * 16, range(16)), kv)
    assert decode_block(blob, b"h" * 16, range(1, 17)) is None                   # another block's tokens
    assert decode_block(blob[:len(blob) // 2], b"h" * 16, range(16)) is None      # truncated
    bad = bytearray(blob); bad[-100] ^= 0xFF
    assert decode_block(bytes(bad), b"h" * 16, range(16)) is None                 # a flipped bit in the K/V
    fp8 = kv.to(torch.float8_e4m3fn)
    assert torch.equal(decode_block(encode_block(b"x" * 16, range(16), fp8), b"x" * 16, range(16)).view(torch.uint8),
                       fp8.view(torch.uint8))

def test_host_tier_bound_and_lru():
    t, kv = HostTier(3 * 4096), torch.zeros(1024)                                 # three blocks of 4 KiB
    for i in range(4): t.put(bytes([i]), (i,), kv)
    assert len(t) == 3 and t.used == 3 * 4096 and t.get(bytes([0]), (0,)) is None and t.get(bytes([1]), (1,)) is not None
    t.put(bytes([9]), (9,), kv)                                                   # 1 was read: 2 is the oldest now
    assert t.get(bytes([2]), (2,)) is None and t.get(bytes([1]), (1,)) is not None
    assert not t.put(b"big", (0,), torch.zeros(10_000))

def test_damaged_files_are_recomputed(parts, tmp_path):
    "A truncated file and a file with one byte changed: caught by the checksum, deleted, recomputed; tokens right."
    from inferlab.engine.block_manager import chain_hashes
    long = [parts[1].encode((data_dir() / "corpus" / "valid.txt").read_text()[:3000])[:400]]
    want, _ = run(parts, long)
    _, e1 = run(parts, long, kv_offloading_dir=str(tmp_path)); e1.shutdown()      # the flush writes the pool's blocks
    [sub] = [d for d in tmp_path.iterdir() if d.is_dir()]
    files = [sub / f"{h.hex()}.safetensors" for h in chain_hashes(long[0], 16)]
    assert all(f.exists() for f in files) and len(files) == 25
    files[3].write_bytes(files[3].read_bytes()[:500])                              # truncated
    got, e2 = run(parts, long, kv_offloading_dir=str(tmp_path))
    s = e2.stats()
    assert got == want and s["kv_offload_disk_corrupt"] == 1 and s["kv_offload_disk_hits"] == 3
    assert not files[3].exists()
    raw = bytearray(files[0].read_bytes()); raw[-7] ^= 0x55; files[0].write_bytes(bytes(raw))   # one byte changed
    got, e3 = run(parts, long, kv_offloading_dir=str(tmp_path))
    s = e3.stats()
    assert got == want and s["kv_offload_disk_corrupt"] == 1 and s["kv_offload_disk_hits"] == 0

def test_full_disk_stops_offloading_serving_goes_on(parts, prompts, tmp_path, monkeypatch):
    def full(self, path, blob): raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(DiskTier, "_write_file", full)
    want, _ = run(parts, prompts[:60])
    with pytest.warns(RuntimeWarning, match="disk tier stops offloading"):
        got, eng = run(parts, prompts[:60], kv_offloading_dir=str(tmp_path))
        eng.shutdown()
    s = eng.stats()
    assert got == want and s["kv_offload_disk_enabled"] == 0 and not list(tmp_path.glob("*/*.safetensors"))

SHARER = textwrap.dedent("""
    import sys, torch, random
    from inferlab.llm import LLM
    from inferlab.model.sampling import SamplingParams
    seed, d = int(sys.argv[1]), sys.argv[2]
    rng = random.Random(seed)
    llm = LLM(dtype=torch.float32, num_kv_blocks=24, kv_offloading_size=0.001, kv_offloading_dir=d,
              kv_offloading_disk_size=0.003)
    base = list(range(10, 400))
    prompts = [base[:rng.randint(40, 380)] + [rng.randint(500, 4000) for _ in range(5)] for _ in range(60)]
    outs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=4, ignore_eos=True))
    llm.shutdown()
    print(sum(len(o.token_ids) for o in outs))
""")

def test_two_engines_share_a_directory_within_its_bound(tmp_path):
    "Two processes offload into one directory at once: every file stays whole and the bound holds throughout."
    bound = int(0.003 * 2**30)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    procs = [subprocess.Popen([sys.executable, "-c", SHARER, str(seed), str(tmp_path)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env=env) for seed in (1, 2)]
    peak = 0
    try:
        while any(p.poll() is None for p in procs):
            peak = max(peak, DiskTier.usage(SimpleNamespace(root=tmp_path)))   # files vanish while it counts
            time.sleep(0.05)
        outs = [p.communicate(timeout=120) for p in procs]
    finally:
        for p in procs: p.kill()
    assert all(p.returncode == 0 for p in procs), outs
    assert all(o[0].strip() == "240" for o in outs)
    files = list(tmp_path.glob("*/*.safetensors"))
    assert files and peak <= bound and sum(f.stat().st_size for f in files) <= bound
    for f in files:                                       # every file whole: its checksum, its own name
        h = bytes.fromhex(f.stem)
        n = int.from_bytes(f.read_bytes()[:8], "little")
        toks = json.loads(json.loads(f.read_bytes()[8:8 + n])["__metadata__"]["token_ids"])
        assert decode_block(f.read_bytes(), h, toks) is not None
    assert not list(tmp_path.glob("*/.tmp-*"))

def test_warm_restart_reads_the_disk(parts, tmp_path):
    "An engine over the same directory, model and KV dtype serves the first long prompt from disk."
    long = [parts[1].encode((data_dir() / "corpus" / "valid.txt").read_text()[5000:9000])[:600]]
    want, e1 = run(parts, long, kv_offloading_dir=str(tmp_path)); e1.shutdown()
    got, e2 = run(parts, long, kv_offloading_dir=str(tmp_path))
    s = e2.stats()
    assert got == want and s["kv_offload_disk_hits"] == (600 - 1) // 16 and s["prefill_tokens"] == 600 - 37 * 16
    _, e3 = run(parts, long, kv_offloading_dir=str(tmp_path), kv_cache_dtype="fp8")   # other KV dtype: other files
    assert e3.stats()["kv_offload_disk_hits"] == 0

@pytest.mark.parametrize("config", [dict(kv_cache_dtype="int8"), dict(enable_chunked_prefill=False),
                                    dict(max_num_batched_tokens=32)])
def test_tiers_compose(parts, prompts, config):
    want, _ = run(parts, prompts[:80], **config)
    got, eng = run(parts, prompts[:80], kv_offloading_size=0.01, **config)
    assert got == want and eng.stats()["kv_offload_host_hits"] > 0

def test_prompt_logprobs_never_load_from_tiers(parts, prompts):
    score = SamplingParams(temperature=0, max_tokens=1, prompt_logprobs=1)
    want, _ = run(parts, prompts[:40], params=score)
    eng = LLMEngine(*parts, EngineConfig(num_kv_blocks=48, kv_offloading_size=0.01))
    outs = []
    for p in prompts[:40] * 2:
        eng.add_request(p, score)
        while eng.has_unfinished(): outs += [o for o in eng.step() if o.finished]
    assert eng.stats()["kv_offload_host_hits"] == 0 and [o.token_ids for o in outs[:40]] == want

@pytest.mark.parametrize("bad, msg", [(dict(kv_offloading_size=-1), "kv_offloading_size: must be a number"),
                                      (dict(kv_offloading_disk_size="8"), "kv_offloading_disk_size"),
                                      (dict(kv_offloading_size=1, enable_prefix_caching=False),
                                       "enable_prefix_caching=True")])
def test_bad_settings_refused_by_name(bad, msg):
    with pytest.raises(ValueError, match=msg): EngineConfig(**bad)

def test_a_file_where_the_directory_should_be(parts, tmp_path):
    (tmp_path / "f").write_text("x")
    with pytest.raises(ValueError, match="kv_offloading_dir: .*cannot hold"):
        LLMEngine(*parts, EngineConfig(num_kv_blocks=8, kv_offloading_dir=str(tmp_path / "f")))

@pytest.mark.parametrize("kw", [dict(quantization="w8a16"),
                                dict(speculative_config={"method": "ngram", "num_speculative_tokens": 3})])
def test_tiers_compose_with_quantization_and_speculation(prompts, kw):
    from inferlab.llm import build_engine
    def tokens(**tiers):
        eng, outs = build_engine(dtype="float32", num_kv_blocks=48, max_num_seqs=8, **kw, **tiers), {}
        for i in range(0, 80, 24):
            for p in prompts[i:i + 24]: eng.add_request(p, G)
            while eng.has_unfinished(): outs.update({o.request_id: o.token_ids for o in eng.step() if o.finished})
        eng.check_idle()
        return list(outs.values()), eng.stats()
    (want, _), (got, s) = tokens(), tokens(kv_offloading_size=0.01)
    assert got == want and s["kv_offload_host_hits"] > 0
