"""`make report`: one HTML page (figures embedded) and its markdown twin from a recipe's run folder.

Every section names the manifests it was drawn from; sections whose stage has not run are left out.
"""

import base64
import html
import re
from collections.abc import Sequence
from functools import partial
from importlib import metadata
from pathlib import Path

import numpy as np
from edgedistill.bench.records import Cell, ModelRow, ModelTable, cut_note
from edgedistill.common import manifest as mf
from edgedistill.common import measured, modelcard, sections, summary, tables
from edgedistill.common.config.training import METRIC_NAMES, Metric
from edgedistill.common.recipe import Recipe, run_dir
from edgedistill.common.scores import label_f1
from edgedistill.common.stage import Artifact, Built, Inputs, Stage
from edgedistill.loadtests import result as loadtest_result
from edgedistill.loadtests.analysis import Samples
from edgedistill.loadtests.recorder import SAMPLES_FILE
from edgedistill.report import plan, plots


def _finished(folder: Path) -> bool:
    return (folder / mf.MANIFEST).is_file()


def finished_stages(recipe: Recipe) -> list[Path]:
    """The run's finished artifact folders, the report's own left out; `ArtifactError` when there are none yet."""
    root = run_dir(recipe)
    folders = [p for p in mf.finished(root) if p.name != "report"]
    if not folders:
        raise mf.ArtifactError(
            f"{root} holds no finished stage of recipe {recipe.name!r} yet: run its stages first (make all RECIPE=..., "
            "or edgedistill all RECIPE)"
        )
    return folders


class Page:
    """Collects sections as (markdown, html) pairs and figures as PNG files."""

    def __init__(self, title: str):
        self.title, self.md, self.html, self.figures = title, [f"# {title}", ""], [], {}

    def heading(self, text: str, sources: list[str]) -> None:
        links = ", ".join(f"[{s}]({s})" for s in sources)
        self.md += [f"## {text}", "", *([f"From {links}.", ""] if sources else [])]
        anchors = ", ".join(f'<a href="{html.escape(s)}">{html.escape(s)}</a>' for s in sources)
        self.html.append(f"<h2>{html.escape(text)}</h2>" + (f'<p class="src">From {anchors}.</p>' if sources else ""))

    def note(self, text: str) -> None:
        self.md += [text, ""]
        self.html.append(f"<p>{html.escape(text)}</p>")

    def items(self, lines: list[str]) -> None:
        """A bulleted list of `lines`."""
        self.md += [*(f"- {line}" for line in lines), ""]
        self.html.append("<ul>" + "".join(f"<li>{html.escape(line)}</li>" for line in lines) + "</ul>")

    def figure(self, name: str, data: bytes, alt: str) -> None:
        self.figures[name] = data
        self.md += [f"![{alt}](figures/{name})", ""]
        encoded = base64.b64encode(data).decode()
        self.html.append(f'<img alt="{html.escape(alt)}" src="data:image/png;base64,{encoded}">')

    def table(self, header: list[str], rows: list[list]) -> None:
        cells = [[tables.cell(c) for c in row] for row in rows]
        self.md += [*tables.markdown(header, cells), ""]
        head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
        body = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>" for row in cells)
        self.html.append(f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>")

    def render_html(self) -> str:
        style = (
            "body{font-family:sans-serif;max-width:1100px;margin:2em auto;color:#222}"
            "table{border-collapse:collapse;margin:1em 0;font-size:13px}td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}"
            "th{background:#f0f0f0}img{max-width:100%;margin:0.5em 0}.src{color:#666;font-size:12px}"
        )
        return (
            f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(self.title)}</title>"
            f"<style>{style}</style></head><body><h1>{html.escape(self.title)}</h1>{''.join(self.html)}</body></html>"
        )


