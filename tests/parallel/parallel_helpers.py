"Helpers shared by the parallel tests (imported by name: a second `conftest` module would shadow tests/serve's)."
import multiprocessing, os, shutil
import pytest
import torch
from inferlab.model.config import ModelConfig, resolve_model_path
from inferlab.model.model import save_model
from inferlab.model.random_weights import random_model

def random_checkpoint(path, **cfg) -> str:
    "A random-weight checkpoint with the shipped tokenizer (vocabulary 4096) in `path`."
    model = random_model(ModelConfig(vocab_size=4096, max_position_embeddings=512, **cfg), seed=1)
    save_model(model, path, dtype="float32")
    src = resolve_model_path("tiny-dense")
    for f in ("tokenizer.json", "tokenizer_config.json"): shutil.copy(src / f, path / f)
    return str(path)

def prompts(n: int, seed: int = 0) -> list[list[int]]:
    "n token-id prompts of 1 to 300 tokens; every fifth shares a 40-token prefix with the one before (prefix caching)."
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        length = int(torch.randint(1, 300 if i % 7 == 0 else 40, (1,), generator=g))
        p = torch.randint(1, 4096, (length,), generator=g).tolist()
        if i % 5 == 4 and len(out[-1]) >= 40: p = out[-1][:40] + p
        out.append(p)
    return out

def children() -> list[int]:
    "Pids of this process's live children (whoever started them), from /proc."
    return children_of(os.getpid())

def children_of(pid: int) -> list[int]:
    "Pids of `pid`'s live children, from /proc (multiprocessing's resource tracker aside)."
    me, kids = str(pid), []
    for d in os.listdir("/proc"):
        if not d.isdigit(): continue
        try: stat = open(f"/proc/{d}/stat").read()
        except OSError: continue
        fields = stat.rsplit(")", 1)[1].split()
        try: cmd = open(f"/proc/{d}/cmdline").read()
        except OSError: continue
        if "resource_tracker" in cmd: continue          # multiprocessing's one helper for the interpreter's lifetime
        if fields[1] == me and fields[0] != "Z": kids.append(int(d))
    return kids
