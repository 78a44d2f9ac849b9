"""Run one notebook in this process with nbdev's executor, and give back what it built: the one place that
tests/test_notebooks.py (every chapter is a test) and docs/build.py (the site executes every chapter) run a chapter."""
import gc, sys
from pathlib import Path

def release(main) -> None:
    """Drop what a chapter left behind in this process. The notebook ran in an IPython shell whose namespace is a
    `__main__` module that stays in sys.modules, and the shell stays registered as IPython's instance: without a
    reset, every engine a chapter built (and its KV cache) lived on for the rest of the run (a test worker grew to
    16 GiB). Widgets stay registered until closed, figures until closed."""
    import ipywidgets, matplotlib.pyplot as plt
    from IPython.core.interactiveshell import InteractiveShell
    ipywidgets.Widget.close_all()
    plt.close("all")
    shell = InteractiveShell._instance
    if shell is not None:
        shell.reset(new_session=False)                # the user namespace, Out and the output cache
        if getattr(shell, "loop", None) is not None: shell.loop.call_soon_threadsafe(shell.loop.stop)
        InteractiveShell.clear_instance()
    sys.modules["__main__"] = main
    gc.collect()

def run_notebook(path: Path, skip_flags: list[str], save: bool = False) -> tuple[bool, float]:
    "`nbdev.test.test_nb` on `path` (cells flagged with `skip_flags` not run), then `release`: (ok, seconds)."
    import nbdev.test as nbt                          # not `from nbdev.test import test_nb`: pytest would collect it
    main = sys.modules["__main__"]
    try: return nbt.test_nb(path, skip_flags=skip_flags, save=save)
    finally: release(main)