def _stages(page: Page, root: Path, recipe: Recipe, stale: dict[str, plan.Stale]) -> None:
    """Each finished stage's dev figures (and test figures, where a manifest carries them), size and wall time; not
    the figures of a model `stale` names, built with other settings than the recipe's, or a bundle of a student or
    teacher built again since."""
    folders = [p for p in mf.finished(root) if p.name != "report"]
    page.heading("Stages", [f"../{p.name}/{mf.MANIFEST}" for p in folders])
    metrics = {folder.name: mf.load(folder, verify=False).metrics for folder in folders}
    keys = recipe.data.figure_keys(test=any("test_accuracy" in m for m in metrics.values()))
    rows, left_out = [], []
    for folder in folders:
        m = metrics[folder.name]
        if folder.name in stale and any(key in m for key in keys):
            left_out.append(folder.name)
            m = {name: value for name, value in m.items() if name not in keys}
        rows.append(
            [
                folder.name,
                *(f"{m[key]:.4f}" if m.get(key) is not None else None for key in keys),
                f"{m['params'] / 1e6:.2f}M" if "params" in m else None,
                f"{m['size_bytes'] / 2**20:.1f}" if "size_bytes" in m else None,
                f"{m['wall_seconds'] / 60:.1f}" if "wall_seconds" in m else None,
            ]
        )
    page.table(["stage", *(key.replace("_", " ") for key in keys), "params", "size MiB", "wall min"], rows)
    if left_out:
        page.note(
            f"Dev and test figures not shown of {', '.join(left_out)}: built with other settings than the recipe's "
            "now (or from a model that was), or from a student or teacher built again since, as named below with the "
            "command that builds it again."
        )


RERUN = ("built or measured by", "in a checkout")  # the columns `_rerun` fills
RECIPE = "RECIPE.yaml"  # the report is an artifact of the recipe's contents: what its file is called is not known
RECIPE_NOTE = (
    f"{RECIPE} stands for the run's recipe file, followed by the overrides `edgedistill report` was given "
    "(`--section.key=value`), if any, in each command that reads their section (`edgedistill COMMAND --help` names "
    "them); make takes none, so a report given some names no make command"
)


def _rerun(targets: tuple[plan.Target, ...], overrides: Sequence[str]) -> list[str]:
    """The cells of `RERUN` for `targets`: the edgedistill commands, and how in a checkout (`_in_checkout`)."""
    return [plan.command_line(targets, RECIPE), _in_checkout(targets, overrides)]


def _in_checkout(targets: tuple[plan.Target, ...], overrides: Sequence[str]) -> str:
    """The make command line that runs `targets` in a checkout; none for a report given recipe `overrides`, which make
    passes to no target, whose prerequisites would build again without them."""
    return "none: make takes no recipe overrides" if overrides else plan.make_line(targets, RECIPE)


def _missing(page: Page, root: Path, recipe: Recipe, overrides: Sequence[str] = ()) -> None:
    finished = {p.name for p in root.iterdir() if _finished(p)}
    absent = plan.missing(recipe, finished)
    if absent:
        page.heading("Not in this report", [])
        page.note(
            "Stages of edgedistill all (make all in a checkout) with no finished artifact in this run: not run yet, "
            f"failed, or not buildable on the machine that ran it (a GPU bundle on a CPU machine). {RECIPE_NOTE}."
        )
        page.table(["stage", *RERUN], [[name, *_rerun((target,), overrides)] for name, target in absent.items()])
        if here := [[name, why] for name in absent if (why := plan.not_buildable_here(recipe, name))]:
            page.note(
                "Of these, this machine cannot build or measure the following (the commands above leave them out):"
            )
            page.table(["stage", "why not here"], here)


def _unkeyed(page: Page, root: Path) -> None:
    """Results of older releases, one folder whatever bundle was measured: named, not shown as the deployed one's."""
    older = [name for name in measured.MEASUREMENTS if _finished(root / name)]
    if older:
        page.heading("Not shown: results of an older release", [f"../{name}/{mf.MANIFEST}" for name in older])
        page.note(
            "These folders hold one result whatever bundle was measured, as releases before one folder per bundle "
            "wrote them: the report shows the deployed bundle's own (`<measurement>-<bundle id>`) alone. Measure it "
            "again (edgedistill all RECIPE, or the benchmark's command; make all in a checkout), then remove these "
            "folders."
        )
        page.table(["folder"], [[name] for name in older])


def _stale(page: Page, recipe: Recipe, stale: dict[str, plan.Stale], overrides: Sequence[str] = ()) -> None:
    """Models built with other settings than the recipe's and measurements taken before what they measured was built
    again (`stale`): named, not shown as current."""
    if stale:
        page.heading(
            "Not shown: figures of other settings or of an earlier build",
            [f"../{folder}/{mf.MANIFEST}" for folder in dict.fromkeys(left_out.folder for left_out in stale.values())],
        )
        deployed = f"{_deployed(recipe)}, " if recipe.export is not None else ""
        page.note(
            "A model named here was built with other settings than the recipe's now (the recipe was edited and the "
            "model not built again), or from a model that was, or a bundle named here from a student or teacher built "
            f"again since; or what a measurement named here measured ({deployed}a cascade, or a model of the model "
            "benchmark or the teacher its speedups are against) was built again, or is gone, since it ran: their "
            "figures are not of the recipe and the artifacts now in the run. Build and measure them again with the "
            f"commands named ({RECIPE_NOTE}); a run built with overrides on the command line "
            "(`--finetune.optim.lr=...`) shows its figures when `edgedistill report` is given the same overrides."
        )
        page.table(
            ["not shown", "why", *RERUN],
            [[name, left_out.why, *_rerun(left_out.targets, overrides)] for name, left_out in stale.items()],
        )


