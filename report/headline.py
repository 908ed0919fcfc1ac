"""`edgedistill headline RECIPE [--section.key=value ...]`: one line per finished stage, then the headline.

The headline names the deployed bundle and how to serve and call it, with the figures that matter:
the dev accuracy of the teacher and of the student the deployed bundle is built from (and test accuracy with a
test split), speedup over the teacher in PyTorch eager mode (none for a bundle that cuts texts to fewer tokens than
the teacher was timed on), serving latency and capacity (a deployed cascade's from the cascade benchmark), the served
accuracy, and the load test's SLO result, each of the deployed bundle (the measurements keep one folder per bundle:
`common.measured`). Lines whose artifact is missing are left out; a model built with other settings than the
recipe's now (edited since), and a measurement taken before what it measured was built again (the deployed bundle, a
cascade, a model of the model benchmark or its teacher: `report.plan.stale`), is named, not shown, with the command
that builds or measures it again, with those of the overrides given that it reads. The student's retention and
gain are shown by the distillation table's rule: while that table is of the artifacts now in the run
(`common.summary`) and does not mark the student (for the gain, nor its baseline) out of date; else named, not shown.
"""

import json
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path

from edgedistill.bench import slo
from edgedistill.bench.records import ModelTable, ServingResult
from edgedistill.common import manifest as mf
from edgedistill.common import measured, modelcard, summary, tables
from edgedistill.common.arguments import ArgumentParser
from edgedistill.common.config.training import METRIC_NAMES
from edgedistill.common.console import Console
from edgedistill.common.recipe import (
    Recipe,
    RecipeError,
    add_recipe_argument,
    load_command_recipe,
    parse_overrides,
    run_dir,
)
from edgedistill.common.scores import one_label
from edgedistill.loadtests import result as loadtest_result
from edgedistill.report import plan
from edgedistill.report.render import finished_stages
from rich.table import Table

CASCADE_RESULT = "cascade.json"  # `bench.cascade.CascadeResult.FILE`, read without the serve extra its module needs
HEADLINE = ("dev_accuracy", "params", "size", "wall")  # the stage table's columns: parameters in millions, MiB, min
CALL = {  # data.pairs -> how to call the served bundle: the command line, and the Classify request's body
    False: ('edgedistill call "<text>"', '{"texts": ["<text>"]}'),
    True: (
        'edgedistill call "<text>" --pair "<second text>"',
        '{"texts": ["<text>"], "text_pairs": ["<second text>"]}',
    ),
}


def stage_table(recipe: Recipe) -> Table:
    """One row per finished stage; not the dev accuracy of a bundle built from a student or teacher built again since
    (`report.plan.stale`), which the headline names instead."""
    rows = []
    folders = finished_stages(recipe)
    stale = plan.stale(recipe, run_dir(recipe))
    for folder in folders:
        metrics = mf.load(folder, verify=False).metrics
        shown = folder.name not in stale
        cells = [
            f"{metrics['dev_accuracy']:.4f}" if metrics.get("dev_accuracy") is not None and shown else "-",
            f"{metrics['params'] / 1e6:.2f}M" if "params" in metrics else "-",
            f"{metrics['size_bytes'] / 2**20:.1f} MiB" if "size_bytes" in metrics else "-",
            f"{metrics['wall_seconds'] / 60:.1f} min" if "wall_seconds" in metrics else "-",
        ]
        rows.append([folder.name, *cells, str(folder)])
    return tables.console_table(f"edgedistill: {recipe.name}", ["stage", *HEADLINE, "folder"], rows, ("folder",))


def _metrics(folder: Path) -> dict | None:
    return mf.load(folder, verify=False).metrics if (folder / mf.MANIFEST).is_file() else None


def deployed_student(recipe: Recipe) -> str | None:
    """The student the served bundle (`export.deploy`; a cascade's first member) is built from, `teacher` for a
    teacher bundle; without an `export` section, `distill.deploy`; None without students."""
    if recipe.distill is None:
        return None
    if recipe.export is None:
        return recipe.distill.deploy
    bundle = recipe.export.deploy
    if bundle in recipe.export.cascades:
        bundle = recipe.export.cascades[bundle].members[0]
    return recipe.export.bundles[bundle].source


