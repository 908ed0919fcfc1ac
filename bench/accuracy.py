"""Served accuracy: the recipe's whole dev split through the server, by both APIs, against the bundle's own
predictions and figure.

`python -m bench accuracy RECIPE [--bundle DIR] [--check]` runs the bundle (or cascade) in this process on every dev
example (with its pair, for a pair task; cut to `dev_limit`), through the server's own tokenizer and model runtime
(`common.runtime`, as the export stage opened it) without gRPC or the batcher: the bundle's own predictions. It
then starts the server on the bundle (`python -m serve` on loopback, supervised as in the serving benchmark), sends
the same examples through `Classify` and through KServe `ModelInfer` (BYTES `text` and `text_pair`) in calls of the
server's `MAX_TEXTS`, and checks per API that no served prediction differs from the bundle's own on the same example
(but where the bundle's top two logits are within `export.tie_margin`, a near-tie that padding may flip) and that
its accuracy is the `dev_accuracy` in the bundle's manifest, which the export stage measured on the same examples
tokenized by the training tokenizer. The result is the artifact `runs/<recipe>/serve-accuracy-<bundle>/`, one per
bundle folder (`common.measured`): accuracy.json (an `AccuracyResult`), accuracy.md, server.log and the manifest.
"""

import functools
from pathlib import Path
from typing import ClassVar

import grpc
import numpy as np
from edgedistill.bench import BenchError
from edgedistill.bench.peers.model import BundleClassifier
from edgedistill.bench.processes import measured_server, running, served_settings
from edgedistill.bench.records import Record, Result
from edgedistill.bench.tables import markdown_results, print_results
from edgedistill.bench.texts import check_kind, dev_split, texts_info
from edgedistill.common import measured, progress, tables
from edgedistill.common.cascade import describe, is_cascade, load_cascade, load_served, route
from edgedistill.common.config.export import ExportConfig
from edgedistill.common.data import Examples
from edgedistill.common.recipe import Recipe
from edgedistill.common.scores import top_two_gap
from edgedistill.common.stage import Artifact, Built, Inputs, Stage
from edgedistill.serve.client import Client
from pydantic import Field
from rich.console import Console

STAGE = measured.ACCURACY
RESULT_FILE = "accuracy.json"
APIS = {"classify": "Classify", "kserve": "KServe ModelInfer"}  # result key -> table name


class ApiAccuracy(Record):
    correct: int
    accuracy: float
    matches_bundle: bool = Field(description="as many correct predictions as the bundle's dev_accuracy says")
    differing: int = Field(description="examples whose served prediction differs from the bundle's own")
    tie_flips: int = Field(description="of those, the near-ties: the bundle's top two logits within tie_margin")
    same_predictions: bool = Field(description="no served prediction differs from the bundle's but at near-ties")


class AccuracyResult(Result):
    """`accuracy.json`: per API its accuracy and the predictions unlike the bundle's own, the bundle's dev accuracy,
    how often the APIs agree, the verdict."""

    FILE: ClassVar[str] = RESULT_FILE
    TABLES: ClassVar[str] = "accuracy.md"

    bundle: dict
    texts: dict
    bundle_dev_accuracy: float
    tie_margin: float = Field(
        description="export.tie_margin: a smaller gap of the bundle's top two logits is a near-tie"
    )
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


def bundle_logits(folder: Path, examples: Examples, batch_size: int) -> np.ndarray:
    """(N, labels) logits of the bundle or cascade in `folder` on `examples`, run in this process in groups of
    `batch_size` by the server's tokenizer and model runtime, without gRPC or the batcher (a cascade: every member
    on every example, routed as the server routes)."""

    def logits(member: Path) -> np.ndarray:
        classifier = BundleClassifier(member)
        try:
            return np.concatenate([classifier.logits(b.texts, b.pairs) for b in examples.batches(batch_size)])
        finally:
            classifier.close()

    if is_cascade(folder):
        cascade = load_cascade(folder)
        return route([logits(member.folder) for member in cascade.members], cascade.spec)[0]
    return logits(folder)


def compare(
    served: list[int], gold: list[int], reference: np.ndarray, tie_margin: float, expected: float
) -> ApiAccuracy:
    """One API's figures: its `served` predictions against the `gold` labels, the bundle's own predictions (the
    argmax of its `reference` logits, (N, labels)) and the bundle's dev accuracy `expected`."""
    count = len(gold)
    correct = sum(p == g for p, g in zip(served, gold, strict=True))
    differ = np.asarray(served) != reference.argmax(-1)
    ties = int((differ & (top_two_gap(reference) < tie_margin)).sum())
    return ApiAccuracy(
        correct=correct,
        accuracy=correct / count,
        matches_bundle=same_accuracy(correct, count, expected),
        differing=int(differ.sum()),
        tie_flips=ties,
        same_predictions=int(differ.sum()) == ties,
    )


