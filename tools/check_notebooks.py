"""The chapters' shape, checked cell by cell: what the developers' guide asks of every notebook in nbs/.

    python tools/check_notebooks.py                    # every notebook; exit 1 listing each violation
    python tools/check_notebooks.py --skip 16_llm_engine --skip 58_router   # leave out chapters being rewritten
    python tools/check_notebooks.py path/to/a.ipynb    # only these notebooks

A violation is printed as `nbs/NN_x.ipynb cell <id>: ...`, one line each:
- an exported cell (`#| export`, `exporti`, `exports`) over 60 lines (fastcore's exported cells have a median of 7
  lines): split it, growing a class across cells with `@patch`, each piece followed by its demonstration;
- a code line over 120 columns in any code cell (what the docs site shows without scrolling);
- an import in an exported cell that the exported module does not use (it becomes a false dependency of the package);
  names listed in `__all__`/`_all_`, imports in a package's `__init__` (re-exports), `from __future__` and lines
  marked `# noqa: F401` (an import for its side effect) are used;
- words about how the book was written rather than what it teaches, in markdown or in comments (PROCESS_WORDS).
"""
from __future__ import annotations
import argparse, ast, io, json, re, sys, tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MAX_CELL_LINES = 60          # lines of an exported cell, its `#|` directives not counted
MAX_COLUMNS = 120
# Words about how the book was written (issues, review notes, work sessions) that a learner has no context for.
# Matched case-insensitively as whole words, typographic apostrophes read as straight ones. A work session is caught
# by its noun phrases ("this sitting", "sittings"), not by the verb: KV blocks may sit in a free list.
PROCESS_WORDS = ["the issue", "issue's", "seeds' point", "the reference note", "the book's order", "sittings",
                 "this sitting", "a sitting", "last sitting", "next sitting", "closing note",
                 "the measurement the issue asks for"]
_WORDS = re.compile(r"(?<![\w'])(" + "|".join(re.escape(w) for w in PROCESS_WORDS) + r")(?![\w'])", re.IGNORECASE)

def source(cell) -> str:
    s = cell.get("source", "")
    return "".join(s) if isinstance(s, list) else s

def directives(src: str) -> list[list[str]]:
    "The `#| name args` lines of a cell, split into words."
    return [l[2:].split() for l in src.splitlines() if l.startswith("#|") and l[2:].split()]

def is_exported(src: str) -> bool: return any(d[0] in ("export", "exporti", "exports") for d in directives(src))

def default_exp(cells) -> str | None:
    for c in cells:
        for d in directives(source(c)):
            if d[0] == "default_exp" and len(d) > 1: return d[1]
    return None

def comments(src: str) -> list[str]:
    "The comments of a code cell (tokenized, so a `#` inside a string is not one); `#|` directives excluded."
    try:
        toks = tokenize.generate_tokens(io.StringIO(src).readline)
        out = [t.string for t in toks if t.type == tokenize.COMMENT]
    except (tokenize.TokenError, SyntaxError, IndentationError):    # magics (`%time`, `!cmd`): read line by line
        out = [l[l.index("#"):] for l in src.splitlines() if "#" in l]
    return [c for c in out if not c.startswith("#|")]

def process_words(text: str) -> list[str]:
    return [m.group(1) for m in _WORDS.finditer(text.replace("\u2019", "'"))]

def _strip_magics(src: str) -> str:
    "Cell text ast can parse: IPython magics and shell escapes become blank lines (line numbers kept)."
    return "\n".join("" if l.lstrip().startswith(("%", "!")) else l for l in src.splitlines())

def _names_used(tree: ast.AST) -> set[str]:
    "Every name read anywhere in the module, including in string annotations and in `__all__`/`_all_` lists."
    used = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name): used.add(node.id)
        elif isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id in ("__all__", "_all_")
                                                  for t in node.targets):
            if isinstance(node.value, (ast.List, ast.Tuple)):
                used |= {e.value for e in node.value.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)}
        ann = getattr(node, "annotation", None) or getattr(node, "returns", None)
        if isinstance(ann, ast.Constant) and isinstance(ann.value, str):
            try: used |= {n.id for n in ast.walk(ast.parse(ann.value, mode="eval")) if isinstance(n, ast.Name)}
            except SyntaxError: pass
    return used

