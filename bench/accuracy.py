"""Served accuracy: the recipe's whole dev split through the server, by both APIs, against the bundle's own figure.

`python -m bench accuracy RECIPE [--bundle DIR] [--check]` starts the server on the bundle (`python -m serve`
on loopback, supervised as in the serving benchmark), sends every dev example (with its pair, for a pair
task; cut to `dev_limit`) through `Classify` and through KServe `ModelInfer` (BYTES `text` and `text_pair`)
in calls of the server's `MAX_TEXTS`, and compares each API's accuracy with the `dev_accuracy` in the
bundle's manifest, which the export stage measured on the same examples with the model run in-process. They
agree when the server tokenizes, batches, pads and reads the outputs as the export checks did. The result is
the artifact `runs/<recipe>/serve-accuracy/`: accuracy.json (an `AccuracyResult`), accuracy.md, server.log and
the manifest.
"""

import functools
from pathlib import Path
from typing import ClassVar

import grpc
from edgedistill.bench import BenchError
from edgedistill.bench.processes import measured_server, running, served_settings
from edgedistill.bench.records import Record, Result
from edgedistill.bench.tables import markdown_results, print_results
from edgedistill.bench.texts import check_kind, dev_split, texts_info
from edgedistill.common import progress, tables
from edgedistill.common.cascade import describe, load_served
from edgedistill.common.data import Examples
from edgedistill.common.recipe import Recipe
from edgedistill.common.stage import Artifact, Built, Inputs, Stage
from edgedistill.serve.client import Client
from pydantic import Field
from rich.console import Console

STAGE = "serve-accuracy"
RESULT_FILE = "accuracy.json"
APIS = {"classify": "Classify", "kserve": "KServe ModelInfer"}  # result key -> table name


class ApiAccuracy(Record):
    correct: int
    accuracy: float
    matches_bundle: bool = Field(description="as many correct predictions as the bundle's dev_accuracy says")


class AccuracyResult(Result):
    """`accuracy.json`: per API its accuracy, the bundle's dev accuracy, how often the APIs agree, the verdict."""

    FILE: ClassVar[str] = RESULT_FILE
    TABLES: ClassVar[str] = "accuracy.md"

    bundle: dict
    texts: dict
    bundle_dev_accuracy: float
    apis: dict[str, ApiAccuracy]
    agreement: float = Field(description="share of the examples for which both APIs predicted the same label")
    passed: bool


def predict(infer, examples: Examples, batch_size: int, labels: list[str], bar) -> list[int]:
    """The label id `infer` (`Client.classify` or `Client.kserve_infer`) predicts for each example, in order;
    `bar` (`common.progress.bar`) advances by the examples of each call."""
    predicted = []
    for batch in examples.batches(batch_size):
        try:
            reply = infer(batch.texts, batch.pairs)
        except grpc.RpcError as err:
            raise BenchError(f"the server refused a call: {err.code().name}: {err.details()}") from err
        predicted += [labels.index(p["label"]) for p in reply["predictions"]]
        bar.update(len(batch))
    return predicted


def same_accuracy(correct: int, count: int, expected: float) -> bool:
    """Whether `correct` of `count` is the accuracy `expected` (the same number of correct predictions)."""
    return abs(correct / count - expected) < 0.5 / count


def stage(recipe: Recipe, bundle_folder: Path, console: Console | None = None) -> Stage:
    """`runs/<recipe>/serve-accuracy/`: the dev split through the server on `bundle_folder`; current while the data
    settings and the bundle are unchanged."""
    return Stage(
        STAGE,
        recipe,
        ("data",),
        functools.partial(_build, console=console or Console(width=200)),
        (Artifact("bundle", bundle_folder),),
        extra={"server": served_settings(bundle_folder, 0)},
    )


def _build(inputs: Inputs, console: Console) -> Built:
    bundle = load_served(inputs.parent("bundle"))
    expected = bundle.manifest.metrics.get("dev_accuracy")
    if expected is None:
        raise BenchError(f"{bundle.folder}: the manifest has no dev_accuracy to compare with (rebuild the bundle)")
    examples = dev_split(inputs.recipe.data)
    check_kind(examples, bundle.pairs)
    flags, settings = measured_server(bundle.folder, threads=0)
    token = settings.token.get_secret_value() if settings.token else None
    work = inputs.fresh_work()
    predicted = {}
    address = f"127.0.0.1:{settings.port}"
    with (
        running("edgedistill.serve", flags, settings.port, work / "server.log"),
        Client(address, token=token, timeout=60) as client,
    ):
        sent = progress.bar(len(APIS) * len(examples), desc=STAGE, unit="text")
        for api, infer in (("classify", client.classify), ("kserve", client.kserve_infer)):
            sent.set_postfix(api=APIS[api], refresh=False)
            predicted[api] = predict(infer, examples, settings.max_texts, bundle.labels, sent)
        sent.close()
    count = len(examples)
    apis = {}
    for api, labels in predicted.items():
        correct = sum(p == gold for p, gold in zip(labels, examples.labels, strict=True))
        apis[api] = ApiAccuracy(
            correct=correct, accuracy=correct / count, matches_bundle=same_accuracy(correct, count, expected)
        )
    result = AccuracyResult(
        bundle={"path": str(bundle.folder)} | bundle.description,
        texts=texts_info(examples),
        bundle_dev_accuracy=expected,
        apis=apis,
        agreement=sum(a == b for a, b in zip(predicted["classify"], predicted["kserve"], strict=True)) / count,
        passed=all(figures.matches_bundle for figures in apis.values()),
    )
    result.save(work, markdown(result))
    print_results(console, heading(result), HEADER, table_rows(result), ("check", "check", check_rows(result)))
    return Built(
        metrics={f"{api}_accuracy": figures.accuracy for api, figures in apis.items()}
        | {"bundle_dev_accuracy": expected, "agreement": result.agreement, "passed": result.passed},
        info={"texts": result.texts},
        line=", ".join(f"{APIS[api]} {figures.accuracy:.4f}" for api, figures in apis.items())
        + f" (bundle {expected:.4f}): {'the same' if result.passed else 'DIFFERENT'}",
    )


HEADER = ["API", "correct", "accuracy"]


def heading(result: AccuracyResult) -> str:
    b, t = result.bundle, result.texts
    kind = "text pairs" if t["pairs"] else "texts"
    return f"{describe(b)} served, {t['count']} dev {kind} from {t['source']}"


def table_rows(result: AccuracyResult) -> list[list[str]]:
    count = result.texts["count"]
    rows = [[APIS[api], f"{f.correct} / {count}", f"{f.accuracy:.4f}"] for api, f in result.apis.items()]
    return rows + [["bundle (export stage)", "", f"{result.bundle_dev_accuracy:.4f}"]]


def check_rows(result: AccuracyResult) -> list[list[str]]:
    wanted = f"= {result.bundle_dev_accuracy:.4f}"
    return [
        [f"{APIS[api]} accuracy", f"{f.accuracy:.4f}", wanted, tables.result(f.matches_bundle)]
        for api, f in result.apis.items()
    ]


def markdown(result: AccuracyResult) -> str:
    lines = [f"Served accuracy: {heading(result)}.", ""]
    lines += markdown_results(HEADER, table_rows(result), ("check", check_rows(result)))
    lines += ["", f"The two APIs predicted the same label for {result.agreement:.2%} of the examples."]
    return "\n".join(lines) + "\n"
