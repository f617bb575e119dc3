"""The panel in a real browser: JupyterLab started here, headless Chromium driven by Playwright.

A notebook builds the panel on the digits demo; the test changes batch size and
precision in the page, runs, waits for the runs table and the live plot, then stops a
long run. Every check reads text that only the panel's Python callbacks produce.
Screenshots of the panel go to test-artifacts/.
"""
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent
ARTIFACTS = ROOT / "test-artifacts"
CHROMIUM_FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--disable-dev-shm-usage"]
NOTEBOOK_CELLS = [
    "import nbtrain\nfrom nbtrain.demo import digits_recipe\nrecipe = digits_recipe()",
    "p = nbtrain.panel(recipe, nbtrain.TrainConfig(accelerator='cpu', max_epochs=1))",
]

# A %%nbtrain run of several seconds (each step sleeps 5 ms) whose live plot must draw while it trains.
MAGIC_CELLS = [
    "%load_ext nbtrain",
    "%%nbtrain --max-steps 1500 --batch-size 32 --accelerator cpu --name live\n"
    "import time, torch\nfrom nbtrain.demo import DigitsDataset, DigitsMLP\n"
    "model, train_data, loss_fn = DigitsMLP(), DigitsDataset(), torch.nn.CrossEntropyLoss()\n"
    "def training_step(model, batch):\n    time.sleep(0.005)\n    return loss_fn(model(batch[0]), batch[1])",
]

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]


def find_chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome", "chrome"):
        found = shutil.which(name)
        if found:
            return found
    # Debian's package can be installed here when we may (root, apt-get, not opted out).
    if os.geteuid() == 0 and shutil.which("apt-get") and not os.environ.get("NBTRAIN_NO_APT"):
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        subprocess.run(["apt-get", "install", "-y", "-qq", "--no-install-recommends", "chromium"],
                       env=env, capture_output=True, timeout=600)
        return shutil.which("chromium")
    return None


@pytest.fixture(scope="module")
def chromium_path():
    pytest.importorskip("playwright.sync_api", reason="needs Python Playwright: pip install playwright")
    path = find_chromium()
    if path is None:
        pytest.skip("no Chromium on this machine and none could be installed (apt-get install chromium)")
    return path


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def api(port: int, path: str, method: str = "GET"):
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", method=method)
    with urllib.request.urlopen(request, timeout=5) as response:
        body = response.read()
    return json.loads(body) if body else None


def delete_sessions(port: int) -> None:
    for session in api(port, "/api/sessions"):
        api(port, f"/api/sessions/{session['id']}", method="DELETE")


@pytest.fixture(scope="module")
def lab(chromium_path):
    """A JupyterLab server on 127.0.0.1 with private config, runtime and settings folders."""
    import nbformat
    home = Path(tempfile.mkdtemp(prefix="nbtrain-lab-"))  # mkdtemp makes it 0700
    settings = home / "settings"
    notification = settings / "@jupyterlab" / "apputils-extension" / "notification.jupyterlab-settings"
    notification.parent.mkdir(parents=True)
    notification.write_text(json.dumps({"fetchNews": "false", "checkForUpdates": False}))
    notebooks = home / "notebooks"
    notebooks.mkdir()
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(src) for src in NOTEBOOK_CELLS])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, notebooks / "panel.ipynb")
    magic = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(src) for src in MAGIC_CELLS])
    magic.metadata["kernelspec"] = nb.metadata["kernelspec"]
    nbformat.write(magic, notebooks / "magic.ipynb")
    port = free_port()
    env = {**os.environ, "JUPYTER_CONFIG_DIR": str(home / "config"), "JUPYTER_RUNTIME_DIR": str(home / "runtime"),
           "JUPYTERLAB_SETTINGS_DIR": str(settings), "JUPYTERLAB_WORKSPACES_DIR": str(home / "workspaces"),
           # The kernel imports this tree's nbtrain.
           "PYTHONPATH": os.pathsep.join([str(ROOT)] + [p for p in [os.environ.get("PYTHONPATH")] if p]),
           "OMP_NUM_THREADS": "1"}
    server = subprocess.Popen(
        [sys.executable, "-m", "jupyterlab", "--no-browser", "--allow-root", "--ip=127.0.0.1", f"--port={port}",
         "--ServerApp.port_retries=0", "--IdentityProvider.token=", "--ServerApp.password=",
         "--ServerApp.disable_check_xsrf=True", f"--ServerApp.root_dir={notebooks}"],
        env=env, stdout=subprocess.DEVNULL, stderr=open(home / "server.log", "wb"), start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                api(port, "/api/status")
                break
            except OSError:
                if server.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("JupyterLab did not start:\n" + (home / "server.log").read_text()[-3000:])
                time.sleep(0.3)
        yield port
        delete_sessions(port)
    finally:
        server.terminate()
        try:
            server.wait(15)
        except subprocess.TimeoutExpired:
            server.kill()
        shutil.rmtree(home, ignore_errors=True)


@pytest.fixture
def page(lab, chromium_path):
    from playwright.sync_api import sync_playwright
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium_path, headless=True, args=CHROMIUM_FLAGS)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1600})
            page.set_default_timeout(60_000)
            yield page
        finally:
            browser.close()