def _top_level_imports(tree: ast.Module):
    "Import statements run at import time: at module level, or inside a module-level `try`/`if`."
    todo = list(tree.body)
    while todo:
        node = todo.pop(0)
        if isinstance(node, (ast.Import, ast.ImportFrom)): yield node
        elif isinstance(node, (ast.Try, ast.If)):
            todo += node.body + node.orelse + getattr(node, "finalbody", [])
            todo += [s for h in getattr(node, "handlers", []) for s in h.body]

def unused_imports(exported: list[tuple[str, str]], module: str | None) -> list[tuple[str, str]]:
    "(cell id, message) for each name an exported cell imports and no exported cell uses."
    if module and module.split(".")[-1] == "__init__": return []      # a package's __init__ imports to re-export
    parts, owner, line = [], [], 0
    for cid, src in exported:
        text = _strip_magics(src)
        parts.append(text); n = len(text.splitlines()) + 1
        owner += [(cid, line)] * n; line += n
    text = "\n".join(parts)
    try: tree = ast.parse(text)
    except SyntaxError as e:
        return [(owner[min(e.lineno or 1, len(owner)) - 1][0], f"exported code does not parse: {e.msg}")]
    used, lines, out = _names_used(tree), text.splitlines(), []
    for node in _top_level_imports(tree):
        if isinstance(node, ast.ImportFrom) and node.module == "__future__": continue
        if "noqa: F401" in lines[node.lineno - 1]: continue
        for a in node.names:
            bound = a.asname or a.name.split(".")[0]
            if a.name != "*" and bound not in used:
                shown = f"{a.name} as {a.asname}" if a.asname else a.name
                out.append((owner[node.lineno - 1][0], f"import `{shown}` is not used by the exported module"))
    return out

def check(nb_path: Path) -> list[str]:
    "Every violation of one notebook, as printable lines."
    cells = json.loads(nb_path.read_text())["cells"]
    try: shown = nb_path.resolve().relative_to(Path.cwd())
    except ValueError: shown = nb_path
    out, exported = [], []
    for i, c in enumerate(cells):
        cid, src = c.get("id", f"#{i}"), source(c)
        where = f"{shown} cell {cid}"
        if c["cell_type"] == "markdown":
            out += [f'{where}: process word "{w}" in markdown' for w in process_words(src)]
            continue
        if c["cell_type"] != "code": continue
        lines = src.splitlines()
        for n, l in enumerate(lines, 1):
            if len(l) > MAX_COLUMNS: out.append(f"{where}: line {n} is {len(l)} columns (max {MAX_COLUMNS})")
        out += [f'{where}: process word "{w}" in a comment' for com in comments(src) for w in process_words(com)]
        if is_exported(src):
            code = [l for l in lines if not l.startswith("#|")]
            if len(code) > MAX_CELL_LINES:
                out.append(f"{where}: exported cell is {len(code)} lines (max {MAX_CELL_LINES})")
            exported.append((cid, src))
    out += [f"{shown} cell {cid}: {msg}" for cid, msg in unused_imports(exported, default_exp(cells))]
    return out

def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("notebooks", nargs="*", type=Path, help="notebooks to check (default: every nbs/*.ipynb)")
    ap.add_argument("--skip", action="append", default=[], metavar="NB",
                    help="a chapter being rewritten right now, by stem (16_llm_engine); repeatable")
    args = ap.parse_args(argv)
    nbs = args.notebooks or sorted(p for p in (ROOT / "nbs").glob("*.ipynb") if not p.name.startswith("_"))
    skip = {Path(s).stem for s in args.skip}
    errors = [f"--skip {s}: no such notebook" for s in sorted(skip - {p.stem for p in nbs})]
    checked = [p for p in nbs if p.stem not in skip]
    violations = [v for p in checked for v in check(p)]
    for line in errors + violations: print(line)
    print(f"check_notebooks: {len(checked)} notebooks checked, {len(nbs) - len(checked)} skipped, "
          f"{len(violations)} violations")
    return 1 if errors or violations else 0

if __name__ == "__main__":
    sys.exit(main())
