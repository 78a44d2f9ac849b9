"Helpers of the server tests (a module of its own name: two `conftest` modules would shadow each other). A real `inferlab serve` process on a free loopback port, shared by a module's tests; stopped (never left behind) at the end."
import httpx
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
