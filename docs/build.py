#!/usr/bin/env python
"""Build the inferlab documentation site offline into `_site/` (nbdev's Quarto needs a download).

    python docs/build.py                     # every notebook in nbs/ (what `make docs` runs)
    python docs/build.py --only 00 04_model  # a subset: names or name prefixes (faster while iterating)
    python docs/build.py --no-exec           # reuse the executed copies of the last build (styling work)
    python docs/build.py --keep-going        # when notebooks fail: still build the others' pages (and exit 1)

Steps:
1. copy each `nbs/*.ipynb` (not `_*`) to `_proc/NAME.ipynb`: the same depth as `nbs/`, so relative paths
   in a notebook mean the same there (nbdev executes its processed notebooks in `_proc/` too);
2. execute each copy in-process with nbdev's executor (`nbdev.test.test_nb`, cwd = the notebook's folder),
   skipping cells flagged with `tst_flags` from pyproject's `[tool.nbdev]`, and save the outputs;
   any notebook that fails fails the build, by name, and no site is built;
3. prepare valid nbformat copies in `_proc/mkdocs/docs/`: `#|` directive lines stripped, `#| hide` cells
   dropped, `#| echo: false` inputs removed, `# Title` + `> summary` turned into the page title and a lead
   line, ANSI codes and carriage-return redraws cleaned from streams, widget views replaced by a note;
4. write `_proc/mkdocs/mkdocs.yml` from `docs/mkdocs.yml` with the nav (index first, then chapters by
   number, grouped by decade) and run `mkdocs build --strict` into `_site/`;
5. check every page exists and shows as many PNG figures as its notebook has, print the pages.
"""
from __future__ import annotations
import argparse, html, importlib.util, json, os, re, shutil, subprocess, sys, time
from pathlib import Path
import torch

# Without CUDA, Triton runs kernels only in its interpreter, chosen before triton is first imported (notebooks import
# transformers and the engine, which import it): set it before any notebook runs, as tests/conftest.py does.
if not torch.cuda.is_available(): os.environ.setdefault("TRITON_INTERPRET", "1")

ROOT = Path(__file__).resolve().parents[1]
NBS, PROC, SITE, HERE = ROOT / "nbs", ROOT / "_proc", ROOT / "_site", ROOT / "docs"
BUILD = PROC / "mkdocs"          # mkdocs.yml and docs/ (the prepared notebooks) of the site
DOCS = BUILD / "docs"
SECTIONS = {0: "Model", 1: "Runtime", 2: "Quantization", 3: "Speculative decoding", 4: "Parallelism",
            5: "Serving", 6: "Fleet", 7: "Frontier"}
WIDGET_MIME = "application/vnd.jupyter.widget-view+json"
WIDGET_NOTE = ('<div class="nb-widget-note">Interactive in Jupyter: run this notebook in a kernel to get the '
               'controls. Shown here: its output for the default values.</div>')
MATHJAX_LOCAL = "assets/mathjax/MathJax.js?config=TeX-AMS-MML_HTMLorMML-full,Safe,local/inferlab"
# Loaded by the URL above from assets/mathjax/config/local/: jupyter-server-mathjax ships only the STIX-Web fonts
# (MathJax's default TeX fonts 404, and primes such as m' then fail to typeset), so HTML-CSS output uses them; its
# MathJax_Blank probe font is declared `local()` instead of `url('about:blank')` (the same failed load, without
# Chromium's console error); and code is never typeset, so a
# copy button copies the code as written (`\[32, 32\]`, `"cost $"`), not a "[Math Processing Error]".
MATHJAX_LOCAL_CONFIG = """MathJax.Hub.Config({
  "HTML-CSS": {availableFonts: ["STIX-Web"], preferredFont: "STIX-Web", webFont: "STIX-Web", imageFont: null,
               styles: {"@font-face": {"font-family": "MathJax_Blank", src: "local('MathJax_Blank')"}}},
  tex2jax: {ignoreClass: "tex2jax_ignore|jp-CodeCell|highlight|highlight-ipynb|md-clipboard"}
});
MathJax.Ajax.loadComplete("[MathJax]/config/local/inferlab.js");
"""
MATHJAX_CDN = "https://cdnjs.cloudflare.com/ajax/libs/mathjax/2.7.7/latest.js?config=TeX-AMS_CHTML-full,Safe"
_ANSI = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b[@-Z\\-_]")
_CHAPTER = re.compile(r"^(\d)(\d)[a-z]?_")   # 13a_...: a sub-chapter of 13


