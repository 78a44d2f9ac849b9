"""`make lm-eval-check`: EleutherAI's lm-evaluation-harness, offline, on two local tasks of our own (tools/lmeval/),
through `inferlab serve` (`--model local-completions`) and directly on the same checkpoint (`--model hf`).

    .venv/bin/python tools/lmeval_check.py [--lm-eval .venv-lmeval/bin/lm_eval] [--model-dir data/models/tiny-dense]

lm-eval runs in its own venv (a subprocess); this script only starts servers, runs it and reads its --log_samples.
Runs: a server with the prefix cache off; a server with it on, evaluated twice (cold, then warm: every prompt's
blocks are cached by then); then `--model hf`, float32. Passes when every served run has HF's accuracy and every
per-choice loglikelihood (and every snippet's rolling loglikelihood) within --atol of HF's. Exit 0 pass, 1 fail,
2 when the server cannot answer lm-eval's request (echo + logprobs + max_tokens=1) at all.

What lm-eval 0.4.x's local-completions sends for a loglikelihood (lm_eval/models/openai_completions.py):
POST /v1/completions {"model", "prompt": [[token ids], ...] (context + continuation, one list per request of a
batch), "temperature": 0, "max_tokens": 1, "logprobs": 1, "seed": 1234, "echo": true}; it reads, per choice sorted
by "index", logprobs.token_logprobs[ctxlen:-1] (so token_logprobs must hold one entry per prompt token, the first
may be null, then the one generated token's) and logprobs.top_logprobs[ctxlen:-1] (dicts: is_greedy compares the
token's logprob to max(top.values())). A prompt-token entry that is missing or shifted silently changes the sum."""
from __future__ import annotations
import argparse, contextlib, glob, json, os, signal, socket, subprocess, sys, tempfile, time, urllib.error
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TASKS = {"inferlab_python_mc": "mc", "inferlab_python_ppl": "ppl"}
OFFLINE = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           "HF_HUB_DISABLE_TELEMETRY": "1", "TOKENIZERS_PARALLELISM": "false", "PYTHONUNBUFFERED": "1"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http(url: str, body: dict | None = None, timeout: float = 60) -> tuple[int, str]:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data, {"Content-Type": "application/json"} if data else {})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r: return r.status, r.read().decode()
    except urllib.error.HTTPError as e: return e.code, e.read().decode()


@contextlib.contextmanager
def server(model_dir: Path, extra: list[str], log_path: Path, timeout: float = 180):
    "`inferlab serve` on a free loopback port (its own process group); yields the base URL; always stopped."
    port = free_port()
    cmd = [sys.executable, "-c", "import sys; from inferlab.cli import main; sys.exit(main())", "serve",
           "--model", str(model_dir), "--host", "127.0.0.1", "--port", str(port), "--dtype", "float32",
           "--device", "cpu", "--log-level", "warning", *extra]
    log = open(log_path, "w")
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                            env={**os.environ, **OFFLINE})
    base = f"http://127.0.0.1:{port}"
    try:
        t0 = time.monotonic()
        while True:
            if proc.poll() is not None: raise RuntimeError(f"inferlab serve exited: {log_path.read_text()[-2000:]}")
            with contextlib.suppress(OSError):
                if http(base + "/health", timeout=2)[0] == 200: break
            if time.monotonic() - t0 > timeout: raise RuntimeError(f"inferlab serve: no /health in {timeout:.0f} s")
            time.sleep(0.3)
        yield base
    finally:
        with contextlib.suppress(ProcessLookupError): os.killpg(proc.pid, signal.SIGTERM)
        try: proc.wait(20)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError): os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
        log.close()


def probe(base: str, model: str, tokenizer) -> str | None:
    "None when the server answers lm-eval's loglikelihood request in the form lm-eval reads; else what is wrong."
    ids = tokenizer.encode("import os\n\ndef list_files(path):\n    return os.listdir(path)",
                           add_special_tokens=False).ids
    body = {"model": model, "prompt": [ids], "temperature": 0, "max_tokens": 1, "logprobs": 1, "seed": 1234,
            "echo": True}
    status, text = http(base + "/v1/completions", body)
    if status != 200: return f"HTTP {status}: {text[:500]}"
    try: lp = json.loads(text)["choices"][0]["logprobs"]
    except (KeyError, IndexError, ValueError): return f"no choices[0].logprobs in {text[:500]}"
    if not isinstance(lp, dict) or "token_logprobs" not in lp or "top_logprobs" not in lp:
        return f"logprobs is not the completions API's object: {str(lp)[:300]}"
    if len(lp["token_logprobs"]) != len(ids) + 1:
        return (f"token_logprobs has {len(lp['token_logprobs'])} entries for a {len(ids)}-token prompt and "
                f"max_tokens=1 (lm-eval needs {len(ids) + 1}: one per prompt token, then the generated one)")
    if any(v is None for v in lp["token_logprobs"][1:]) or any(not isinstance(t, dict) or not t
                                                               for t in lp["top_logprobs"][1:]):
        return "token_logprobs[1:] must be numbers and top_logprobs[1:] non-empty dicts"
    return None


