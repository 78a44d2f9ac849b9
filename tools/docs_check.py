"""Load every page of the built docs site in headless Chromium and report what a reader would hit.

    python tools/docs_check.py [--site _site] [--width 1440]

Serves the site on 127.0.0.1 (a free port), opens each page with Playwright driving Debian's `chromium` (no
browser download), and counts, per page: console errors, failed requests (and HTTP errors), MathJax errors,
internal links or anchors that point nowhere, and code lines clipped at the window width. Prints one line per
page with a problem and one summary line; exits 1 when anything is wrong. `make docs-check` builds the site first.
"""
from __future__ import annotations
import argparse, functools, http.server, shutil, sys, threading, time
from pathlib import Path
from urllib.parse import urlparse, unquote

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser") or "/usr/bin/chromium"
FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
         "--disable-component-update", "--disable-sync"]

# In the page: wait for MathJax, then collect what the check needs.
PROBE = """async () => {
  if (window.MathJax && MathJax.Hub) await new Promise(r => MathJax.Hub.Queue(r));
  // an error box, or maths left as TeX source in the prose ($...$ that MathJax never typeset)
  const prose = [...document.querySelectorAll('.jp-RenderedMarkdown, .md-typeset > p')].map(e => e.innerText).join('\\n');
  const errors = document.querySelectorAll('.MathJax_Error, [data-mjx-error]').length
               + (document.body.innerText.match(/\\[Math Processing Error\\]/g) || []).length
               + (prose.match(/\\$[^$\\s][^$\\n]*\\$/g) || []).length;
  const clipped = [...document.querySelectorAll('pre')].filter(p => p.offsetParent !== null && p.scrollWidth > p.clientWidth + 1).length;
  const ids = [...document.querySelectorAll('[id]')].map(e => e.id);
  const links = [...document.querySelectorAll('a[href]')].map(a => a.getAttribute('href'));
  return {errors, clipped, ids, links};
}"""


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args): pass                  # one summary line, not a line per request


def serve(site: Path):
    handler = functools.partial(_QuietHandler, directory=str(site))
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    return httpd


def check(site: Path, width: int = 1440, timeout_ms: int = 60_000) -> dict:
    from playwright.sync_api import sync_playwright
    pages = sorted(p.relative_to(site).as_posix() for p in site.glob("*.html") if p.name != "404.html")
    httpd = serve(site)
    base = f"http://127.0.0.1:{httpd.server_address[1]}/"
    found, per_page = {}, {}
    try:
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
            for name in pages:
                page = browser.new_page(viewport={"width": width, "height": 900})
                bad = {"console": [], "requests": []}
                page.on("console", lambda m, b=bad: b["console"].append(m.text) if m.type == "error" else None)
                page.on("requestfailed", lambda r, b=bad: b["requests"].append(r.url))
                page.on("response", lambda r, b=bad: b["requests"].append(f"{r.status} {r.url}") if r.status >= 400 else None)
                page.goto(base + name, wait_until="networkidle", timeout=timeout_ms)
                page.set_default_timeout(timeout_ms)             # a MathJax queue that never drains fails the page
                probe = page.evaluate(PROBE)
                found[name] = set(probe["ids"])
                per_page[name] = dict(console=bad["console"], requests=bad["requests"], mathjax=probe["errors"],
                                      clipped=probe["clipped"], links=probe["links"])
                page.close()
            browser.close()
    finally: httpd.shutdown()
    for name, r in per_page.items():                     # internal links and anchors, against the pages seen
        broken = []
        for href in r.pop("links"):
            u = urlparse(href)
            if u.scheme or href.startswith(("mailto:", "javascript:")): continue
            target = unquote(u.path) or name
            if target.endswith("/"): target += "index.html"
            if not (site / target).exists(): broken.append(href); continue
            if u.fragment and target in found and u.fragment not in found[target]: broken.append(href)
        r["broken"] = broken
    return per_page


def screenshots(site: Path, specs: list[str], width: int = 1440):
    "`PAGE#ID=OUT.png`: the window scrolled so that element ID of PAGE is at the top, as a reader lands on it."
    from playwright.sync_api import sync_playwright
    httpd = serve(site)
    base = f"http://127.0.0.1:{httpd.server_address[1]}/"
    try:
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
            for spec in specs:
                target, out = spec.split("=", 1)
                page = browser.new_page(viewport={"width": width, "height": 1000})
                page.goto(base + target, wait_until="networkidle")
                page.evaluate(PROBE)                                  # MathJax done
                page.evaluate("id => document.getElementById(id).scrollIntoView()", urlparse(target).fragment)
                page.wait_for_timeout(300)
                page.screenshot(path=out)
                print(f"screenshot: {target} -> {out}")
                page.close()
            browser.close()
    finally: httpd.shutdown()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--site", default=str(ROOT / "_site"))
    ap.add_argument("--width", type=int, default=1440, help="window width for the clipped-code check (px)")
    ap.add_argument("--screenshot", action="append", default=[], metavar="PAGE#ID=OUT.png",
                    help="also save the window at that element (repeatable)")
    a = ap.parse_args(argv)
    site, t0 = Path(a.site), time.time()
    if not (site / "index.html").exists(): print(f"{site}: no built site (run make docs)"); return 2
    if a.screenshot: screenshots(site, a.screenshot, a.width)
    res = check(site, a.width)
    totals = {k: 0 for k in ("console", "requests", "mathjax", "broken", "clipped")}
    for name, r in res.items():
        n = {k: (len(v) if isinstance(v, list) else v) for k, v in r.items()}
        for k in totals: totals[k] += n[k]
        if any(n.values()):
            detail = "; ".join(f"{k}: {v[:3] if isinstance(v, list) else v}" for k, v in r.items() if v)
            print(f"  {name}: {detail}")
    print(f"docs-check: {len(res)} pages, {totals['console']} console errors, {totals['requests']} failed requests, "
          f"{totals['mathjax']} MathJax errors, {totals['broken']} broken links or anchors, {totals['clipped']} clipped "
          f"code blocks at {a.width} px ({time.time() - t0:.0f} s)")
    return 1 if any(totals.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