def log(*a): print(*a, flush=True)


# ---------------------------------------------------------------------------------------------- 1, 2: execute
def skip_flags() -> list[str]:
    "`tst_flags` of `[tool.nbdev]`: cells flagged with these are not run, as in `nbdev-test` and tests/."
    from nbdev.config import get_config
    flags = get_config(path=ROOT).get("tst_flags", "") or ""
    return flags.split() if isinstance(flags, str) else list(flags)


def execute(name: str, flags: list[str]) -> tuple[str, bool, float]:
    "Copy `nbs/NAME.ipynb` to `_proc/` and run it there with nbdev's executor, saving the outputs on success."
    sys.path.insert(0, str(ROOT / "tools"))
    from run_notebook import run_notebook          # resets the shell after each chapter: memory stays flat
    dst = PROC / f"{name}.ipynb"
    shutil.copyfile(NBS / f"{name}.ipynb", dst)
    t = time.time()
    try: ok, _ = run_notebook(dst, flags, save=True)
    except BaseException as e:                     # test_nb catches cell errors; this is anything else
        log(f"{name}: executor error: {e!r}"); ok = False
    return name, ok, time.time() - t


def execute_all(names: list[str], flags: list[str], jobs: int) -> list[str]:
    "Execute `names`; returns those that failed (their tracebacks are already printed by nbdev)."
    PROC.mkdir(exist_ok=True)
    failed = []
    def done(name, ok, secs):
        log(f"  {'ok  ' if ok else 'FAIL'} {name:<24} {secs:6.1f} s")
        if not ok: failed.append(name)
    if jobs <= 1:
        for n in names: done(*execute(n, flags))
    else:                                          # separate processes (spawned: torch and fork don't mix)
        import multiprocessing as mp
        from concurrent.futures import ProcessPoolExecutor
        with ProcessPoolExecutor(jobs, mp_context=mp.get_context("spawn")) as ex:
            for fut in [ex.submit(execute, n, flags) for n in names]: done(*fut.result())
    return failed


# ------------------------------------------------------------------------------------------------- 3: prepare
def clean_stream(text: str) -> str:
    "Drop ANSI codes; keep only what a terminal would show of a line redrawn with `\\r` (progress bars)."
    lines = []
    for line in _ANSI.sub("", text).split("\n"):
        parts = [p for p in line.split("\r") if p]
        lines.append(parts[-1] if parts else "")
    return "\n".join(lines)


def clean_outputs(outputs: list) -> list:
    "Outputs as valid nbformat, streams merged and cleaned, widget views replaced by a note."
    res, widget = [], False
    for o in outputs:
        kind = o.get("output_type")
        if kind == "stream":
            text = "".join(o.get("text", ""))
            if res and res[-1]["output_type"] == "stream" and res[-1]["name"] == o.get("name"):
                res[-1]["text"] += text
            else: res.append(dict(output_type="stream", name=o.get("name", "stdout"), text=text))
        elif kind in ("display_data", "execute_result"):
            data = {k: ("".join(v) if isinstance(v, list) else v) for k, v in (o.get("data") or {}).items()}
            if WIDGET_MIME in data: widget = True; continue
            data.pop("application/vnd.jupyter.widget-state+json", None)
            if not data: continue
            meta = {k: v for k, v in (o.get("metadata") or {}).items() if k in data and isinstance(v, dict)}
            out = dict(output_type=kind, data=data, metadata=meta)
            if kind == "execute_result": out["execution_count"] = o.get("execution_count")
            res.append(out)
        elif kind == "error":
            res.append(dict(output_type="error", ename=str(o.get("ename", "")), evalue=str(o.get("evalue", "")),
                            traceback=[str(t) for t in o.get("traceback", [])]))
    for o in res:
        if o["output_type"] == "stream": o["text"] = clean_stream(o["text"])
    res = [o for o in res if o["output_type"] != "stream" or o["text"].strip()]
    if widget: res.append(dict(output_type="display_data", data={"text/html": WIDGET_NOTE}, metadata={}))
    return res