def _trained(root: Path, stale: dict[str, plan.Stale]) -> list[Path]:
    """The finished teacher, students and baselines, in that order, but those `stale` names."""
    folders = [root / "teacher", *sorted(root.glob("student-*")), *sorted(root.glob("baseline-*"))]
    return [p for p in folders if _finished(p) and p.name not in stale]


def _curves(page: Page, root: Path, recipe: Recipe, stale: dict[str, plan.Stale]) -> None:
    """The training curves of the finished teacher, students and baselines, not of those `stale` names."""
    folders = _trained(root, stale)
    histories = {p.name: plots.read_json(p / "history.json") for p in folders if (p / "history.json").is_file()}
    if histories:
        key = recipe.data.selection_key
        page.heading("Training curves", [f"../{name}/{mf.MANIFEST}" for name in histories])
        page.figure("training.png", plots.training_curves(histories, key), f"training loss and {key.replace('_', ' ')}")


def _distill_table(page: Page, rows: list[dict], root: Path, recipe: Recipe) -> None:
    """The distillation table's `rows` as written in the run folder `root`, with what its columns compare."""
    key = recipe.data.selection_key
    columns = list(rows[0])  # the table's own: the recipe's metric, and test figures where there are some
    stale = (
        " out_of_date: a student or baseline built from other settings or another teacher or transfer set than "
        "the recipe's when the table was written, its figures left out (edgedistill distill RECIPE --only NAME "
        "rebuilds it)."
    )
    page.note(
        f"Checkpoints are selected on {key}; retention (student / teacher), baseline and gain compare {key}. "
        "baseline_from: where the label-only baseline started (scratch, or teacher: its layers or embeddings)."
        + (stale if "out_of_date" in columns else "")
        + (f" {unlearnt}." if (unlearnt := summary.one_label_note(root, rows)) else "")
    )
    page.table(columns, [[r[c] for c in columns] for r in rows])


def _distillation(
    page: Page, root: Path, recipe: Recipe, stale: dict[str, plan.Stale], overrides: Sequence[str] = ()
) -> None:
    """The distillation table, unless it is not of the artifacts now in the run or shows a model `stale` names
    (built with other settings than the recipe's now); the transfer set's composition."""
    if (rows := summary.load(root)) is not None:
        folders = ["teacher"] + [f"{kind}-{r['student']}" for r in rows[1:] for kind in ("student", "baseline")]
        page.heading("Distillation", [f"../{f}/{mf.MANIFEST}" for f in folders if _finished(root / f)])
        if change := summary.change(root) or next((stale[f].why for f in folders if f in stale), None):
            page.note(
                f"Not shown: the table the last distill stage wrote ({summary.FILE}) is not of the artifacts now "
                f"in the run and the recipe's settings ({change}). {plan.command_line(plan.DISTILL, RECIPE)} "
                f"builds the students out of date again and writes it again (in a checkout: "
                f"{_in_checkout(plan.DISTILL, overrides)}; {RECIPE_NOTE})."
            )
        else:
            _distill_table(page, rows, root, recipe)
    if _finished(root / "transfer"):
        page.heading("Transfer set", [f"../transfer/{mf.MANIFEST}"])
        info = mf.load(root / "transfer", verify=False).info
        unit = "pairs" if info["pairs"] else "sentences"
        page.figure("transfer.png", plots.composition(info["composition"], unit), "transfer set composition")


