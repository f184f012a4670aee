"""The shard graph as a person sees it: ``sp.visualize`` serves it, headless Chromium opens Model Explorer on it, and
the page shows the stage groups and a drawn graph. Screenshots go to ``tmp_path`` and, with
``SHARDPROP_SCREENSHOTS=<dir>``, to ``<dir>/viewer-nx-example.png`` and ``<dir>/viewer-transformer-step.png``."""

import io

import pytest
from PIL import Image

import shardprop as sp
from tests.browser import keep_screenshot, launch_chromium, sync_playwright
from tests.inspection.viewer_programs import program

pytest.importorskip("model_explorer")


@pytest.fixture(scope="module")
def browser():
    with sync_playwright()() as playwright:
        launched = launch_chromium(playwright)
        yield launched
        launched.close()


PICTURES = [("nx", "viewer-nx-example.png"), ("transformer", "viewer-transformer-step.png")]


@pytest.mark.site
@pytest.mark.parametrize("name,picture", PICTURES)
def test_the_viewer_shows_the_stages(name, picture, browser, tmp_path):
    prog = program(name)
    stages = [f"stage {stage.id}" for stage in prog.stages]
    with sp.visualize(prog, open_browser=False, block=False, directory=tmp_path / "served") as viewer:
        page = browser.new_page(viewport={"width": 1400, "height": 900})
        page.goto(viewer.url)
        # the side panel lists the top-level nodes and groups once the graph is laid out and drawn
        stats = page.get_by_text("Root-level nodes stats")
        stats.wait_for(timeout=30_000)
        for stage in stages:
            page.get_by_role("cell", name=stage, exact=True).first.wait_for(timeout=30_000)
        panel = page.inner_text("body")
        assert "NODE DATA PROVIDERS" in panel.upper() and "bytes moved" in panel and "layout" in panel
        assert "mesh" in panel and "i=4, j=2" in panel          # the graph's attributes, in the side panel
        page.locator("mat-icon", has_text="unfold_more_double").first.click()  # the toolbar's "expand all layers"
        page.wait_for_timeout(1500)
        page.locator("mat-icon", has_text="fit_screen").first.click()
        page.mouse.move(700, 800)  # away from the toolbar: no tooltip in the picture
        page.wait_for_timeout(1000)
        shot = tmp_path / picture
        page.screenshot(path=str(shot))
        canvas = page.locator("canvas").first.screenshot()
        page.close()
    colours = Image.open(io.BytesIO(canvas)).convert("RGB").getcolors(maxcolors=1 << 20)
    assert len(colours) > 10  # a drawn graph: groups, nodes, edges and text, not a blank canvas
    assert viewer.process.poll() is not None  # stopped on leaving the block
    keep_screenshot(shot)