def prefix_counters(base: str) -> tuple[float, float]:
    "(prompt tokens looked up, found) in the prefix cache, from /metrics."
    q = h = 0.0
    for line in http(base + "/metrics")[1].splitlines():
        if line.startswith("#") or "_created" in line: continue
        name, val = line.split("{")[0].split(" ")[0], line.rsplit(" ", 1)[-1]
        if name.endswith("prefix_cache_queries_total"): q += float(val)
        elif name.endswith("prefix_cache_hits_total"): h += float(val)
    return q, h


def cached_share(base: str, model: str, tokenizer, bos: int) -> tuple[int, int]:
    """(prompt tokens found in the prefix cache, prompt tokens) for a plain request (no scoring) with the prompt
    lm-eval sent for the first snippet ([BOS] + its tokens): whether the cache holds lm-eval's prompts."""
    text = json.loads(open(ROOT / "tools" / "lmeval" / "data" / "python_snippets.jsonl").readline())["text"]
    ids = [bos] + tokenizer.encode(text, add_special_tokens=False).ids
    q0, h0 = prefix_counters(base)
    http(base + "/v1/completions", {"model": model, "prompt": [ids], "temperature": 0, "max_tokens": 1})
    q1, h1 = prefix_counters(base)
    return int(h1 - h0), int(q1 - q0)


def lm_eval(lm_eval_bin: str, out: Path, model: str, model_args: str, batch_size: int, log_path: Path) -> float:
    cmd = [lm_eval_bin, "--model", model, "--model_args", model_args, "--tasks", ",".join(TASKS),
           "--include_path", "tools/lmeval", "--batch_size", str(batch_size), "--log_samples", "--output_path",
           str(out)] + (["--device", "cpu"] if model == "hf" else [])
    t0 = time.monotonic()
    with open(log_path, "w") as log:
        r = subprocess.run(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **OFFLINE})
    if r.returncode != 0:
        raise RuntimeError(f"lm_eval --model {model} failed ({r.returncode}): {log_path.read_text()[-3000:]}")
    return time.monotonic() - t0


def read_run(out: Path) -> dict:
    "{'acc': .., 'acc_norm': .., 'bits_per_byte': .., 'word_perplexity': .., 'mc': {doc: [ll]}, 'ppl': {doc: ll}}"
    res = json.loads(Path(sorted(glob.glob(str(out / "**" / "results_*.json"), recursive=True))[-1]).read_text())
    run = {"acc": res["results"]["inferlab_python_mc"]["acc,none"],
           "acc_norm": res["results"]["inferlab_python_mc"]["acc_norm,none"],
           "bits_per_byte": res["results"]["inferlab_python_ppl"]["bits_per_byte,none"],
           "word_perplexity": res["results"]["inferlab_python_ppl"]["word_perplexity,none"]}
    for task, key in TASKS.items():
        path = sorted(glob.glob(str(out / "**" / f"samples_{task}_*.jsonl"), recursive=True))[-1]
        rows = [json.loads(line) for line in open(path)]
        if key == "mc": run["mc"] = {r["doc_id"]: [float(x[0]) for x in r["filtered_resps"]] for r in rows}
        else: run["ppl"] = {r["doc_id"]: float(r["filtered_resps"][0]) for r in rows}
    return run


