import base64
import re

import pytest

from common import manifest as mf
from common.recipe import load_recipe
from report.render import build
from tests.conftest import ROOT

pytestmark = pytest.mark.slow


def test_report_embeds_its_figures_and_links_manifests(smoke_bundles, monkeypatch):
    monkeypatch.setenv("RUNS_DIR", str(smoke_bundles.parent))
    out = build(load_recipe(ROOT / "recipes" / "smoke.yaml"))
    page = (out / "index.html").read_text()
    images = re.findall(r'src="data:image/png;base64,([^"]+)"', page)
    assert len(images) >= 2
    assert all(base64.b64decode(i).startswith(b"\x89PNG") for i in images)
    assert 'href="../teacher/manifest.json"' in page and 'href="../student-bilstm/manifest.json"' in page
    markdown = (out / "report.md").read_text()
    for name in re.findall(r"\(figures/([^)]+)\)", markdown):
        assert (out / "figures" / name).read_bytes().startswith(b"\x89PNG")
    assert "| bilstm | bilstm |" in markdown
    assert mf.load(out).stage == "report"