def test_panel_in_jupyterlab_runs_with_changed_settings_and_stops_on_request(lab, page):
    from playwright.sync_api import expect
    expect.set_options(timeout=60_000)  # a cold kernel imports torch first; this machine may be busy
    ARTIFACTS.mkdir(exist_ok=True)
    page.goto(f"http://127.0.0.1:{lab}/lab/tree/panel.ipynb?reset")
    kernel = page.locator("#jp-main-statusbar .jp-StatusBar-TextItem[title^='Change kernel']")
    expect(kernel).to_contain_text("Idle")
    page.locator(".lm-MenuBar-itemLabel", has_text=re.compile(r"^Run$")).click()
    page.locator(".lm-Menu-itemLabel", has_text=re.compile(r"^Run All Cells$")).click()

    panel = page.locator(".nbtrain-panel")
    expect(panel).to_be_visible()
    status = panel.locator(".nbtrain-status")
    expect(status).to_contain_text("ready: press Run")

    if not torch.cuda.is_available():  # the kernel runs on this machine: no CUDA there either
        expect(panel.locator(".nbtrain-device-cuda")).to_be_disabled()
        expect(panel.locator(".nbtrain-device-reasons")).to_contain_text("cuda: not available on this machine")
    batch = panel.locator(".nbtrain-batch-size input")
    batch.fill("64")
    batch.press("Enter")
    panel.locator(".nbtrain-precision-bf16-mixed").click()
    expect(panel.locator(".nbtrain-readout")).to_contain_text("global batch 64 = batch 64")
    expect(panel.locator(".nbtrain-readout")).to_contain_text("bf16-mixed on cpu")

    panel.locator(".nbtrain-run").click()
    row = panel.locator(".nbtrain-runs tr[data-run='1'][data-status='completed']")
    expect(row).to_be_visible()
    cells = row.locator("td").all_inner_texts()
    assert cells[:5] == ["#1", "completed", "cpu", "bf16-mixed", "64"], cells
    expect(status).to_contain_text(re.compile(r"run #1 completed after \d+ steps — [\d,.]+ samples/s"))
    page.wait_for_function("() => { const img = document.querySelector('img.nbtrain-live-plot');"
                           " return img !== null && img.naturalWidth > 0; }")
    panel.screenshot(path=str(ARTIFACTS / "panel-after-run.png"))

    epochs = panel.locator(".nbtrain-max-epochs input")
    epochs.fill("1000")
    epochs.press("Enter")
    expect(panel.locator(".nbtrain-readout")).to_contain_text("1000 epoch(s)")
    before = page.locator("img.nbtrain-live-plot").get_attribute("src")
    panel.locator(".nbtrain-run").click()
    expect(panel.locator(".nbtrain-progress")).to_contain_text(re.compile(r"run #2: step \d+ of \d+"))
    expect(panel.locator(".nbtrain-stop")).to_be_enabled()
    # The live plot draws run #2 while it trains (a new frame), not only when it ends.
    page.wait_for_function("(before) => { const img = document.querySelector('img.nbtrain-live-plot');"
                           " return img !== null && img.src !== before && img.naturalWidth > 0; }", arg=before)
    expect(panel.locator(".nbtrain-stop")).to_be_enabled()  # still running
    panel.screenshot(path=str(ARTIFACTS / "panel-while-running.png"))
    panel.locator(".nbtrain-stop").click()
    expect(status).to_contain_text(re.compile(r"run #2 stopped: stopped at step \d+ \(epoch \d+"))
    expect(panel.locator(".nbtrain-runs tr[data-run='2'][data-status='stopped']")).to_be_visible()
    expect(panel.locator(".nbtrain-stop")).to_be_disabled()
    expect(panel.locator(".nbtrain-run")).to_be_enabled()
    panel.screenshot(path=str(ARTIFACTS / "panel-after-stop.png"))


def test_a_magic_cells_live_plot_has_data_while_the_run_goes_on(lab, page):
    from playwright.sync_api import expect
    expect.set_options(timeout=60_000)
    ARTIFACTS.mkdir(exist_ok=True)
    page.goto(f"http://127.0.0.1:{lab}/lab/tree/magic.ipynb?reset")
    kernel = page.locator("#jp-main-statusbar .jp-StatusBar-TextItem[title^='Change kernel']")
    expect(kernel).to_contain_text("Idle")
    page.locator(".lm-MenuBar-itemLabel", has_text=re.compile(r"^Run$")).click()
    page.locator(".lm-Menu-itemLabel", has_text=re.compile(r"^Run All Cells$")).click()
    cell = page.locator(".jp-Notebook .jp-CodeCell").nth(1)
    image = cell.locator(".jp-OutputArea-output img")
    expect(image).to_be_visible()
    # Drawn while the cell still runs: its prompt shows [*] and no summary table yet.
    expect(cell.locator(".jp-InputPrompt")).to_contain_text("[*]")
    assert image.evaluate("img => img.naturalWidth") > 0
    assert cell.locator("text=nbtrain run live").count() == 0
    cell.screenshot(path=str(ARTIFACTS / "magic-while-running.png"))
    expect(cell.locator("text=nbtrain run live")).to_be_visible(timeout=120_000)  # the summary, at the end
    expect(cell.locator(".jp-OutputArea-output img")).to_have_count(1)  # one plot, updated in place
    cell.screenshot(path=str(ARTIFACTS / "magic-after-run.png"))