def _per_class(page: Page, root: Path, recipe: Recipe, stale: dict[str, plan.Stale]) -> None:
    """Each label's dev F1 and the confusion matrices of the finished teacher, students and baselines, not of those
    `stale` names."""
    names = recipe.data.label_names
    matrices = {}
    for folder in _trained(root, stale):
        confusion = mf.load(folder, verify=False).metrics.get("dev_confusion")
        if confusion is not None and np.shape(confusion) == (len(names), len(names)):
            matrices[folder.name] = np.asarray(confusion)
    if not matrices:
        return
    page.heading("Per label (dev)", [f"../{name}/{mf.MANIFEST}" for name in matrices])
    page.note(
        "Each label's F1 at the selected checkpoint (-: a label neither in dev nor predicted). The matrices give "
        "each gold label's share predicted as each label, with counts."
    )
    scores = {name: label_f1(m) for name, m in matrices.items()}
    support = next(iter(matrices.values())).sum(1)
    page.table(
        ["label", "dev examples", *(f"{name} F1" for name in matrices)],
        [
            [label, int(support[i]), *(f"{f1[i]:.4f}" if seen[i] else None for f1, seen in scores.values())]
            for i, label in enumerate(names)
        ],
    )
    shown = {name: m for name, m in matrices.items() if not name.startswith("baseline-")}
    if shown:  # baselines alone (the teacher and students predate dev_confusion): their table, no figure
        page.figure("confusion.png", plots.confusion(shown, names), "dev confusion matrices")


def _cascade_section(page: Page, root: Path, stale: dict[str, plan.Stale]) -> None:
    """Each cascade's members and figures, not of those `stale` names (built with other settings)."""
    for folder in (p for p in plan.cascades(root) if p.name not in stale):
        manifest = mf.load(folder, verify=False)
        m, info = manifest.metrics, manifest.info
        page.heading(f"Cascade {folder.name.removeprefix('bundle-')}", [f"../{folder.name}/{mf.MANIFEST}"])
        page.table(*modelcard.cascade_members(info))
        page.table(
            ["cascade dev accuracy", "escalated (dev)", "expected (calibration)", "calibration agreement"],
            [
                [
                    f"{m['dev_accuracy']:.4f}",
                    f"{m['dev_escalated']:.1%}",
                    f"{m['expected_escalated']:.1%}",
                    f"{m['calibration_agreement']:.4f}",
                ]
            ],
        )
        chosen = {"escalated": m["dev_escalated"], "dev_accuracy": m["dev_accuracy"]}
        name = folder.name.removeprefix("bundle-")
        figure = plots.cascade_curve(name, info["curve"], chosen, info["member_dev_accuracy"])
        page.figure(f"{folder.name}.png", figure, "cascade accuracy against escalation")


def _cascade_points(
    root: Path, rows: list[ModelRow], batch: int, length: int, metric: Metric, stale: dict[str, plan.Stale]
) -> list[dict]:
    """Cascades on the latency figure at their expected model time (each member's time at the cell, among the
    benchmark's `rows`, times the share of dev texts that reach it), with their dev `metric`; not those `stale`
    names, as a cascade (built with other settings) or as a point (`plan.cascade_point`)."""
    timed = {r.model: r for r in rows}
    points = []
    for folder in plan.cascades(root):
        if folder.name in stale or plan.cascade_point(measured.bundle_id(folder)) in stale:
            continue
        manifest = mf.load(folder, verify=False)
        members = [m["bundle"] for m in manifest.info["cascade"]["members"]]
        if any(member not in timed for member in members):
            continue
        shares = [manifest.info["dev_answered_share"][member] for member in members]
        reaching = [1 - sum(shares[:i]) for i in range(len(members))]
        points.append(
            {
                "model": folder.name.removeprefix("bundle-") + " (expected)",
                "latency_ms": sum(
                    r * timed[m].cell(batch, length).median_ms for m, r in zip(members, reaching, strict=True)
                ),
                "dev": manifest.metrics[f"dev_{metric}"],
                "size_mib": sum(timed[m].size_bytes for m in members) / 2**20,
            }
        )
    return points


def _pareto_label(model: str, cell: Cell) -> str:
    """A model's label on the accuracy-latency figure, with the length it was timed at where it cut the cell's."""
    return f"{model} ({cell.timed_length} tokens)" if cell.cut else model


