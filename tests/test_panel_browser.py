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


# Every shown element of the panel must fit: no text cut off (an ellipsis or a clipped label reads as
# scrollWidth > clientWidth), nothing sticking out of the panel or the panel out of its output area,
# no broken image, no widget that failed to render. Form fields scroll their own text by design, so they
# are left out of the width check.
LAYOUT_PROBLEMS = """(root) => {
  const name = (el) => el.tagName.toLowerCase() + [...el.classList].filter(c => c.startsWith('nbtrain-')
      || c.startsWith('widget-') || c.startsWith('jupyter-widget')).map(c => '.' + c).slice(0, 2).join('')
      + (el.textContent ? ` "${el.textContent.trim().slice(0, 30)}"` : '');
  const problems = [];
  const panel = root.getBoundingClientRect();
  const area = (root.closest('.jp-OutputArea-output') || root.parentElement).getBoundingClientRect();
  for (const failed of root.querySelectorAll('.jupyter-widgets-error-widget'))
    problems.push(`a widget failed to render: ${failed.textContent.trim().slice(0, 200)}`);
  if (panel.right > area.right + 1 || panel.right > window.innerWidth)
    problems.push(`the panel (right edge ${panel.right}) runs out of its output area (${area.right})`);
  for (const el of root.querySelectorAll('*')) {
    if (el.getClientRects().length === 0 || getComputedStyle(el).visibility === 'hidden') continue;
    const box = el.getBoundingClientRect();
    if (box.width === 0 || box.height === 0) continue;
    if (box.left < panel.left - 1 || box.right > panel.right + 1)
      problems.push(`${name(el)} sticks out of the panel: ${box.left}-${box.right} vs ${panel.left}-${panel.right}`);
    if (!['INPUT', 'SELECT', 'TEXTAREA'].includes(el.tagName) && el.scrollWidth > el.clientWidth + 1
        && el.clientWidth > 0)
      problems.push(`${name(el)} is cut off or overflows: ${el.scrollWidth}px of content in ${el.clientWidth}px`);
    if (el.tagName === 'IMG' && !(el.complete && el.naturalWidth > 0))
      problems.push(`${name(el)} is a broken image`);
  }
  return problems;
}"""
SIZES = [(1280, 800), (1920, 1080)]
# What the pointer shows over each control: ipywidgets puts the tooltip on the button, the field or its label.
TOOLTIPS = """(root) => Object.fromEntries([...root.querySelectorAll(
    '.nbtrain-run, .nbtrain-stop, .nbtrain-apply, .nbtrain-close, .nbtrain-code-toggle, .nbtrain-runs-details, '
    + '[class*="nbtrain-device-"]:not(.nbtrain-device-reasons), '
    + '[class*="nbtrain-precision-"]:not(.nbtrain-precision-reasons), '
    + '.nbtrain-batch-size, .nbtrain-accumulate, .nbtrain-workers, .nbtrain-devices, .nbtrain-scale-lr, '
    + '.nbtrain-base-batch, '
    + '.nbtrain-lr, .nbtrain-max-epochs, .nbtrain-max-steps, .nbtrain-compile, .nbtrain-channels-last, '
    + '.nbtrain-optimizer-impl, .nbtrain-matmul, .nbtrain-find-unused-parameters, .nbtrain-compare-select')]
  .map(el => [[...el.classList].find(c => c.startsWith('nbtrain-')),
              el.title || (el.querySelector('[title]') || {}).title || '']))"""


def assert_fits(page, panel, label: str) -> None:
    """The panel's layout holds at each screen size (checked in the page, after the reflow)."""
    for width, height in SIZES:
        page.set_viewport_size({"width": width, "height": height})
        page.wait_for_timeout(400)
        problems = panel.evaluate(LAYOUT_PROBLEMS)
        assert problems == [], f"{label} at {width}x{height}: " + "\n".join(problems)
    page.set_viewport_size({"width": SIZES[0][0], "height": SIZES[0][1]})
    page.wait_for_timeout(400)


