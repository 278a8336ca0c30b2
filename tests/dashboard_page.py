"""Reading the dashboard's page in a browser (tests/swarm/test_dashboard.py): its legends, its empty charts, its
unexplained labels, and a screenshot of the whole page. Each read is one script: the page redraws at every refresh,
so an element found in one call and read in the next may be gone.
"""

from __future__ import annotations


def legend_values(driver, chart: str) -> dict:
    """A chart's legend as the page shows it with the cursor off the chart: series label → value text."""
    return driver.execute_script("""
        const out = {};
        for (const tr of document.querySelectorAll(`#${arguments[0]} .u-legend .u-series`)) {
          const label = tr.querySelector(".u-label"), value = tr.querySelector(".u-value");
          if (label && value) out[label.textContent] = value.textContent;
        }
        return out;""", chart)


def losses_side_by_side(driver) -> dict:
    """Each path's "last round's loss" in the table and its value in the loss chart's legend, read in one script (a
    refresh redraws both)."""
    return driver.execute_script("""
        const out = {};
        for (const tr of document.querySelectorAll("#paths tbody tr")) {
          out["path " + tr.firstChild.textContent] = [tr.querySelector('[data-field="round-loss"]').textContent];
        }
        for (const tr of document.querySelectorAll("#loss-chart .u-legend .u-series")) {
          const label = tr.querySelector(".u-label");
          if (label && out[label.textContent]) out[label.textContent].push(tr.querySelector(".u-value").textContent);
        }
        return out;""")


def unexplained(driver) -> list[str]:
    """Labels without an explanation: every term (dt) and column or row header (th) needs a title, its tooltip
    (uPlot's own legend rows excepted)."""
    return driver.execute_script("return [...document.querySelectorAll('dt, th')].filter(e => !e.closest('.u-legend')"
                                 " && !(e.title || '').trim()).map(e => e.textContent)")


def empty_charts(driver) -> dict:
    """Chart id → the message shown in its place, for charts drawn empty (no uPlot canvas)."""
    return driver.execute_script("""
        const out = {};
        for (const box of document.querySelectorAll(".chart")) {
          const p = box.querySelector(".empty");
          if (p && !box.querySelector("canvas")) out[box.id] = p.textContent;
        }
        return out;""")


def save_screenshot(driver, path) -> None:
    """The whole page as a small PNG (a 128-colour palette keeps it well under 300 KB)."""
    from PIL import Image

    height = driver.execute_script("return document.documentElement.scrollHeight")
    driver.set_window_size(1280, min(max(height + 200, 800), 4000))  # a margin: the viewport is shorter
    raw = path.with_suffix(".raw.png")
    driver.save_screenshot(str(raw))
    with Image.open(raw) as im:
        im.convert("RGB").quantize(colors=128).save(path, optimize=True)
    raw.unlink()