def _benchmark(page: Page, root: Path, stale: dict[str, plan.Stale], overrides: Sequence[str] = ()) -> None:
    """The model benchmark's table and accuracy-latency figure, without the rows `stale` names."""
    if not _finished(root / "bench"):
        return
    table = ModelTable.load(root / "bench")
    rows = plan.bench_rows(table, stale)
    if not rows:
        return
    labels = [cell.label for cell in rows[0].cells]
    page.heading("Benchmark (latency ms, median; speedup vs teacher PyTorch eager)", [f"../bench/{mf.MANIFEST}"])
    page.table(
        ["model", "precision", "size MiB", *table.dev_columns(), *labels],
        [
            [r.model, r.precision, f"{r.size_bytes / 2**20:.1f}", *table.dev_figures(r)]
            + [f"{c.median_ms:.2f} ({c.versus})" for c in r.cells]
            for r in rows
        ],
    )
    if note := cut_note(rows):
        page.note(note)
    info = mf.load(root / "bench", verify=False).info
    targets = (plan.Target("bundles"), plan.Target("bench"))
    again = f"{plan.command_line(targets, RECIPE)}; in a checkout: {_in_checkout(targets, overrides)}"
    not_built = {b: f"not built when the benchmark ran ({again}; {RECIPE_NOTE})" for b in info["missing_bundles"]}
    if left_out := info["left_out"] | not_built:
        page.table(["not timed on this machine", "why"], [[b, why] for b, why in left_out.items()])
    batch, length = plan.figure_cell(table)
    # The selection metric where every model has it (bundles built before they recorded it have accuracy only)
    metric = table.metric if all(r.dev_selected is not None for r in rows) else "accuracy"
    points = [
        {
            "model": _pareto_label(r.model, r.cell(batch, length)),
            "latency_ms": r.cell(batch, length).median_ms,
            "dev": r.dev_accuracy if metric == "accuracy" else r.dev_selected,
            "size_mib": r.size_bytes / 2**20,
        }
        for r in rows
    ] + _cascade_points(root, rows, batch, length, metric, stale)
    shown = METRIC_NAMES[metric]
    page.figure(
        "pareto.png", plots.pareto(points, f"batch {batch}, {length} tokens", shown), f"{shown} against latency"
    )


PER_BUNDLE = {  # measurement kept one folder per bundle -> the section's title and the stage's own tables (markdown)
    measured.SERVING: ("Serving benchmark", "bench.md"),
    measured.ACCURACY: ("Served accuracy", "accuracy.md"),
    measured.PEERS: ("Peer comparison", "bench.md"),
    measured.SCALING: ("Scaling with worker processes", "bench.md"),
}


def _deployed(recipe: Recipe) -> str:
    """How a section names the bundle it shows: the deployed one, `export.deploy`."""
    return f"the deployed bundle, bundle-{recipe.export.deploy}"


def _served(recipe: Recipe) -> dict[str, tuple[str, str]]:
    """Folder -> the section's title and the stage's own tables (markdown), shown as written. Of the measurements
    kept one per bundle, the deployed bundle's, under a title that names it; the serving benchmark of each of the
    recipe's cascades."""
    served = {}
    if recipe.export is not None:
        for measurement, (title, written) in PER_BUNDLE.items():
            served[plan.deployed(recipe, measurement)] = (f"{title} of {_deployed(recipe)}", written)
        cascades = recipe.export.cascades
        served |= {measured.folder_name(measured.CASCADE, name): ("Cascade served", "cascade.md") for name in cascades}
    return served


def _serving(page: Page, root: Path, recipe: Recipe, stale: dict[str, plan.Stale]) -> None:
    for name, (title, written) in _served(recipe).items():
        folder = root / name
        if not _finished(folder) or name in stale:
            continue
        if name == plan.deployed(recipe, measured.ACCURACY):  # its verdict in the title, as a load test's SLO
            same = mf.load(folder, verify=False).metrics.get("passed", True)  # recorded since the check had a verdict
            title += "" if same else " (DIFFERENT from the bundle's own predictions)"
        page.heading(title, [f"../{name}/{mf.MANIFEST}", f"../{name}/{written}"])
        results = (folder / written).read_text(encoding="utf-8")
        page.md += [re.sub(r"^#+ ", "### ", results, flags=re.MULTILINE), ""]  # under the section's heading
        page.html.append(f"<pre>{html.escape(results)}</pre>")


def _number(value, spec: str) -> str | None:
    """`value` formatted, or None (shown as "-") when the run could not measure it."""
    return None if value is None else format(value, spec)


LOADTEST_FORMATS = {  # a load test's figure -> its format in the report's table of its overall figures
    **dict.fromkeys(("offered_rate", "requests_per_s"), ".1f"),
    **dict.fromkeys(
        ("p50_ms", "p95_ms", "p99_ms", "max_ms", "p50_from_due_ms", "p95_from_due_ms", "p99_from_due_ms"), ".2f"
    ),
    **dict.fromkeys(("late_calls", "failures", "unsent_calls"), ",d"),
    **dict.fromkeys(("locust_cpu_pct", "server_cpu_pct"), ".0f"),
}
# the columns of the load test's own tables (summary.md, the console), in their order, less the stages' users
LOADTEST_FIGURES = [key for key in loadtest_result.COLUMNS if key != "users"]