def shoot(page, panel, name: str, width: int = 1280) -> None:
    """A screenshot of the whole panel as laid out at `width`: the window is made tall enough to hold
    it (JupyterLab's notebook scrolls inside the window, so a taller panel would be cut off)."""
    page.set_viewport_size({"width": width, "height": 2400})
    page.wait_for_timeout(400)
    panel.screenshot(path=str(ARTIFACTS / name))
    page.set_viewport_size({"width": SIZES[0][0], "height": SIZES[0][1]})
    page.wait_for_timeout(400)


def open_tab(panel, title: str) -> None:
    panel.locator(".nbtrain-tabs .lm-TabBar-tab", has_text=re.compile(rf"^{title}$")).click()


def number(text: str) -> int:
    return int(text.replace(",", ""))


def test_panel_in_jupyterlab_runs_with_changed_settings_and_stops_on_request(lab, page):
    from playwright.sync_api import expect
    expect.set_options(timeout=60_000)  # a cold kernel imports torch first; this machine may be busy
    ARTIFACTS.mkdir(exist_ok=True)
    page.set_viewport_size({"width": 1280, "height": 800})
    page.goto(f"http://127.0.0.1:{lab}/lab/tree/panel.ipynb?reset")
    kernel = page.locator("#jp-main-statusbar .jp-StatusBar-TextItem[title^='Change kernel']")
    expect(kernel).to_contain_text("Idle")
    page.locator(".lm-MenuBar-itemLabel", has_text=re.compile(r"^Run$")).click()
    page.locator(".lm-Menu-itemLabel", has_text=re.compile(r"^Run All Cells$")).click()

    panel = page.locator(".nbtrain-panel")
    expect(panel).to_be_visible()
    status = panel.locator(".nbtrain-status")
    expect(status).to_contain_text("ready: press Run")
    expect(panel.locator(".nbtrain-progress")).to_contain_text("no run yet")
    assert panel.locator("img.nbtrain-live-plot").is_hidden()  # no frame yet: hidden, not a broken image
    assert_fits(page, panel, "the new panel")

    # Tooltips say what a control does, in the option's own word, and the checklist's rule.
    tooltips = panel.evaluate(TOOLTIPS)
    assert [name for name, title in tooltips.items() if not title] == [], tooltips
    assert "(devices)" in tooltips["nbtrain-devices"] and "Checklist:" in tooltips["nbtrain-batch-size"]
    assert tooltips["nbtrain-run"].startswith("Train the live model")
    if not torch.cuda.is_available():  # the kernel runs on this machine: no CUDA there either
        expect(panel.locator(".nbtrain-device-cuda")).to_be_disabled()
        expect(panel.locator(".nbtrain-device-reasons")).to_contain_text("cuda: not available on this machine")
    batch = panel.locator(".nbtrain-batch-size input")
    batch.fill("64")
    batch.press("Enter")
    panel.locator(".nbtrain-precision-bf16-mixed").click()
    expect(panel.locator(".nbtrain-readout")).to_contain_text("global batch 64 = batch 64")
    expect(panel.locator(".nbtrain-readout")).to_contain_text("bf16-mixed on cpu")
    panel.locator(".nbtrain-code-toggle").click()
    expect(panel.locator(".nbtrain-code")).to_contain_text(
        "%%nbtrain --accelerator cpu --precision bf16-mixed --batch-size 64 --max-epochs 1 --base-batch-size 32")
    expect(panel.locator(".nbtrain-code")).to_contain_text("TrainConfig(accelerator='cpu', precision='bf16-mixed'")
    panel.get_by_text("more speed toggles").click()
    expect(panel.locator(".nbtrain-find-unused-parameters")).to_be_visible()
    assert_fits(page, panel, "copy as code, more speed toggles")
    shoot(page, panel, "panel-copy-as-code.png")
    panel.locator(".nbtrain-code-toggle").click()
    panel.get_by_text("more speed toggles").click()

    panel.locator(".nbtrain-run").click()
    expect(status).to_contain_text(re.compile(r"run #1 completed after \d+ steps — [\d,]+ samples/s"))
    page.wait_for_function("() => { const img = document.querySelector('img.nbtrain-live-plot');"
                           " return img !== null && img.naturalWidth > 0; }")
    expect(panel.locator(".nbtrain-progress")).to_contain_text(re.compile(
        r"run #1 completed at step \d+ of \d+ · \d+:\d\d · final loss [\d.]+ · recorded as run #1 in "
        r"\.nbtrain/runs\.sqlite"))  # where the notebook is: no temporary machine path
    assert_fits(page, panel, "after a run")
    shoot(page, panel, "panel-after-run.png")
    open_tab(panel, "runs")
    row = panel.locator(".nbtrain-runs tr[data-run='1'][data-status='completed']")
    expect(row).to_be_visible()
    cells = row.locator("td").all_inner_texts()
    assert cells[:3] == ["#1", "(first run)", "completed"], cells
    assert re.fullmatch(r"[\d,]+( \([\d,]+–[\d,]+\))?( noisy)?", cells[4]), cells  # steady rate (+ interval)
    open_tab(panel, "settings")

    epochs = panel.locator(".nbtrain-max-epochs input")
    epochs.fill("1000")
    epochs.press("Enter")
    expect(panel.locator(".nbtrain-readout")).to_contain_text("1000 epoch(s)")
    before = page.locator("img.nbtrain-live-plot").get_attribute("src")
    panel.locator(".nbtrain-run").click()
    expect(panel.locator(".nbtrain-progress")).to_contain_text(
        re.compile(r"run #2 · step [\d,]+ of [\d,]+ · \d+:\d\d elapsed · about [\d:]+ left · loss"))
    expect(panel.locator(".nbtrain-stop")).to_be_enabled()
    # The live plot draws run #2 while it trains (a new frame), not only when it ends.
    page.wait_for_function("(before) => { const img = document.querySelector('img.nbtrain-live-plot');"
                           " return img !== null && img.src !== before && img.naturalWidth > 0; }", arg=before)
    expect(panel.locator(".nbtrain-stop")).to_be_enabled()  # still running
    page.screenshot(path=str(ARTIFACTS / "jupyterlab-1280x800-while-running.png"))  # what the user sees
    shoot(page, panel, "panel-while-running.png", width=1920)
    panel.locator(".nbtrain-stop").click()
    expect(status).to_contain_text(re.compile(r"run #2 stopped after [\d,]+ of [\d,]+ steps \(epoch \d+"))
    expect(panel.locator(".nbtrain-stop")).to_be_disabled()
    expect(panel.locator(".nbtrain-run")).to_be_enabled()
    # One step count for the stopped run: in the status line, the progress line and the runs table.
    said = number(re.search(r"run #2 stopped after ([\d,]+) of", status.inner_text()).group(1))
    shown = panel.locator(".nbtrain-progress").inner_text()
    assert number(re.search(r"run #2 stopped at step ([\d,]+) of", shown).group(1)) == said, shown
    open_tab(panel, "runs")
    stopped = panel.locator(".nbtrain-runs tr[data-run='2'][data-status='stopped']")
    expect(stopped).to_be_visible()
    assert number(stopped.locator("td").nth(3).inner_text()) == said
    assert stopped.locator("td").nth(1).inner_text() == "max_epochs=1000"
    expect(panel.locator(".nbtrain-compare-summary")).to_contain_text("#2 vs #1: max_epochs=1000")
    page.wait_for_function("() => { const img = document.querySelector('img.nbtrain-compare-plot');"
                           " return img !== null && img.naturalWidth > 0; }")
    panel.locator(".nbtrain-runs-details").click()
    expect(panel.locator(".nbtrain-runs tr.nbtrain-run-details[data-run='2']")).to_contain_text("global batch 64")
    assert_fits(page, panel, "the runs tab")
    shoot(page, panel, "panel-runs-tab.png")
    shoot(page, panel, "panel-runs-tab-1920.png", width=1920)
    open_tab(panel, "tools")
    expect(panel.locator(".nbtrain-tool-profile")).to_be_visible()
    assert panel.locator("img.nbtrain-tool-plot").is_hidden()  # no tool has run: no image, no broken icon
    assert_fits(page, panel, "the tools tab")
    panel.locator(".nbtrain-tool-profile").click()
    expect(status).to_contain_text("Bottleneck breakdown done")
    page.wait_for_function("() => { const img = document.querySelector('img.nbtrain-tool-plot');"
                           " return img !== null && img.naturalWidth > 0; }")
    assert_fits(page, panel, "the tools tab with the bottleneck breakdown")
    shoot(page, panel, "panel-tools-tab.png")
    open_tab(panel, "settings")
    shoot(page, panel, "panel-after-stop-1920.png", width=1920)
    page.set_viewport_size({"width": 1920, "height": 1080})
    page.wait_for_timeout(400)
    page.screenshot(path=str(ARTIFACTS / "jupyterlab-1920x1080.png"))