def title_cell(src: str, fm: dict) -> tuple[str | None, str]:
    "`# Title` + `> summary` (or front matter) → (title, markdown with the title and a summary lead line)."
    import markdown
    m = re.match(r"\s*#\s+(.+?)\s*(?:\n|$)", src)
    title = fm.get("title") or (m.group(1) if m else None)
    rest = src[m.end():] if m else src
    summary = fm.get("description")
    ms = re.match(r"\s*((?:>[^\n]*(?:\n|$))+)", rest)
    if ms:
        summary = summary or " ".join(l.lstrip(">").strip() for l in ms.group(1).splitlines())
        rest = rest[ms.end():]
    if not title: return None, src
    head = f"# {title}\n\n"
    if summary:
        lead = markdown.markdown(summary).strip()
        lead = re.sub(r"^<p>", '<p class="nb-summary">', lead) if lead.startswith("<p>") else f'<p class="nb-summary">{html.escape(summary)}</p>'
        head += lead + "\n\n"
    return title, head + rest.lstrip("\n")


def _off(v) -> bool: return str(v).strip().lower() in ("false", "0", "no")


def prepare(name: str, src: Path, dst: Path) -> tuple[str, int]:
    "Write the executed notebook `src` as a notebook mkdocs-jupyter renders; returns (title, PNG outputs)."
    import nbformat, yaml
    from nbdev.process import NBProcessor
    nb = NBProcessor(src, rm_directives=True).nb          # directives parsed into `directives_`, lines removed
    cells, fm, title, pngs = [], {}, None, 0
    for c in nb.cells:
        kind, text = c.cell_type, c.get("source", "") or ""
        text = "".join(text) if isinstance(text, list) else text
        dirs = {k.lower(): v for k, v in (getattr(c, "directives_", None) or {}).items()}
        if "hide" in dirs or _off(dirs.get("include", "")): continue
        if kind == "raw":                                  # nbdev/Quarto front matter; other raw cells dropped
            if not fm and text.lstrip().startswith("---"):
                try: fm = yaml.safe_load(text.strip().strip("-")) or {}
                except yaml.YAMLError: fm = {}
            continue
        if kind == "markdown":
            if title is None:
                title, text = title_cell(text, fm)
                if title is None: title = ""              # only the first markdown cell can hold the title
            if text.strip():
                cells.append(nbformat.v4.new_markdown_cell(text))
                if c.get("attachments"): cells[-1]["attachments"] = dict(c["attachments"])
            continue
        # code: also strip `#|` lines left after the leading block (nbdev only parses the leading ones)
        code = "\n".join(l for l in text.splitlines() if not re.match(r"\s*#\s*\|", l)).strip("\n")
        outs = [] if (_off(dirs.get("output", "")) or "hide_output" in dirs) else clean_outputs(c.get("outputs") or [])
        md = [o["data"]["text/markdown"] for o in outs if o["output_type"] != "stream" and "text/markdown" in o.get("data", {})]
        if re.fullmatch(r"show_doc\(.*\)", code, flags=re.S) and md:          # show_doc → its markdown
            cells.append(nbformat.v4.new_markdown_cell("\n\n".join(md))); continue
        hide_input = _off(dirs.get("echo", "")) or "hide_input" in dirs or not code.strip()
        if hide_input and not outs: continue
        cell = nbformat.v4.new_code_cell(code, outputs=[nbformat.from_dict(o) for o in outs])
        if hide_input: cell.metadata["tags"] = ["remove_input"]
        pngs += sum("image/png" in o.get("data", {}) for o in outs)
        cells.append(cell)
    if not title:
        title = fm.get("title") or name
        cells.insert(0, nbformat.v4.new_markdown_cell(f"# {title}"))
    out = nbformat.v4.new_notebook(cells=cells, metadata=dict(
        kernelspec=dict(name="python3", display_name="Python 3", language="python"),
        language_info=dict(name="python", pygments_lexer="ipython3")))
    nbformat.validate(out)
    nbformat.write(out, dst)
    return title, pngs


