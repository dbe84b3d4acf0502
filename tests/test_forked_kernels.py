"""The tests' forked kernels (tests/forked_kernels.py) behave as a kernel started the usual way:
the launcher's folder and environment, an interrupt that reaches the running cell, the end with its
shutdown, matplotlib's backend, none of the server's objects for its collector to walk; and a kernel
whose environment would change the server's imports starts the usual way."""
from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
from jupyter_client.manager import start_new_kernel

from tests.conftest import wait_for

INLINE = "module://matplotlib_inline.backend_inline"  # what a kernel's matplotlib draws with


def _run(client, code: str) -> tuple[str, str]:
    out = []
    reply = client.execute_interactive(code, timeout=60, output_hook=lambda m: out.append(m["content"].get("text", "")))
    return "".join(out), reply["content"]["status"]


@pytest.mark.skipif(os.environ.get("LAB_TEST_FORKED_KERNELS") == "0", reason="kernels start the usual way")
def test_a_forked_kernel_has_the_launchers_folder_and_environment_and_takes_an_interrupt(tmp_path, monkeypatch):
    monkeypatch.setenv("LAB_FORK_CHECK", "here")
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setenv("HOME", str(tmp_path))  # as the Kaggle tests set it
    manager, client = start_new_kernel(kernel_name="python3", cwd=str(tmp_path))
    try:
        text, status = _run(client, "import os, sys, tempfile\n"
                                    "print(os.getcwd(), os.environ['LAB_FORK_CHECK'], tempfile.gettempdir(),\n"
                                    "      'torch' in sys.modules, os.getpgid(0) == os.getpid(), os.getpid())")
        cwd, value, temp, imported, leader, kernel = text.split()
        assert status == "ok" and (cwd, value, temp) == (str(tmp_path), "here", str(tmp_path))
        assert imported == "True", "the kernel was not forked from the server"
        assert leader == "True", "a kernel leads a process group of its own, as jupyter_client starts one"
        text, status = _run(client, "import matplotlib; print(matplotlib.rcParams['backend'])")
        assert (status, text.strip()) == ("ok", INLINE), "a forked kernel draws with the backend ipykernel sets"
        text, status = _run(client, "import gc; print(gc.get_freeze_count() > 10_000)")
        assert (status, text.strip()) == ("ok", "True"), "the server's objects are out of the collector's sight"
        for interrupt in (manager.interrupt_kernel,  # Jupyter's, by message
                          lambda: os.killpg(manager.provisioner.pgid, signal.SIGINT)):  # the stop button's signal
            # The next cell runs after this one's error; the interrupt comes once the cell's own code
            # runs (one that lands before, in ipykernel's handling of the request, loses the reply).
            asked = client.execute("import time; print('asleep', flush=True); time.sleep(60)", stop_on_error=False)
            while not (msg := client.get_iopub_msg(timeout=20))["msg_type"] == "stream" \
                    or msg["parent_header"].get("msg_id") != asked:
                pass
            interrupt()
            reply = client.get_shell_msg(timeout=20)
            assert reply["content"]["status"] == "error" and reply["content"]["ename"] == "KeyboardInterrupt"
    finally:
        client.stop_channels()
        manager.shutdown_kernel(now=False)
    wait_for(lambda: not Path(f"/proc/{kernel}").exists(), 30, "the kernel to end with its shutdown")


def test_a_kernel_whose_python_path_differs_starts_the_usual_way(tmp_path, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))  # a sitecustomize there would run at its start
    (tmp_path / "sitecustomize.py").write_text("import os\nos.environ['LAB_SITE_RAN'] = '1'\n")
    manager, client = start_new_kernel(kernel_name="python3", cwd=str(tmp_path))
    try:
        text, status = _run(client, "import os, sys\nprint(os.environ.get('LAB_SITE_RAN'), 'torch' in sys.modules)")
        assert status == "ok" and text.split() == ["1", "False"]
        text, status = _run(client, "import matplotlib; print(matplotlib.rcParams['backend'])")
        assert (status, text.strip()) == ("ok", INLINE)
    finally:
        client.stop_channels()
        manager.shutdown_kernel(now=True)
