"""Open one chapter in JupyterLab, headless, run it, turn one of its widgets' knobs and check the output changes.

    python tools/lab_check.py [--notebook nbs/10_kv_memory.ipynb] [--timeout 180]

JupyterLab is served on 127.0.0.1 (a free port, a random token) from a temporary copy of the notebook, so the
repository is never written; Playwright drives Debian's `chromium` (no browser download). The check runs every
cell through JupyterLab's own command (`notebook:run-all-cells`), waits for the first widget's output, moves the
first slider one step with the keyboard, as a reader would, and passes when the output text changes without an
error in any output. Prints one line; exits 1 on failure. `make docs-check` runs it after the site check.
"""
from __future__ import annotations
import argparse, os, secrets, shutil, socket, subprocess, sys, tempfile, time
from pathlib import Path
from urllib.request import urlopen

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser") or "/usr/bin/chromium"
OUTPUT = ".jupyter-widgets .widget-output"          # an `interactive`'s output area, inside the widget's view


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0)); return s.getsockname()[1]


def start_lab(root: Path, port: int, token: str, timeout: float) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "jupyterlab", "--no-browser", f"--ServerApp.root_dir={root}", "--ServerApp.ip=127.0.0.1",
           f"--ServerApp.port={port}", f"--IdentityProvider.token={token}", "--LabApp.expose_app_in_browser=True",
           "--ServerApp.port_retries=0", "--allow-root", "--LabApp.news_url=", "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate"]
    log = open(root / "lab.log", "w")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=root,
                            env={**os.environ, "MPLBACKEND": "module://matplotlib_inline.backend_inline"})
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if proc.poll() is not None: raise RuntimeError(f"jupyter lab exited: {(root / 'lab.log').read_text()[-1500:]}")
        try:
            with urlopen(f"http://127.0.0.1:{port}/api/status?token={token}", timeout=2): return proc
        except OSError: time.sleep(0.3)
    raise RuntimeError(f"jupyter lab: no answer on port {port} in {timeout:.0f} s")


def output_text(page) -> str:
    return page.eval_on_selector(OUTPUT, "e => e.innerText")


def drive(url: str, timeout_s: float) -> tuple[str, str, list[str]]:
    "Run all cells, then move the first slider: the widget output before and after, and any error outputs."
    from playwright.sync_api import sync_playwright
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
        page = browser.new_page(viewport={"width": 1440, "height": 1000})
        page.goto(url)
        page.wait_for_function("window.jupyterapp && window.jupyterapp.shell.currentWidget "
                               "&& window.jupyterapp.shell.currentWidget.sessionContext?.session?.kernel",
                               timeout=timeout_s * 1000)
        page.evaluate("() => window.jupyterapp.shell.currentWidget.sessionContext.ready")
        page.evaluate("() => window.jupyterapp.commands.execute('notebook:run-all-cells')")
        page.wait_for_selector(OUTPUT, timeout=timeout_s * 1000)
        page.wait_for_function(f"document.querySelector('{OUTPUT}').innerText.trim().length > 0", timeout=timeout_s * 1000)
        before = output_text(page)
        handle = page.locator(".jupyter-widgets .widget-slider .noUi-handle").first
        handle.focus(); page.keyboard.press("ArrowRight")
        page.wait_for_function(f"document.querySelector('{OUTPUT}').innerText !== {before!r}", timeout=30_000)
        after = output_text(page)
        errors = page.eval_on_selector_all(".jp-OutputArea-output[data-mime-type='application/vnd.jupyter.stderr'], "
                                           ".jp-RenderedText[data-mime-type='application/vnd.jupyter.error']",
                                           "es => es.map(e => e.innerText.slice(0, 300))")
        browser.close()
    return before, after, errors


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--notebook", default=str(ROOT / "nbs" / "10_kv_memory.ipynb"))
    ap.add_argument("--timeout", type=float, default=180.0)
    a = ap.parse_args(argv)
    nb, t0 = Path(a.notebook).resolve(), time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        shutil.copy(nb, root / nb.name)
        port, token = free_port(), secrets.token_hex(16)
        proc = start_lab(root, port, token, a.timeout)
        try: before, after, errors = drive(f"http://127.0.0.1:{port}/lab/tree/{nb.name}?token={token}", a.timeout)
        except Exception as e:
            print(f"lab-check: FAILED {nb.name}: {type(e).__name__}: {str(e).splitlines()[0][:300]}"); return 1
        finally:
            proc.terminate()
            try: proc.wait(15)
            except subprocess.TimeoutExpired: proc.kill()
    first = lambda s: s.strip().splitlines()[0][:80] if s.strip() else ""
    ok = before != after and not errors
    print(f"lab-check: {'ok' if ok else 'FAILED'} {nb.name} in JupyterLab: a slider moved one step, the widget output "
          f"changed from {first(before)!r} to {first(after)!r}; {len(errors)} error outputs; {time.monotonic() - t0:.0f} s")
    for e in errors: print("  error output:", e)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