def compare(name: str, run: dict, ref: dict, atol: float) -> tuple[bool, str]:
    mc = max((abs(a - b) for d in ref["mc"].keys() & run["mc"].keys()
              for a, b in zip(run["mc"][d], ref["mc"][d], strict=True)), default=float("inf"))
    ppl = max((abs(run["ppl"][d] - ref["ppl"][d]) for d in ref["ppl"].keys() & run["ppl"].keys()),
              default=float("inf"))
    same = (run["mc"].keys() == ref["mc"].keys() and run["ppl"].keys() == ref["ppl"].keys()
            and run["acc"] == ref["acc"] and run["acc_norm"] == ref["acc_norm"])
    ok = same and mc <= atol and ppl <= atol
    line = (f"{name:<24} {run['acc']:>6.4f} {run['acc_norm']:>8.4f} {run['bits_per_byte']:>8.5f} "
            f"{run['word_perplexity']:>11.3f} {mc:>12.2e} {ppl:>12.2e}  {'ok' if ok else 'FAIL'}")
    return ok, line


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lm-eval", default=str(ROOT / ".venv-lmeval" / "bin" / "lm_eval"))
    ap.add_argument("--model-dir", default=str(ROOT / "data" / "models" / "tiny-dense"))
    ap.add_argument("--atol", type=float, default=1e-3, help="max |loglikelihood difference| allowed (nats)")
    ap.add_argument("--batch-size", type=int, default=8, help="prompts per request to the server")
    ap.add_argument("--keep", action="store_true", help="keep the output folder (printed)")
    a = ap.parse_args(argv)
    os.environ.update(OFFLINE)
    from tokenizers import Tokenizer
    model_dir = Path(a.model_dir).resolve()
    served_name, tok = model_dir.name, Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    bos = tok.token_to_id(json.loads((model_dir / "tokenizer_config.json").read_text())["bos_token"])  # lm-eval's prefix token
    tmp = Path(tempfile.mkdtemp(prefix="lmeval_check_"))
    t_start, runs, times, hits = time.monotonic(), {}, {}, {}
    api_args = lambda base: (f"model={served_name},base_url={base}/v1/completions,tokenizer_backend=huggingface,"
                             f"tokenizer={model_dir},num_concurrent=1,max_retries=1,timeout=300")
    try:
        for label, extra, passes in (("served, no prefix cache", ["--no-enable-prefix-caching"], ["nocache"]),
                                     ("served, prefix cache", ["--enable-prefix-caching"], ["cold", "warm"])):
            with server(model_dir, extra, tmp / f"serve_{passes[0]}.log") as base:
                if (why := probe(base, served_name, tok)) is not None:
                    print(f"inferlab serve cannot answer lm-eval's loglikelihood request yet:\n  {why}")
                    return 2
                for p in passes:
                    q0, h0 = prefix_counters(base)
                    times[p] = lm_eval(a.lm_eval, tmp / p, "local-completions", api_args(base), a.batch_size,
                                       tmp / f"lm_eval_{p}.log")
                    q1, h1 = prefix_counters(base)
                    hits[p] = (h1 - h0) / max(1.0, q1 - q0)
                    runs[p] = read_run(tmp / p)
                    if p == "cold": warm = cached_share(base, served_name, tok, bos)
        times["hf"] = lm_eval(a.lm_eval, tmp / "hf", "hf", f"pretrained={model_dir},dtype=float32", 8,
                              tmp / "lm_eval_hf.log")
        ref = read_run(tmp / "hf")
        print(f"lm-eval on tools/lmeval ({len(ref['mc'])} multiple-choice items, {len(ref['ppl'])} snippets), "
              f"model {model_dir.relative_to(ROOT) if model_dir.is_relative_to(ROOT) else model_dir}; "
              f"max |diff| against --model hf, atol {a.atol:g}")
        print(f"{'run':<24} {'acc':>6} {'acc_norm':>8} {'bits/B':>8} {'word_ppl':>11} {'mc max|d|':>12} "
              f"{'ppl max|d|':>12}")
        print(f"{'hf (float32)':<24} {ref['acc']:>6.4f} {ref['acc_norm']:>8.4f} {ref['bits_per_byte']:>8.5f} "
              f"{ref['word_perplexity']:>11.3f} {'-':>12} {'-':>12}  ({times['hf']:.0f} s)")
        ok = True
        for p, name in (("nocache", "served, no prefix cache"), ("cold", "served, cache cold"),
                        ("warm", "served, cache warm")):
            good, line = compare(name, runs[p], ref, a.atol)
            ok &= good
            print(f"{line}  ({times[p]:.0f} s, prefix-cache hits {hits[p]:.0%} of prompt tokens)")
        print(f"cache warm before the warm pass: a plain request with snippet 0's prompt found {warm[0]} of its "
              f"{warm[1]} tokens cached" + ("; the scoring requests (echo + logprobs) read none of them: the "
                                            "server computes every scored position's logits" if not hits["warm"]
                                            else ""))
        print(f"{'PASS' if ok else 'FAIL'} in {time.monotonic() - t_start:.0f} s")
        return 0 if ok else 1
    finally:
        if a.keep: print(f"outputs kept in {tmp}")
        else:
            import shutil
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
