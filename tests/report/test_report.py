"""The report stage: figures embedded, manifests linked, and the page drawn by a real browser."""

import base64
import re
import shutil
import subprocess

import matplotlib.image
import pytest
from edgedistill.common import manifest as mf
from edgedistill.common import summary
from edgedistill.common.recipe import load_recipe, run_dir
from edgedistill.common.stage import Built, Stage
from edgedistill.report import render
from edgedistill.report.__main__ import main as report_main
from edgedistill.report.render import finished_stages, stage

from tests.conftest import ROOT, run_module

pytestmark = pytest.mark.slow


def render_report():
    """Run the report stage on the smoke run (EDGEDISTILL_RUNS_DIR set by the test); its folder."""
    report = stage(load_recipe(ROOT / "recipes" / "smoke.yaml"))
    report.run()
    return report.folder


def test_report_embeds_its_figures_and_links_manifests(smoke_bundles, monkeypatch):
    for command in ("models", "serving"):  # no-ops if up to date
        bench = run_module("bench", smoke_bundles.parent, command, str(ROOT / "recipes" / "smoke.yaml"))
        assert bench.returncode == 0, bench.stderr[-2000:]
    monkeypatch.setenv("EDGEDISTILL_RUNS_DIR", str(smoke_bundles.parent))
    out = render_report()
    page = (out / "index.html").read_text()
    images = re.findall(r'src="data:image/png;base64,([^"]+)"', page)
    assert len(images) >= 2
    assert all(base64.b64decode(i).startswith(b"\x89PNG") for i in images)
    assert 'href="../teacher/manifest.json"' in page
    assert 'href="../student-bilstm/manifest.json"' in page
    markdown = (out / "report.md").read_text()
    for name in re.findall(r"\(figures/([^)]+)\)", markdown):
        assert (out / "figures" / name).read_bytes().startswith(b"\x89PNG")
    assert "| bilstm | bilstm |" in markdown
    assert "## Per label (dev)" in markdown
    left_out = mf.load(smoke_bundles / "bench").info["left_out"]
    assert left_out  # the smoke recipe names GPU bundles this machine cannot time
    for bundle_id, why in left_out.items():
        assert f"| {bundle_id} | {why} |" in markdown
    assert "## Serving benchmark of the deployed bundle, bundle-bilstm-int8" in markdown
    assert "[../serve-bench-bilstm-int8/manifest.json]" in markdown
    assert (smoke_bundles / "serve-bench-bilstm-int8" / "bench.md").read_text() in markdown
    assert mf.load(out).stage == "report"


def test_report_rewrites_the_card_of_each_model_of_the_run_with_the_benchmarks_latency(smoke_bundles, monkeypatch):
    bench = run_module("bench", smoke_bundles.parent, "models", str(ROOT / "recipes" / "smoke.yaml"))  # if not yet
    assert bench.returncode == 0, bench.stderr[-2000:]
    monkeypatch.setenv("EDGEDISTILL_RUNS_DIR", str(smoke_bundles.parent))
    render_report()
    assert "## Latency" in (smoke_bundles / "bundle-bilstm-int8" / mf.CARD).read_text(encoding="utf-8")


PROBE = """<script>
window.addEventListener("load", () => {
  const images = [...document.images];
  const drawn = images.filter((img) => img.complete && img.naturalWidth > 0).length;
  document.title = `images ${drawn}/${images.length}`;
});
</script>"""


def chromium(*args: str) -> subprocess.CompletedProcess:
    binary = shutil.which("chromium") or shutil.which("chromium-browser")
    assert binary, "Chromium is needed to check the report renders: apt-get install chromium (Debian)"
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--hide-scrollbars"]
    return subprocess.run([binary, *flags, *args], capture_output=True, text=True, timeout=120, check=True)