def _out_of_date(root: Path, name: str) -> tuple[list[str], str | None]:
    """The kinds of student `name` ("student", "baseline") that the distillation table of the run folder `root` marks
    out of date (`distill.table`: built from other settings, teacher or transfer set than the recipe's); and why it
    can tell nothing of them, None when it can: there is no table, it is not of the artifacts now in the run
    (`common.summary`), or it has no row of `name`."""
    rows = summary.load(root)
    if rows is None:
        return [], "no distillation table was written"
    if change := summary.change(root):
        return [], f"the distillation table is not of the artifacts now in the run ({change})"
    row = next((r for r in rows[1:] if r["student"] == name), None)
    if row is None:
        return [], f"the distillation table has no row of {name}"
    return [kind for kind in ("student", "baseline") if kind in summary.out_of_date(row)], None


def given_texts(folder: Path, texts: dict | None) -> str:
    """`; on N texts of FILE, not the dev split` for a measurement in `folder` of a texts or pairs file given on its
    command line (`--texts`, `--pairs`), whose figures are not those of the dev split the others are measured on;
    '' for one of the dev split."""
    if texts is None or not (folder / mf.MANIFEST).is_file():
        return ""
    extra = (mf.load(folder, verify=False).hashed or {}).get("extra", {})
    if extra.get("texts") is None and extra.get("pairs") is None:
        return ""
    return (
        f"; on {texts['count']} {'text pairs' if texts['pairs'] else 'texts'} of {texts['source']}, not the dev split"
    )


def served_accuracy(metrics: dict, recipe_path: str, overrides: Sequence[str] = ()) -> list[str]:
    """The served accuracy check's line: each API's dev accuracy beside the bundle's, and whether the server predicted
    as the bundle does (`bench accuracy`'s verdict, which `make all` runs without failing on), with how many of each
    API's predictions were near-ties answered otherwise where it did; none from a check that recorded no verdict."""
    apis = {"classify": "Classify", "kserve": "KServe"}
    if "passed" not in metrics:
        return []
    figures = ", ".join(f"{name} {metrics[f'{api}_accuracy']:.4f}" for api, name in apis.items())
    again = plan.command_line((plan.MEASURE_AGAIN[measured.ACCURACY],), recipe_path, overrides)
    verdict = (
        "the same predictions as the bundle's own"
        if metrics["passed"]
        else f"DIFFERENT from the bundle's own ({again} says how)"
    )
    # a check that passed differs from the bundle's own at near-ties alone (`bench.accuracy`)
    if metrics["passed"] and any(metrics.get(f"{api}_differing") for api in apis):
        ties = ", ".join(f"{name} {metrics[f'{api}_differing']}" for api, name in apis.items())
        verdict += f" but near-ties ({ties} answered otherwise)"
    return [f"served accuracy: {figures} (bundle {metrics['bundle_dev_accuracy']:.4f}), {verdict}"]


def _not_shown(stale: dict[str, plan.Stale], recipe_path: str, overrides: Sequence[str]) -> list[str]:
    """A line for each artifact or measurement `stale` names, with the command that builds or measures it again."""
    return [
        f"not shown: {name}, {left_out.why} ({'build' if modelcard.is_model(name) else 'measure'} it again: "
        f"{plan.rerun(left_out.targets, recipe_path, overrides)})"
        for name, left_out in stale.items()
    ]


def serving_line(folder: Path) -> str:
    """The serving benchmark's line (`bench serving`, in `folder`): paced p99 and capacity against an echo server and
    a bare one."""
    served = ServingResult.load(folder)
    return (
        f"serving: p99 {served.median('paced', 'p99_from_due_ms'):.2f} ms from the due time at "
        f"{served.options['rate']:g} calls/s; "
        f"capacity {served.median('capacity', 'texts_per_s'):.0f} calls/s = "
        f"{served.ratios['capacity_vs_echo']:.2f} of an echo server, "
        f"{served.ratios['capacity_vs_bare']:.2f} of a bare one"
        + (f"; {failed} calls failed" if (failed := served.failed_calls()) else "")
        + (f"; {missed}" if (missed := slo.missed(served.targets)) else "")
        + given_texts(folder, served.texts)
    )


def cascade_serving_line(folder: Path) -> str:
    """The cascade benchmark's line (`bench cascade`, in `folder`): the cascade's paced p99 and capacity against its
    last member served alone, as its `cascade.md` gives them."""
    result = json.loads((folder / CASCADE_RESULT).read_text(encoding="utf-8"))
    paced, capacity = (result["summary"]["cascade"][phase] for phase in ("paced", "capacity"))
    failed = sum(record.get("failures", 0) for records in result["runs"]["cascade"].values() for record in records)
    names = result["names"]
    return (
        f"serving: cascade {names['cascade']}, p99 {paced['p99_from_due_ms']['median']:.2f} ms from the due time at "
        f"{result['options']['rate']:g} calls/s; capacity {capacity['texts_per_s']['median']:.0f} calls/s = "
        f"{result['capacity_ratio']:.2f} of its last member, {names['last']}, served alone"
        + (f"; {failed} calls failed" if failed else "")
    )


