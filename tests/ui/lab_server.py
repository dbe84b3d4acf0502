"""A JupyterLab server and a headless Chromium for the browser test.

`jupyterlab_server(root, work, env)` serves `root` on 127.0.0.1 (a free port, a random token),
with its own config, settings and workspace folders: no news, no update check, every cell
rendered (no virtual scrolling). `browser()` is Debian's Chromium driven by Playwright
(never `playwright install`: its download does not work here). `missing()` says why the
test cannot run, or None.
"""
from __future__ import annotations

import contextlib
import json
import os
import secrets
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Iterator

CHROMIUM = os.environ.get("LAB_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
SETTINGS = {  # JupyterLab user settings: quiet, and every cell in the DOM
    "@jupyterlab/notebook-extension/tracker.jupyterlab-settings": {"windowingMode": "none"},
    "@jupyterlab/apputils-extension/notification.jupyterlab-settings": {"fetchNews": "false",
                                                                        "checkForUpdates": False},
    # The notebook is saved with its widgets' state, so the test can look for secrets in it.
    "@jupyter-widgets/jupyterlab-manager/plugin.jupyterlab-settings": {"saveState": True},
}
PAGE_CONFIG = {"disabledExtensions": {"@jupyterlab/apputils-extension:announcements": True}}


def missing() -> str | None:
    """Why the browser test cannot run here, or None."""
    if not Path(CHROMIUM).exists():
        return f"no Chromium at {CHROMIUM}: run scripts/install-browser-test-deps (apt-get install chromium)"
    for module, package in (("playwright", "playwright"), ("jupyterlab", "jupyterlab"),
                            ("jupyterlab_widgets", "jupyterlab_widgets")):
        try:
            __import__(module)
        except ImportError:
            return f"Python package {package} is missing: run scripts/install-browser-test-deps"
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def jupyterlab_server(root: Path, work: Path, env: dict[str, str], unset: tuple[str, ...] = ()) -> Iterator[tuple[str, str]]:
    """Serves `root` with `env` added to the server's (and so the kernels') environment and the
    variables `unset` taken out; yields (base URL, token). Its log is `work/jupyterlab.log`."""
    config, settings = work / "jupyter-config", work / "lab-settings"
    (config / "labconfig").mkdir(parents=True, exist_ok=True)
    (config / "labconfig" / "page_config.json").write_text(json.dumps(PAGE_CONFIG))
    for rel, value in SETTINGS.items():
        path = settings / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(value))
    port, token = _free_port(), secrets.token_hex(16)
    full_env = {**{k: v for k, v in os.environ.items() if k not in unset}, **env,
                "JUPYTER_CONFIG_DIR": str(config), "JUPYTERLAB_SETTINGS_DIR": str(settings),
                "JUPYTERLAB_WORKSPACES_DIR": str(work / "lab-workspaces"), "JUPYTER_RUNTIME_DIR": str(work / "runtime")}
    log = open(work / "jupyterlab.log", "wb")
    proc = subprocess.Popen([sys.executable, "-m", "jupyterlab", "--no-browser", "--ServerApp.ip=127.0.0.1",
                             f"--ServerApp.port={port}", "--ServerApp.port_retries=0",
                             f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={root}",
                             "--LabApp.news_url=", "--LabApp.extension_manager=readonly"]
                            + (["--allow-root"] if hasattr(os, "geteuid") and os.geteuid() == 0 else []),
                            stdout=log, stderr=subprocess.STDOUT, env=full_env, cwd=root)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(f"{base}/api/status?token={token}", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"JupyterLab did not start; see {work / 'jupyterlab.log'}:\n"
                                   + (work / "jupyterlab.log").read_text(errors="replace")[-3000:])
            time.sleep(0.3)
        yield base, token
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


@contextlib.contextmanager
def browser(viewport=(1500, 1000)):
    """A Playwright page in headless Debian Chromium."""
    from playwright.sync_api import sync_playwright
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        try:
            page = b.new_page(viewport={"width": viewport[0], "height": viewport[1]})
            yield page
        finally:
            b.close()