def fallback_index(chapters: list[tuple[str, str]]) -> str:
    "Landing page when `nbs/index.ipynb` is absent (or not selected): README.md, else a list of chapters."
    readme = ROOT / "README.md"
    if readme.exists(): return readme.read_text()
    lines = ["# inferlab", "", "A literate, tested reference implementation of the LLM inference stack.", ""]
    lines += [f"- [{t}]({n}.html)" for n, t in chapters]
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------------------- 4: mkdocs
def nav_of(pages: list[tuple[str, str]]) -> list:
    "Index first, then chapters by number grouped by decade (only decades that have chapters), then others."
    nav, groups, other = [], {}, []
    for name, title in sorted(pages):
        if name == "index": continue
        m = _CHAPTER.match(name)
        if m: groups.setdefault(int(m.group(1)), []).append({title: f"{name}.ipynb"})
        else: other.append({title: f"{name}.ipynb"})
    index = [f"index.{'ipynb' if (DOCS / 'index.ipynb').exists() else 'md'}"]
    for d in sorted(groups): nav.append({SECTIONS.get(d, f"{d}x"): groups[d]})
    if other: nav.append({"More": other})
    return [{"Home": index[0]}] + nav


def mathjax_dir() -> Path | None:
    "MathJax 2 files of the `jupyter-server-mathjax` package, when installed (found without importing it)."
    spec = importlib.util.find_spec("jupyter_server_mathjax")
    if not spec or not spec.submodule_search_locations: return None
    d = Path(list(spec.submodule_search_locations)[0]) / "static"
    return d if (d / "MathJax.js").exists() else None


# mkdocs-jupyter takes a page's title and table of contents from Python-Markdown's TOC of the notebook as Markdown,
# (via nbconvert), which drops inline code from headings: "Parity with `transformers`" became the title "Parity
# with" and the anchor #parity-with, while the page's heading id is parity-with-transformers. Here the TOC is read
# from the notebook's own Markdown cells with the backticks removed (the code's text kept), so titles, tabs,
# search and anchors keep the names.
MKDOCS_KEEPING_CODE_IN_HEADINGS = """
import re, sys
import nbformat
import mkdocs_jupyter.plugin as plugin
def _toc_tokens(fpath, toc_depth):
    cells = nbformat.read(str(fpath), as_version=4).cells
    source = "\\n\\n".join(c.source for c in cells if c.cell_type == "markdown")
    source = re.sub(r"^(#{1,6} .*)$", lambda m: m.group(1).replace("`", ""), source, flags=re.M)
    tokens = plugin._get_markdown_toc(source, toc_depth)
    return tokens, next((t["name"] for t in tokens if t["level"] == 1), None)
plugin._get_nb_toc_tokens = _toc_tokens
from mkdocs.__main__ import cli
sys.exit(cli())
"""


def write_config(nav: list, mathjax: Path | None) -> Path:
    import yaml
    cfg = yaml.safe_load((HERE / "mkdocs.yml").read_text())
    cfg.update(docs_dir="docs", site_dir=str(SITE), nav=nav)
    # mkdocs-jupyter 0.26 leaves `<script src="">` (no math at all) unless the URL is set. Every page is at the
    # site root (use_directory_urls: false), so a relative URL reaches the local copy from every page.
    url = MATHJAX_LOCAL if mathjax else MATHJAX_CDN
    for p in cfg["plugins"]:
        if isinstance(p, dict) and "mkdocs-jupyter" in p: p["mkdocs-jupyter"].setdefault("custom_mathjax_url", url)
    path = BUILD / "mkdocs.yml"
    path.write_text("# Written by docs/build.py from docs/mkdocs.yml: edit that file, not this one.\n"
                    + yaml.safe_dump(cfg, sort_keys=False, allow_unicode=True))
    return path


