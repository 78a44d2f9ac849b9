"""The import graph of `inferlab/`, checked against the layering rules (README.md, section Architecture).

    python tools/check_layers.py          # summary; exit 1 on any violation (`make test` runs it)

The rules, stated here in full:
- one folder per layer, in the order a reader learns them: model 0x, engine 1x, quant 2x, spec_decode 3x,
  parallel 4x, serve 5x, fleet 6x, frontier 7x;
- a module imports only its own layer and lower ones;
- the facade at the package root (`__init__`, `llm`, `cli`) may import any layer; `testing` (the test fixtures)
  ranks just above the engine, and production modules never import it;
- no import cycles, imports inside functions (lazy imports) included;
- no module over 400 lines (`_modidx.py`, nbdev's generated symbol index, is not a module anyone reads and is not
  counted).
"""
from __future__ import annotations
import ast, sys
from collections import Counter
from pathlib import Path

PKG = Path(__file__).resolve().parents[1] / "inferlab"
LAYERS = {"model": 0, "engine": 1, "quant": 2, "spec_decode": 3, "parallel": 4, "serve": 5, "fleet": 6, "frontier": 7}
ROOT = {"__init__": 9, "llm": 9, "cli": 9, "testing": 1.5}     # facade modules and the shared fixtures
SKIP = {"_modidx"}
MAX_LINES = 400

def modules() -> dict[str, Path]:
    "Dotted name (without the `inferlab.` prefix) -> file, for every .py file of the package."
    out = {}
    for f in sorted(PKG.rglob("*.py")):
        parts = list(f.relative_to(PKG).with_suffix("").parts)
        if parts[-1] == "__init__" and len(parts) > 1: parts = parts[:-1]
        name = ".".join(parts)
        if name not in SKIP: out[name] = f
    return out

def rank(name: str) -> float | None:
    head = name.split(".")[0]
    if "." not in name and name in ROOT: return ROOT[name]
    return LAYERS.get(head) if "." in name or head in LAYERS else None

def imports(name: str, path: Path, known: set[str]) -> set[str]:
    "The inferlab modules `name` imports anywhere in its file (top level or inside functions)."
    is_pkg = path.name == "__init__.py"
    base = name.split(".") if is_pkg else name.split(".")[:-1]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        targets = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:                                    # relative: resolve against this module's package
                pkg = base[:len(base) - node.level + 1] if node.level > 1 else base
                mod = ".".join(["inferlab", *pkg] + ([node.module] if node.module else []))
            else: mod = node.module or ""
            targets = [mod] + [f"{mod}.{a.name}" for a in node.names]   # `from pkg import submodule`
        for t in targets:
            if t == "inferlab" or not t.startswith("inferlab."): continue
            t = t[len("inferlab."):]
            while t and t not in known: t = t.rpartition(".")[0]   # a name inside a module -> that module
            if t and t != name: found.add(t)
    return found

def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    "Strongly connected components with more than one module (Tarjan)."
    index, low, stack, on, out, n = {}, {}, [], set(), [], [0]
    def visit(v):
        index[v] = low[v] = n[0]; n[0] += 1; stack.append(v); on.add(v)
        for w in graph.get(v, ()):
            if w not in index: visit(w); low[v] = min(low[v], low[w])
            elif w in on: low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop(); on.discard(w); comp.append(w)
                if w == v: break
            if len(comp) > 1: out.append(sorted(comp))
    sys.setrecursionlimit(10000)
    for v in graph:
        if v not in index: visit(v)
    return out

def main() -> int:
    mods = modules()
    graph = {m: imports(m, f, set(mods)) for m, f in mods.items()}
    outside = [m for m in mods if rank(m) is None]
    upward = [(a, b) for a, bs in graph.items() for b in sorted(bs)
              if rank(a) is not None and rank(b) is not None and rank(b) > rank(a)]
    # a layer's package __init__ importing its own modules is not upward
    long = [(m, n) for m, f in mods.items() if (n := len(f.read_text().splitlines())) > MAX_LINES]
    cyc = cycles(graph)
    layer_of = lambda m: m.split(".")[0] if "." in m or m in LAYERS else "(root)"
    edges = Counter((layer_of(a), layer_of(b)) for a, bs in graph.items() for b in bs if layer_of(a) != layer_of(b))
    per = Counter(layer_of(m) for m in mods)
    print(f"inferlab: {len(mods)} modules, {sum(map(len, graph.values()))} imports between them")
    for layer in [*LAYERS, "(root)"]:
        if per[layer]:
            deps = sorted({b for (a, b) in edges if a == layer}, key=lambda l: LAYERS.get(l, 9))
            print(f"  {layer:9s} {per[layer]:3d} modules; imports from: {', '.join(deps) or '-'}")
    print(f"cycles: {len(cyc)}")
    for c in cyc: print("  cycle:", " <-> ".join(c))
    print(f"upward imports: {len(upward)}")
    for a, b in upward: print(f"  {a} -> {b}")
    fixtures = [a for a, bs in graph.items() if "testing" in bs]
    print(f"production modules importing the test fixtures (testing): {len(fixtures)}")
    for m in fixtures: print(f"  {m} -> testing")
    print(f"modules outside a layer folder: {len(outside)}")
    for m in outside: print(f"  {m}")
    print(f"modules over {MAX_LINES} lines: {len(long)}")
    for m, n in long: print(f"  {m}: {n} lines")
    return 1 if cyc or upward or fixtures or outside or long else 0

if __name__ == "__main__":
    sys.exit(main())