def _loadtests(page: Page, root: Path, recipe: Recipe, stale: dict[str, plan.Stale]) -> None:
    for folder in (root / name for name in plan.loadtests(recipe) if _finished(root / name) and name not in stale):
        result = loadtest_result.load(folder)
        profile = result["profile"]
        target = (
            " against the echo server, the floor of gRPC and locust"
            if result.get("echo")
            else f" of {_deployed(recipe)}"
        )
        page.heading(
            f"Load test: {profile}{target} ({tables.slo(result['passed'])})",
            [f"../{folder.name}/{mf.MANIFEST}", f"../{folder.name}/report.html"],
        )
        overall = result["overall"]
        page.table(
            ["requests", *(loadtest_result.COLUMNS[key] for key in LOADTEST_FIGURES)],
            # a result written before calls were timed from their due time has no such figures: "-"
            [[overall["requests"], *(_number(overall.get(key), LOADTEST_FORMATS[key]) for key in LOADTEST_FIGURES)]],
        )
        page.note(loadtest_result.READING)
        # The load test's own rows, so that the report and its summary.md write each measured figure alike
        page.table(["SLO check", "measured", "wanted", "result"], loadtest_result.verdict_rows(result))
        if caveats := loadtest_result.extras(result):  # as summary.md lists them: a generator-bound load, ...
            page.items(caveats)
        # The calls its figures count: those due after the schedule count nowhere (`loadtests.result`)
        by_name = Samples.load(folder / SAMPLES_FILE).due_before(result["duration_s"]).latencies_by_name()
        if by_name:
            page.figure(
                f"{folder.name}-latency.png",
                plots.latency_distribution(by_name, folder.name.removeprefix("loadtest-")),
                "latency distribution",
            )
        page.figure(
            f"{folder.name}-time.png",
            plots.load_over_time(result["series"], folder.name.removeprefix("loadtest-")),
            "requests/s over time",
        )


def stage(recipe: Recipe, overrides: Sequence[str] = ()) -> Stage:
    """`runs/<recipe>/report/` (index.html, report.md, figures/) from every finished artifact of the run, which
    are its parents: it is current until one of them changes, a new one appears, the distillation table is written
    again (`common.summary`), the recipe sections it reads change (`export.deploy` names the bundle whose measurements
    it shows), or another release of edgedistill (which may draw other sections) runs it."""
    parents = tuple(Artifact(p.name, p) for p in finished_stages(recipe))
    extra = {"edgedistill": metadata.version("edgedistill"), summary.FILE: summary.sha256(run_dir(recipe))}
    extra |= {"overrides_given": True} if overrides else {}  # they change its commands: no make command is named
    return Stage("report", recipe, sections.TRAINED, partial(_build, overrides=tuple(overrides)), parents, extra=extra)


def _build(inputs: Inputs, overrides: tuple[str, ...]) -> Built:
    root = run_dir(inputs.recipe)
    page = Page(f"edgedistill report: {inputs.recipe.name}")
    # of other settings or an earlier build: named once, left out of each section
    stale = plan.stale(inputs.recipe, root)
    _stages(page, root, inputs.recipe, stale)
    _missing(page, root, inputs.recipe, overrides)
    _unkeyed(page, root)
    _stale(page, inputs.recipe, stale, overrides)
    _curves(page, root, inputs.recipe, stale)
    _distillation(page, root, inputs.recipe, stale, overrides)
    _per_class(page, root, inputs.recipe, stale)
    _benchmark(page, root, stale, overrides)
    _cascade_section(page, root, stale)
    _serving(page, root, inputs.recipe, stale)
    _loadtests(page, root, inputs.recipe, stale)
    work = inputs.fresh_work()
    (work / "figures").mkdir()
    for name, data in page.figures.items():
        (work / "figures" / name).write_bytes(data)
    (work / "index.html").write_text(page.render_html(), encoding="utf-8")
    (work / "report.md").write_text("\n".join(page.md), encoding="utf-8")
    cards = modelcard.refresh(inputs.recipe)  # the models' cards, with the benchmark's latency once it exists
    return Built(line=f"{len(page.figures)} figures, index.html, {len(cards)} model cards")
