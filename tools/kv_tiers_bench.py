"""`make bench-kv-tiers`: chapter 16c's measurements from a shell.
1. The multi-turn chat with a pool too small for it, tiers off and on, one run: TTFT p50 of the turns whose history
   was evicted, throughput, and whether the tokens are the same.
2. A warm restart of `inferlab serve` over one disk-tier directory: TTFT of the first long shared-prefix request on
   the restarted server against a cold one (an empty directory), and the disk hits its /metrics show."""
import re, signal, subprocess, sys, tempfile, time, urllib.request
import torch
from inferlab.parallel.collectives import free_port

def start(directory: str, port: int):
    cmd = [sys.executable, "-m", "inferlab.cli", "serve", "--port", str(port), "--dtype", "float32",
           "--num-kv-blocks", "512", "--kv-offloading-dir", directory, "--log-level", "warning"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    for _ in range(600):
        try: urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=1); return proc
        except OSError: time.sleep(0.1)
        if proc.poll() is not None: raise RuntimeError(proc.stderr.read())
    raise RuntimeError("inferlab serve did not start in 60 s")

def stop(proc):
    proc.send_signal(signal.SIGINT)
    try: proc.wait(60)
    except subprocess.TimeoutExpired: proc.kill(); proc.wait()

def ttft(port: int, prompt: str) -> float:
    from openai import OpenAI
    client = OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none")
    t0 = time.perf_counter()
    for chunk in client.completions.create(model=client.models.list().data[0].id, prompt=prompt, max_tokens=8,
                                           temperature=0, stream=True):
        if chunk.choices and chunk.choices[0].text: return time.perf_counter() - t0
    return time.perf_counter() - t0

def disk_hits(port: int) -> float:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics").read().decode()
    m = re.search(r'^inferlab:kv_offload_hits_total\{[^}]*tier="disk"[^}]*\} (\S+)', text, re.M)
    return float(m.group(1)) if m else float("nan")

def warm_restart():
    from inferlab.model.config import data_dir
    doc = (data_dir() / "corpus" / "valid.txt").read_text()[10000:16000]          # ~1,500 tokens shared
    warm_dir, cold_dir = tempfile.mkdtemp(), tempfile.mkdtemp()
    port = free_port(); p = start(warm_dir, port); ttft(port, doc + "\n# first question: "); stop(p)
    rows = []
    for name, d in (("cold (empty directory)", cold_dir), ("restarted (same directory)", warm_dir)):
        port = free_port(); p = start(d, port)
        try:
            ttft(port, "import os\n")                          # the first request's one-time costs, not measured
            rows.append((name, ttft(port, doc + "\n# another question: "), disk_hits(port)))
        finally: stop(p)
    print(f"{'server':<28} {'TTFT ms':>9} {'disk hits':>10}")
    for name, t, hits in rows: print(f"{name:<28} {t * 1e3:>9.1f} {hits:>10.0f}")
    print(f"restarted / cold TTFT: {rows[1][1] / rows[0][1]:.2f}")

def chat():
    from inferlab.model.config import shipped_model_path
    from inferlab.model.model import load_model
    from inferlab.model.tokenizer import load_tokenizer
    from inferlab.engine.kv_tiers import chat_bench
    from inferlab.engine.llm_engine import LLMEngine, EngineConfig
    path = shipped_model_path()
    model, tok = load_model(path, dtype=torch.float32), load_tokenizer(path)
    r = chat_bench(lambda **tiers: LLMEngine(model, tok, EngineConfig(num_kv_blocks=256, max_num_seqs=4, **tiers)), tok)
    print(f"multi-turn chat: 12 conversations x 5 turns, pool 256 blocks; {r['evicted_turns']} turns lost their history")
    print(f"{'tiers':<8} {'TTFT p50 evicted ms':>20} {'tokens/s':>9} {'prompt tokens computed':>23}")
    for k in ("off", "on"):
        print(f"{k:<8} {r[k]['ttft_p50_evicted'] * 1e3:>20.1f} {r[k]['throughput']:>9.1f} "
              f"{r[k]['stats']['prefill_tokens']:>23,}")
    print(f"on / off TTFT: {r['on']['ttft_p50_evicted'] / r['off']['ttft_p50_evicted']:.2f}; "
          f"throughput on / off: {r['on']['throughput'] / r['off']['throughput']:.2f}; same tokens: {r['same_tokens']}")

if __name__ == "__main__":
    chat()
    warm_restart()