def headline(recipe: Recipe, recipe_path: str, overrides: Sequence[str] = ()) -> list[str]:
    """The headline figures of a run, one line each, then how to serve and call the deployed bundle; the commands
    it names take those of the recipe `overrides` given that each reads."""
    root = run_dir(recipe)
    lines = []
    metric = recipe.data.metric  # retention and the baseline's gain compare it, as the distillation table does
    key, shown = f"dev_{metric}", METRIC_NAMES[metric]

    def figures(metrics: dict) -> str:
        """The figures of the distillation table (`figure_keys`: dev, then test where the recipe has a test split) the
        manifest carries."""
        keys = recipe.data.figure_keys(test="test_accuracy" in metrics)
        named = (key.split("_", 1) for key in keys if metrics.get(key) is not None)
        return ", ".join(f"{split} {METRIC_NAMES[name]} {metrics[f'{split}_{name}']:.4f}" for split, name in named)

    def predicts(metrics: dict) -> str | None:
        """`it predicts '<label>' for every dev example` of a model that learnt no more than the majority class."""
        label = one_label(metrics.get("dev_confusion"))
        return None if label is None else f"it predicts {recipe.data.label_names[label]!r} for every dev example"

    stale = plan.stale(recipe, root)
    teacher = _metrics(root / "teacher")
    shown_teacher = teacher and "teacher" not in stale  # else of other labels, maybe
    teacher_unlearnt = predicts(teacher) if shown_teacher else None
    if shown_teacher:
        lines.append(f"teacher: {figures(teacher)}" + (f" ({teacher_unlearnt})" if teacher_unlearnt else ""))
    name = deployed_student(recipe)
    if name == "teacher" and teacher:
        lines.append(f"student: none served, the deployed bundle {recipe.export.deploy} is the teacher's")
    elif name not in (None, "teacher"):
        student, baseline = _metrics(root / f"student-{name}"), _metrics(root / f"baseline-{name}")
        baseline = None if f"baseline-{name}" in stale else baseline  # of other settings: no gain over it
        if student and f"student-{name}" not in stale:
            marked, unknown = _out_of_date(root, name)
            shown_kept = not unknown and "student" not in marked
            measured_baseline = bool(baseline) and baseline.get(key) is not None  # an older release's may lack it
            shown_gain = measured_baseline and not unknown and not marked
            of, unit = ("the teacher", "") if metric == "accuracy" else (f"the teacher's {shown}", f" {shown}")
            # The manifest's retention and the gain are on dev, where checkpoints are chosen: beside test figures
            # the line says so, and gives the share of the teacher's test figure too.
            test_key = f"test_{metric}"
            tested = test_key in student
            on_dev = " on dev" if tested else ""
            gain = (
                f", {student[key] - baseline[key]:+.4f}{unit} over its label-only baseline{on_dev}"
                if shown_gain
                else ""
            )
            kept = (
                f"{student['retention']:.1%} of {of}{on_dev}"
                if "retention" in student
                else f"{of}: 0, nothing to retain"
            )
            teacher_test = (teacher or {}).get(test_key)
            if tested and teacher_test:
                kept += f", {student[test_key] / teacher_test:.1%} on test"
            if said := predicts(student):  # a share of, or a gain by, a majority-class guess says nothing
                kept, gain = f"{said}: no retention or gain shown", ""
            elif teacher_unlearnt:
                kept = "the teacher predicts one label for every dev example: no retention shown"
            lines.append(f"student {name}: {figures(student)}{f' ({kept})' if shown_kept else ''}{gain}")
            left_out = [
                what
                for what, left in (("retention", not shown_kept), ("gain", measured_baseline and not shown_gain))
                if left
            ]
            if left_out:
                why = unknown or " and ".join(f"{kind}-{name}" for kind in marked) + " out of date"
                lines.append(
                    f"not shown: student {name}'s {' and '.join(left_out)}, {why} "
                    f"({plan.command_line(plan.DISTILL, recipe_path, overrides)} builds what is out of date and "
                    f"writes the table again; {plan.in_checkout(plan.DISTILL, recipe_path, overrides)})"
                )
            if baseline and not measured_baseline:
                lines.append(f"not shown: student {name}'s gain, baseline-{name} records no {key}")
    if recipe.export is None:
        return lines + _not_shown(stale, recipe_path, overrides)
    deploy = recipe.export.deploy
    bundle = root / f"bundle-{deploy}"
    if (root / "bench" / mf.MANIFEST).is_file():
        bench = ModelTable.load(root / "bench")
        batch, length = plan.figure_cell(bench)
        rows = {row.model: row for row in plan.bench_rows(bench, stale)}
        for model in dict.fromkeys((deploy, "teacher-int8")):  # once, where the deployed bundle is teacher-int8
            if model in rows:
                cell = rows[model].cell(batch, length)
                versus = (
                    f"= {cell.speedup:.1f}x teacher PyTorch eager"
                    if cell.speedup is not None
                    else f"(its max_length, cut from {length}: no speedup against the teacher at {length})"
                )
                lines.append(
                    f"bench {model}: {cell.median_ms:.2f} ms at batch {batch}, {cell.timed_length} tokens {versus} "
                    f"({tables.counted(bench.threads, 'thread')})"
                )
    cascade = deploy in recipe.export.cascades  # served, it is measured by the cascade benchmark
    serving = root / plan.deployed(recipe, measured.CASCADE if cascade else measured.SERVING)
    if (serving / mf.MANIFEST).is_file() and serving.name not in stale:
        lines.append(cascade_serving_line(serving) if cascade else serving_line(serving))
    checked = root / plan.deployed(recipe, measured.ACCURACY)
    if (checked / mf.MANIFEST).is_file() and checked.name not in stale:
        lines += served_accuracy(mf.load(checked, verify=False).metrics, recipe_path, overrides)
    for folder in (root / name for name in plan.loadtests(recipe)):
        if not (folder / loadtest_result.RESULT_FILE).is_file() or folder.name in stale:
            continue
        result = loadtest_result.load(folder)
        overall = result["overall"]
        if result["profile"] == "step":  # overall latency mixes every step: the capacity is the figure
            capacity = result["capacity"]
            within = "none" if capacity is None else f"{capacity['requests_per_s']:.0f} calls/s"
            figure = f"capacity within the SLO {within}"
        else:  # the SLO reads the p99 from each call's due time; the one from the send leaves out a stall's wait
            # the one from the send counts sent calls alone: none where every call sent failed and others were not sent;
            # a result written before calls were timed from their due time has no such figure
            due, sent = (
                ("-" if ms is None else f"{ms:.2f}") for ms in (overall.get("p99_from_due_ms"), overall["p99_ms"])
            )
            figure = "p99 - ms" if due == "-" else f"p99 {due} ms from the due time ({sent} from the send)"
        lines.append(
            f"load test {result['profile']}{' against the echo server' if result.get('echo') else ''}: "
            f"{overall['requests']} calls, {figure}, "
            f"{overall['failures']} failures, {tables.slo(result['passed'])}" + given_texts(folder, result.get("texts"))
        )
    lines += _not_shown(stale, recipe_path, overrides)
    if (root / "report" / "index.html").is_file():
        lines.append(f"report: {root / 'report' / 'index.html'}")
    if (bundle / mf.MANIFEST).is_file():
        command, body = CALL[recipe.data.pairs]
        made = plan.for_make(bundle)  # make serves and bakes the bundle named, whatever recipe overrides chose it
        lines += [
            f"bundle: {bundle}",
            f"serve it:  edgedistill serve --bundle {shlex.quote(str(bundle))}   (in a checkout: make serve BUNDLE={made})",
            f"call it:   {command}",
            f"           grpcurl -plaintext -d '{body}' localhost:50051 edgedistill.v1.Classifier/Classify",
            f"container: make image BAKE=1 BUNDLE={made}   (in a checkout)",
        ]
    return lines


def main(argv: list[str] | None = None, prog: str = "edgedistill headline") -> int:
    parser = ArgumentParser(prog=prog, description=__doc__.splitlines()[0])
    add_recipe_argument(parser, "headline")
    args, overrides = parser.parse_known_args(argv)
    try:
        recipe = load_command_recipe(args.recipe, parse_overrides(overrides), "headline", prog)
        table = stage_table(recipe)
    except (RecipeError, mf.ArtifactError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    console = Console() if sys.stdout.isatty() else Console(width=160)  # a log keeps whole folder names
    console.print(table)
    for line in headline(recipe, args.recipe, overrides):
        console.print(line, highlight=False, soft_wrap=True)
    return 0


if __name__ == "__main__":  # its usage names the module as it was run: `edgedistill.` first when installed
    from edgedistill.cli import run_module

    run_module(main, f"python -m {__spec__.name}", "headline")