def test_report_renders_in_headless_chromium_with_every_image(smoke_bundles, monkeypatch, tmp_path):
    monkeypatch.setenv("EDGEDISTILL_RUNS_DIR", str(smoke_bundles.parent))
    out = render_report()
    probed = tmp_path / "probed.html"
    probed.write_text((out / "index.html").read_text().replace("</body>", PROBE + "</body>"))
    dom = chromium("--virtual-time-budget=5000", "--dump-dom", probed.as_uri()).stdout
    drawn, total = map(int, re.search(r"<title>images (\d+)/(\d+)</title>", dom).groups())
    assert total >= 2, f"{drawn} of {total} images decoded"
    assert drawn == total, f"{drawn} of {total} images decoded"

    shot = tmp_path / "report.png"
    chromium("--window-size=1200,1600", f"--screenshot={shot}", (out / "index.html").as_uri())
    pixels = matplotlib.image.imread(shot)
    assert pixels.shape[:2] == (1600, 1200)
    assert pixels[..., :3].std() > 0.05, "the screenshot is blank"


def test_command_line_needs_a_recipe_and_refuses_a_missing_one(capsys):
    with pytest.raises(SystemExit) as exit_info:
        report_main([])
    assert exit_info.value.code == 2
    assert report_main(["recipes/no-such.yaml"]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_an_override_of_a_section_the_report_does_not_read_is_refused_naming_it(capsys):
    report_main([str(ROOT / "recipes" / "smoke.yaml"), "--runtime.device=cpu"])
    assert "error: --runtime.device: python -m report reads no runtime setting" in capsys.readouterr().err


def test_the_report_leaves_out_what_a_killed_publish_left():
    recipe = load_recipe(ROOT / "recipes" / "smoke.yaml")
    notes = Stage("notes", recipe, ("data",), lambda _: Built(lambda folder: (folder / "a.txt").write_text("x")))
    notes.run()
    shutil.copytree(notes.folder, notes.folder.with_name(".notes.tmp-999"))  # as a kill -9 mid-publish leaves it
    assert finished_stages(recipe) == [notes.folder]


def test_a_report_rendered_by_another_release_is_not_current(monkeypatch):
    recipe = load_recipe(ROOT / "recipes" / "smoke.yaml")
    Stage("notes", recipe, ("data",), lambda _: Built(lambda folder: (folder / "a.txt").write_text("x"))).run()
    stage(recipe).run()
    monkeypatch.setattr(render.metadata, "version", lambda name: "99.0")
    assert not stage(recipe).is_current()


def test_a_report_of_another_deployed_bundle_is_not_current():
    recipe = load_recipe(ROOT / "recipes" / "smoke.yaml")
    Stage("notes", recipe, ("data",), lambda _: Built(lambda folder: (folder / "a.txt").write_text("x"))).run()
    stage(recipe).run()
    other = load_recipe(ROOT / "recipes" / "smoke.yaml", {"export.deploy": "cnn-int8"})
    assert not stage(other).is_current()


def test_a_report_rendered_without_overrides_is_not_current_for_a_command_given_some():
    recipe = load_recipe(ROOT / "recipes" / "smoke.yaml")
    Stage("notes", recipe, ("data",), lambda _: Built(lambda folder: (folder / "a.txt").write_text("x"))).run()
    stage(recipe).run()
    assert not stage(recipe, ["--export.deploy=bilstm-int8"]).is_current()  # the recipe's own value: its commands


def test_a_report_is_not_current_once_the_distillation_table_is_written_again():
    recipe = load_recipe(ROOT / "recipes" / "smoke.yaml")
    Stage("notes", recipe, ("data",), lambda _: Built(lambda folder: (folder / "a.txt").write_text("x"))).run()
    summary.write(run_dir(recipe), [{"student": "teacher", "dev_accuracy": 0.9}])
    stage(recipe).run()
    summary.write(run_dir(recipe), [{"student": "teacher", "dev_accuracy": 0.95}])  # edgedistill distill --only A
    assert not stage(recipe).is_current()
