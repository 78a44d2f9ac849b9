"""The vLLM side of `make bench-vllm`: run by the vLLM venv's Python (never imported by inferlab).

Reads one JSON command per line on stdin, answers one JSON line on stdout:
  {"cmd": "load", "model": DIR, "max_num_seqs": N, "max_model_len": N}   -> {"ok": true, "load_s": s, "ttft_s": s}
  {"cmd": "offline", "prompts": [[ids]...], "max_tokens": [n...]}          -> {"seconds": s, "output_tokens": n}
      (greedy, EOS ignored, prefix cache cleared first)
  {"cmd": "decode", "prompt": [ids], "n": N}                               -> {"tok_s": r}
  {"cmd": "quit"}
Token ids in, token ids out (no tokenizer): the engines do the same work on the same requests."""
import json, os, sys, time

T0 = time.perf_counter()   # process start (close enough: before vLLM's import)

def main():
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")           # GiB of KV cache
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
    # The protocol gets its own copy of stdout; fd 1 then points at stderr, so nothing vLLM or its engine-core
    # process prints (Python or C, inherited by children) can land between two answers.
    out = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt
    llm = None
    def reply(d): out.write(json.dumps(d) + "\n"); out.flush()
    for line in sys.stdin:
        c = json.loads(line)
        if c["cmd"] == "quit": break
        if c["cmd"] == "load":
            t = time.perf_counter()
            llm = LLM(model=c["model"], skip_tokenizer_init=True, dtype="float32", max_num_seqs=c.get("max_num_seqs", 256),
                      seed=0)   # vLLM's CPU defaults otherwise (its thread binding, chunked prefill, prefix caching)
            load = time.perf_counter() - t
            llm.generate([TokensPrompt(prompt_token_ids=[1, 2, 3])], SamplingParams(max_tokens=1, detokenize=False),
                         use_tqdm=False)
            reply(dict(ok=True, load_s=load, ttft_s=time.perf_counter() - T0))
        elif c["cmd"] == "offline":
            llm.reset_prefix_cache()                               # rounds must not help each other
            ps = [TokensPrompt(prompt_token_ids=p) for p in c["prompts"]]
            sp = [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True, detokenize=False) for n in c["max_tokens"]]
            t = time.perf_counter()
            res = llm.generate(ps, sp, use_tqdm=False)
            reply(dict(seconds=time.perf_counter() - t, output_tokens=sum(len(r.outputs[0].token_ids) for r in res)))
        elif c["cmd"] == "decode":
            def run(k):
                sp = SamplingParams(temperature=0, max_tokens=k, ignore_eos=True, detokenize=False)
                t = time.perf_counter(); llm.generate([TokensPrompt(prompt_token_ids=c["prompt"])], sp, use_tqdm=False)
                return time.perf_counter() - t
            run(4); n = c["n"]
            # the rule of inferlab.frontier.bench.decode_rate (this script runs in vLLM's venv, without inferlab)
            reply(dict(tok_s=n / (min(run(n + 1) for _ in range(2)) - min(run(1) for _ in range(3)))))

if __name__ == "__main__":
    main()