# Every 100 ms while the cell runs, in the page: whether its prompt still shows [*], and which image it shows
# (the data URL's length and tail tell two PNGs apart).
WATCH_FRAMES = """(cell) => { window.nbtrainFrames = []; window.nbtrainWatch = setInterval(() => {
  const img = cell.querySelector('.jp-OutputArea-output img');
  const prompt = cell.querySelector('.jp-InputPrompt').textContent;
  window.nbtrainFrames.push([performance.now(), prompt.includes('*'), img ? img.src.length + img.src.slice(-64) : null]);
}, 100); }"""


def test_a_magic_cells_live_plot_is_redrawn_about_once_a_second_while_the_run_goes_on(lab, page):
    from playwright.sync_api import expect
    expect.set_options(timeout=60_000)
    ARTIFACTS.mkdir(exist_ok=True)
    page.goto(f"http://127.0.0.1:{lab}/lab/tree/magic.ipynb?reset")
    kernel = page.locator("#jp-main-statusbar .jp-StatusBar-TextItem[title^='Change kernel']")
    expect(kernel).to_contain_text("Idle")
    cell = page.locator(".jp-Notebook .jp-CodeCell").nth(1)
    cell.evaluate(WATCH_FRAMES)
    page.locator(".lm-MenuBar-itemLabel", has_text=re.compile(r"^Run$")).click()
    page.locator(".lm-Menu-itemLabel", has_text=re.compile(r"^Run All Cells$")).click()
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
    samples = page.evaluate("() => { clearInterval(window.nbtrainWatch); return window.nbtrainFrames; }")
    running = [(t / 1000, image) for t, busy, image in samples if busy]
    shown = [(t, image) for t, image in running if image is not None]  # (an output re-rendered: no image a moment)
    changes = [t for (t, image), (_, before) in zip(shown, [(None, None)] + shown[:-1]) if image != before]
    # About a frame a second (one every 4 s was the bug), counted from the first frame to the run's end (the
    # kernel's start, the imports and the data before it are not the plot's): at least one per 1.4 s, and never
    # under 5. Measured beside other sessions' work (load 10-13 on 2 cores): one per 0.9-1.1 s; main before
    # issue 54 one per 1.7-1.9 s there (its frames waited a second after each draw ended).
    drawing_s = running[-1][0] - changes[0]
    print(f"live plot: {len(changes)} frames in the {drawing_s:.1f} s from the first to the run's end, at "
          + ", ".join(f"{t - running[0][0]:.1f}" for t in changes)
          + f" s; the cell ran {running[-1][0] - running[0][0]:.1f} s")
    assert len(changes) >= max(5, 1 + drawing_s / 1.4), \
        f"the live plot changed {len(changes)} times in the {drawing_s:.1f} s from its first frame to the run's end"