def same_accuracy(correct: int, count: int, expected: float) -> bool:
    """Whether `correct` of `count` is the accuracy `expected` (the same number of correct predictions)."""
    return abs(correct / count - expected) < 0.5 / count


def stage(recipe: Recipe, bundle_folder: Path, console: Console | None = None) -> Stage:
    """`runs/<recipe>/serve-accuracy-<bundle>/`: the dev split through the server on `bundle_folder`; current while
    the data settings and the bundle are unchanged."""
    return Stage(
        measured.of_bundle(STAGE, bundle_folder),
        recipe,
        ("data",),
        functools.partial(_build, console=console or Console(width=200)),
        (Artifact("bundle", bundle_folder),),
        extra={"server": served_settings(bundle_folder, 0), "tie_margin": tie_margin(recipe)},
    )


def tie_margin(recipe: Recipe) -> float:
    """The recipe's `export.tie_margin`, or its default where the recipe has no export section."""
    if recipe.export is None:
        return ExportConfig.model_fields["tie_margin"].default
    return recipe.export.tie_margin


def _build(inputs: Inputs, console: Console) -> Built:
    bundle = load_served(inputs.parent("bundle"))
    expected = bundle.manifest.metrics.get("dev_accuracy")
    if expected is None:
        raise BenchError(f"{bundle.folder}: the manifest has no dev_accuracy to compare with (rebuild the bundle)")
    examples = dev_split(inputs.recipe.data)
    check_kind(examples, bundle.pairs)
    flags, settings = measured_server(bundle.folder, threads=0)
    margin = tie_margin(inputs.recipe)
    reference = bundle_logits(bundle.folder, examples, settings.max_texts)
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
    apis = {api: compare(labels, examples.labels, reference, margin, expected) for api, labels in predicted.items()}
    result = AccuracyResult(
        bundle={"path": str(bundle.folder)} | bundle.description,
        texts=texts_info(examples),
        bundle_dev_accuracy=expected,
        tie_margin=margin,
        apis=apis,
        agreement=sum(a == b for a, b in zip(predicted["classify"], predicted["kserve"], strict=True)) / count,
        passed=all(figures.matches_bundle and figures.same_predictions for figures in apis.values()),
    )
    result.save(work, markdown(result))
    print_results(console, heading(result), HEADER, table_rows(result), ("check", "check", check_rows(result)))
    return Built(
        metrics={f"{api}_accuracy": figures.accuracy for api, figures in apis.items()}
        | {f"{api}_differing": figures.differing for api, figures in apis.items()}
        | {"bundle_dev_accuracy": expected, "agreement": result.agreement, "passed": result.passed},
        info={"texts": result.texts},
        line=", ".join(f"{APIS[api]} {figures.accuracy:.4f}" for api, figures in apis.items())
        + f" (bundle {expected:.4f}), predictions unlike the bundle's "
        + ", ".join(f"{figures.differing}" for figures in apis.values())
        + f": {'the same' if result.passed else 'DIFFERENT'}",
    )


HEADER = ["API", "correct", "accuracy", "unlike the bundle's (near-ties)"]


def heading(result: AccuracyResult) -> str:
    b, t = result.bundle, result.texts
    kind = "text pairs" if t["pairs"] else "texts"
    return f"{describe(b)} served, {t['count']} dev {kind} from {t['source']}"


def table_rows(result: AccuracyResult) -> list[list[str]]:
    count = result.texts["count"]
    rows = [
        [APIS[api], f"{f.correct} / {count}", f"{f.accuracy:.4f}", f"{f.differing} ({f.tie_flips})"]
        for api, f in result.apis.items()
    ]
    return rows + [["bundle (export stage)", "", f"{result.bundle_dev_accuracy:.4f}", ""]]


def check_rows(result: AccuracyResult) -> list[list[str]]:
    wanted = f"= {result.bundle_dev_accuracy:.4f}"
    rows = []
    for api, f in result.apis.items():
        rows += [
            [f"{APIS[api]} accuracy", f"{f.accuracy:.4f}", wanted, tables.result(f.matches_bundle)],
            [
                f"{APIS[api]} predictions unlike the bundle's",
                str(f.differing - f.tie_flips),
                f"0 (near-ties aside: top two logits within {result.tie_margin:g})",
                tables.result(f.same_predictions),
            ],
        ]
    return rows


def markdown(result: AccuracyResult) -> str:
    lines = [f"Served accuracy: {heading(result)}.", ""]
    lines += markdown_results(HEADER, table_rows(result), ("check", check_rows(result)))
    lines += ["", f"The two APIs predicted the same label for {result.agreement:.2%} of the examples."]
    lines += [
        "The bundle's own predictions: the bundle run in the checking process by the server's tokenizer and model "
        "runtime, without gRPC or the batcher."
    ]
    return "\n".join(lines) + "\n"
