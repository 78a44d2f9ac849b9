"Helpers of the server tests (a module of its own name: two `conftest` modules would shadow each other). A real `inferlab serve` process on a free loopback port, shared by a module's tests; stopped (never left behind) at the end."
import concurrent.futures as cf
import httpx, openai, torch
from inferlab.frontier.disagg_bench import served

def serve_process(*args, timeout: float = 90.0):
    "`inferlab serve` with `args` on a free loopback port: yields (base_url, process), stopped afterwards (chapter 75's `served`)."
    return served(list(args), timeout)

def metric(base: str, name: str, **labels) -> float:
    "One sample of the server's /metrics (summed over series matching `labels`)."
    total, found = 0.0, False
    for line in httpx.get(base + "/metrics").text.splitlines():
        if line.startswith("#") or not line.startswith(name): continue
        head, value = line.rsplit(" ", 1)
        if head.split("{")[0] != name or not all(f'{k}="{v}"' in head for k, v in labels.items()): continue
        total, found = total + float(value), True
    assert found, f"{name} {labels} not in /metrics"
    return total

def prompts(n: int, seed: int = 0) -> list[list[int]]:
    "Mixed lengths: a third above 160 tokens (remote prefill at --max-local-prefill-length 96), the rest short."
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(1, 4096, (int(torch.randint(161, 400, (1,), generator=g)) if i % 3 == 0 else
                                     int(torch.randint(2, 90, (1,), generator=g)),), generator=g).tolist() for i in range(n)]

def complete_all(base: str, ps, max_tokens=12, workers=16) -> list:
    client = openai.OpenAI(base_url=base + "/v1", api_key="none", max_retries=0, timeout=120)
    def one(p):
        try: return client.completions.create(model="tiny-dense", prompt=p, max_tokens=max_tokens, temperature=0).choices[0].text
        except openai.APIStatusError as e: return e
    with cf.ThreadPoolExecutor(workers) as ex: return list(ex.map(one, ps))