# ----------------------------------------------------------------------------------------------------- main
def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--only", nargs="+", metavar="NAME", help="notebooks to build: names or prefixes (00, 04_model, index)")
    ap.add_argument("--jobs", type=int, default=1, help="notebooks executed at once, each in its own process (default 1: in-process)")
    ap.add_argument("--keep-going", action="store_true", help="build the pages of the notebooks that ran, then still fail")
    ap.add_argument("--no-exec", action="store_true", help="reuse the executed copies in _proc/ from the last build")
    args = ap.parse_args(argv)
    os.environ.setdefault("MPLBACKEND", "Agg")
    os.environ["TQDM_DISABLE"] = "1"      # stderr progress bars render as pink blocks on a static page
    os.environ["NO_MKDOCS_2_WARNING"] = "1"
    t0, failed = time.time(), []

    names = sorted(p.stem for p in NBS.glob("*.ipynb") if not p.name.startswith(("_", ".")))
    if args.only:
        names = [n for n in names if any(n == o or n.startswith(o) for o in args.only)]
        if not names: log(f"no notebook in nbs/ matches {args.only}"); return 2
    if not names: log("no notebooks in nbs/"); return 2

    stamp = BUILD / "executed.json"       # the notebooks whose copy in _proc/ last ran to the end
    executed = set(json.loads(stamp.read_text())) if stamp.exists() else set()
    if args.no_exec:
        missing = [n for n in names if n not in executed or not (PROC / f"{n}.ipynb").exists()]
        if missing: log(f"--no-exec: not (successfully) executed yet: {', '.join(missing)}"); return 2
    else:
        flags = skip_flags()
        log(f"Executing {len(names)} notebook(s) with nbdev (cells flagged {', '.join(flags) or 'nothing'} skipped)")
        failed = execute_all(names, flags, args.jobs)
        BUILD.mkdir(parents=True, exist_ok=True)
        stamp.write_text(json.dumps(sorted((executed | set(names)) - set(failed))))
        if failed:
            log(f"\nDocs build FAILED: {len(failed)} notebook(s) did not execute: {', '.join(f'nbs/{n}.ipynb' for n in failed)}")
            if not args.keep_going: return 1
            names = [n for n in names if n not in failed]
            log("--keep-going: building the site without them (the build still fails)\n")
    t_exec = time.time() - t0

    if DOCS.exists(): shutil.rmtree(DOCS)
    (DOCS / "stylesheets").mkdir(parents=True)
    shutil.copyfile(HERE / "extra.css", DOCS / "stylesheets" / "extra.css")
    pages, pngs = [], {}
    try:
        for n in names:
            title, pngs[n] = prepare(n, PROC / f"{n}.ipynb", DOCS / f"{n}.ipynb")
            pages.append((n, title))
    except Exception as e:
        log(f"Docs build FAILED: preparing nbs/{n}.ipynb: {type(e).__name__}: {e}"); return 1
    if "index" not in names:
        if not (NBS / "index.ipynb").exists(): log("nbs/index.ipynb not found: the landing page is made from README.md")
        (DOCS / "index.md").write_text(fallback_index([p for p in pages]))
        pages.append(("index", "Home"))

    mathjax = mathjax_dir()
    cfg = write_config(nav_of(pages), mathjax)
    log(f"Building the site with mkdocs-material ({cfg.relative_to(ROOT)})")
    r = subprocess.run([sys.executable, "-c", MKDOCS_KEEPING_CODE_IN_HEADINGS, "build", "--strict", "--quiet", "-f",
                        str(cfg)], cwd=BUILD)
    if r.returncode: log(f"Docs build FAILED: mkdocs exited with {r.returncode}"); return 1
    if mathjax:
        shutil.copytree(mathjax, SITE / "assets" / "mathjax")
        (SITE / "assets" / "mathjax" / "config" / "local").mkdir(parents=True, exist_ok=True)
        (SITE / "assets" / "mathjax" / "config" / "local" / "inferlab.js").write_text(MATHJAX_LOCAL_CONFIG)
    else: log("note: jupyter-server-mathjax is not installed: pages load MathJax from a CDN (math needs a network)")

    # 5: every page is there with its figures
    bad = []
    log(f"\nSite: {SITE / 'index.html'}  ({len(pages)} pages, {time.time() - t0:.0f} s: notebooks {t_exec:.0f} s)")
    for n, title in sorted(pages, key=lambda p: (p[0] != "index", p[0])):
        f = SITE / f"{n}.html"
        page = f.read_text(errors="replace") if f.exists() else ""
        imgs = len(re.findall(r'<img[^>]+src="data:image/png', page))
        ok = bool(page) and imgs >= pngs.get(n, 0)
        if not ok: bad.append(n)
        log(f"  {'' if ok else 'BAD '}{f.relative_to(ROOT)}  {title}  [{imgs} figure(s), {len(page) // 1024} KiB]")
    if bad: log(f"Docs build FAILED: pages missing or without their figures: {', '.join(bad)}"); return 1
    if failed: log(f"Docs build FAILED: left out, as they did not execute: {', '.join(failed)}"); return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
