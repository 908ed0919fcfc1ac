"""Served accuracy: the recipe's whole dev split through the server, by both APIs, against the bundle's own
predictions and figure.

`python -m bench accuracy RECIPE [--bundle DIR] [--check]` runs the bundle (or cascade) in this process on every dev
example (with its pair, for a pair task; cut to `dev_limit`), through the server's own tokenizer and model runtime
(`common.runtime`, as the export stage opened it) without gRPC or the batcher: the bundle's own predictions (a bundle
whose labels are not the recipe's `data.label_names`, in their order, is refused first: the gold label ids are the
recipe's, the served answers the bundle's). It then
starts the server on the bundle (`python -m serve` on loopback, supervised as in the serving benchmark), sends the
same examples through `Classify` and through KServe `ModelInfer` (BYTES `text` and `text_pair`) in calls of the
server's `MAX_TEXTS` (a dev example that the bundle, or a member, reads as nothing refused before anything runs:
`bench.serving.check_readable`), and checks per API that no served prediction differs from the bundle's own on the
same example (but at a near-tie, where the served label's logit is within `export.tie_margin` of the bundle's top:
padding may flip it). A bundle that quantizes its activations per batch (dynamic INT8, or a cascade with such a
member) gives a text other logits beside other texts, and the server groups texts by length as its cost model
decides: for it the check also runs its dev examples in calls of 8 texts and of 1, and the largest change between
the groupings of the gap between two logits of a text (`grouping_margin`) widens the near-tie margin where it is the
wider.

The counts of correct predictions are checked as a chain, exact but at near-ties: the bundle's own against the
`dev_accuracy` in the bundle's manifest, which the export stage measured on the same examples tokenized by the
training tokenizer in batches padded otherwise (a dynamic INT8 model quantizes each batch's activations on their own
range, so a near-tie may go either way there), give or take the near-ties that another padding may answer otherwise;
each API's against the bundle's own, give or take its tie flips. The manifest records those examples
(`common.data.DEV_EXAMPLES`): a dev split of others is refused before anything runs; a bundle built before bundles
recorded them is checked as if measured on these, its result saying so. The result is the artifact
`runs/<recipe>/serve-accuracy-<bundle>/`, one per bundle folder (`common.measured`): accuracy.json (an
`AccuracyResult`), accuracy.md, server.log and the manifest.
"""

import functools
import itertools
from pathlib import Path
from typing import ClassVar

import grpc
import numpy as np
from edgedistill.bench import BenchError
from edgedistill.bench.environ import measured_server, served_settings
from edgedistill.bench.peers.model import BundleClassifier
from edgedistill.bench.processes import running
from edgedistill.bench.records import Record, Result
from edgedistill.bench.serving import check_readable
from edgedistill.bench.tables import markdown_results, print_results
from edgedistill.bench.texts import check_kind, dev_split, texts_info
from edgedistill.common import manifest as mf
from edgedistill.common import measured, progress, tables
from edgedistill.common.bundle import load_bundle
from edgedistill.common.cascade import Served, describe, is_cascade, load_cascade, load_served, route
from edgedistill.common.config.export import ExportConfig
from edgedistill.common.console import Console
from edgedistill.common.data import DEV_EXAMPLES, Examples
from edgedistill.common.recipe import Recipe, run_dir
from edgedistill.common.scores import top_two_gap, within_reach
from edgedistill.common.stage import Artifact, Built, Inputs, Stage
from edgedistill.serve.client import Client
from pydantic import Field

STAGE = measured.ACCURACY
RESULT_FILE = "accuracy.json"
RESULT_VERSION = 5  # of accuracy.json: a result of another version is measured again, not read
APIS = {"classify": "Classify", "kserve": "KServe ModelInfer"}  # result key -> table name
GROUPINGS = (8, 1)  # texts per call, beside the server's MAX_TEXTS, that show how batch-mates move a dynamic INT8 model


class Counted(Record):
    """Correct predictions on the labelled examples, as a count and a share."""

    correct: int
    accuracy: float


class ApiAccuracy(Counted):
    differing: int = Field(description="examples whose served prediction differs from the bundle's own")
    tie_flips: int = Field(
        description="of those, the near-ties: the served label's logit within the near-tie margin of the bundle's top"
    )
    same_predictions: bool = Field(description="no served prediction differs from the bundle's but at near-ties")
    matches_own: bool = Field(
        description="as many correct predictions as the bundle's own, give or take its tie_flips (at most one each)"
    )


class OwnAccuracy(Counted):
    """The bundle's own predictions on the labelled examples, and how far another padding may move their count."""

    near_ties: int = Field(description="examples whose top two logits are within the near-tie margin")
    may_lose: int = Field(description="of those, the ones answered right: another padding may answer them wrong")
    may_gain: int = Field(
        description="of those, the ones answered wrong with the gold label's logit within the margin of the top: "
        "another padding may answer them right"
    )
    matches_bundle: bool = Field(
        description="the bundle's dev_accuracy counts correct - may_lose to correct + may_gain correct predictions"
    )


class AccuracyResult(Result):
    """`accuracy.json`: per API its accuracy and the predictions unlike the bundle's own, the bundle's dev accuracy,
    how often the APIs agree, the verdict."""

    FILE: ClassVar[str] = RESULT_FILE
    TABLES: ClassVar[str] = "accuracy.md"

    bundle: dict
    texts: dict
    bundle_dev_accuracy: float
    bundle_dev_correct: int = Field(description="bundle_dev_accuracy as a count of correct predictions")
    own: OwnAccuracy = Field(description="the bundle's own predictions, run in the checking process")
    tie_margin: float = Field(
        description="export.tie_margin: a smaller gap of the bundle's top two logits is a near-tie"
    )
    grouping_margin: float | None = Field(
        None,
        description="for a bundle that quantizes activations per batch, the largest change of the gap between two "
        "logits of a dev example between runs in calls of MAX_TEXTS, 8 and 1 texts; the near-tie margin where wider "
        "than tie_margin",
    )
    apis: dict[str, ApiAccuracy]
    agreement: float = Field(description="share of the examples for which both APIs predicted the same label")
    examples_checked: bool = Field(
        False,
        description="the bundle's manifest records the dev examples its dev_accuracy was measured on, and they are "
        "these; false for a bundle built before bundles recorded them",
    )
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


def _logits(bundle: Path, examples: Examples, batch_size: int) -> np.ndarray:
    """(N, labels) logits of the bundle in `bundle` on `examples`, in groups of `batch_size`, by the server's tokenizer
    and model runtime."""
    classifier = BundleClassifier(bundle)
    try:
        return np.concatenate([classifier.logits(b.texts, b.pairs) for b in examples.batches(batch_size)])
    finally:
        classifier.close()


def _bundles(folder: Path) -> list[Path]:
    """The bundle in `folder`, or the members of the cascade there."""
    return [member.folder for member in load_cascade(folder).members] if is_cascade(folder) else [folder]


def member_logits(folder: Path, examples: Examples, batch_size: int) -> dict[Path, np.ndarray]:
    """{bundle folder: (N, labels) logits} of the bundle in `folder`, or of each member of the cascade there, on
    `examples`, run in this process in groups of `batch_size` by the server's tokenizer and model runtime, without
    gRPC or the batcher."""
    return {bundle: _logits(bundle, examples, batch_size) for bundle in _bundles(folder)}


def routed(folder: Path, members: dict[Path, np.ndarray]) -> np.ndarray:
    """The logits the bundle or cascade in `folder` answers with, from its `members`' (a cascade: routed as the
    server routes)."""
    logits = list(members.values())
    return route(logits, load_cascade(folder).spec)[0] if is_cascade(folder) else logits[0]


def quantizes_per_batch(bundle: Path) -> bool:
    """Whether the bundle in `bundle` quantizes its activations per batch (dynamic INT8), as its manifest says: a
    text's logits then depend on the texts batched with it."""
    return mf.load(bundle).info.get("quantization", {}).get("mode") == "dynamic"


def grouping_margin(examples: Examples, members: dict[Path, np.ndarray]) -> float | None:
    """For members (`member_logits`, in calls of the server's size) that quantize activations per batch, the largest
    change of the gap between two logits of an example between those and runs in calls of each of GROUPINGS: how far
    batch-mates can move a label towards the top (a label's logit may rise as the top's falls). None where no
    member's logits depend on batch-mates."""
    dynamic = {bundle: logits for bundle, logits in members.items() if quantizes_per_batch(bundle)}
    if not dynamic:
        return None
    spread = 0.0
    for bundle, logits in dynamic.items():
        runs = [logits, *(_logits(bundle, examples, size) for size in GROUPINGS)]
        spread = max(spread, *(float(np.ptp(a - b, axis=1).max()) for a, b in itertools.combinations(runs, 2)))
    return spread


def near_tie_margin(tie_margin: float, grouping: float | None) -> float:
    """The margin within which a served label may differ from the bundle's own: `tie_margin`, or the bundle's
    `grouping` margin where that is wider."""
    return max(tie_margin, grouping or 0.0)


def own_accuracy(gold: list[int], reference: np.ndarray, tie_margin: float, expected_correct: int) -> OwnAccuracy:
    """The bundle's own figures: its predictions (the argmax of its `reference` logits, (N, labels)) against the
    `gold` labels, and whether `expected_correct`, the count the export stage measured with other batches, is theirs
    but for near-ties: another padding may answer a near-tie by any label within `tie_margin` of its top."""
    gold = np.asarray(gold)
    right = reference.argmax(-1) == gold
    near = top_two_gap(reference) < tie_margin
    gold_reached = within_reach(reference, gold, tie_margin)
    correct, lose, gain = int(right.sum()), int((near & right).sum()), int((near & ~right & gold_reached).sum())
    return OwnAccuracy(
        correct=correct,
        accuracy=correct / len(gold),
        near_ties=int(near.sum()),
        may_lose=lose,
        may_gain=gain,
        matches_bundle=correct - lose <= expected_correct <= correct + gain,
    )


def compare(served: list[int], gold: list[int], reference: np.ndarray, tie_margin: float) -> ApiAccuracy:
    """One API's figures: its `served` predictions against the `gold` labels and the bundle's own predictions (the
    argmax of its `reference` logits, (N, labels))."""
    count = len(gold)
    correct = sum(p == g for p, g in zip(served, gold, strict=True))
    own = reference.argmax(-1)
    differ = np.asarray(served) != own
    ties = int((differ & within_reach(reference, np.asarray(served), tie_margin)).sum())
    return ApiAccuracy(
        correct=correct,
        accuracy=correct / count,
        differing=int(differ.sum()),
        tie_flips=ties,
        same_predictions=int(differ.sum()) == ties,
        matches_own=abs(correct - int((own == np.asarray(gold)).sum())) <= ties,
    )


def correct_count(accuracy: float, count: int) -> int:
    """The number of correct predictions of `count` that `accuracy` stands for."""
    return round(accuracy * count)


def failures(result: "AccuracyResult") -> list[str]:
    """What failed the check, each part with by how much; empty when it passed."""
    own, expected = result.own, result.bundle_dev_correct
    found = []
    if not own.matches_bundle:
        if expected > own.correct:
            by = (
                f"{expected - own.correct - own.may_gain} more than their {own.may_gain} near-ties answered wrong allow"
            )
        else:
            by = f"{own.correct - own.may_lose - expected} fewer than their {own.may_lose} near-ties answered right allow"
        found.append(f"the bundle's dev_accuracy counts {expected} correct, its own predictions {own.correct}: {by}")
    for api, f in result.apis.items():
        if not f.same_predictions:
            found.append(
                f"{APIS[api]}: {f.differing - f.tie_flips} predictions unlike the bundle's own, near-ties aside"
            )
        if not f.matches_own:
            by = abs(f.correct - own.correct) - f.tie_flips
            found.append(
                f"{APIS[api]}: {f.correct} correct, the bundle's own {own.correct}: {by} apart beyond its "
                f"{f.tie_flips} tie flips"
            )
    return found


def stage(recipe: Recipe, bundle_folder: Path, console: Console | None = None) -> Stage:
    """`runs/<recipe>/serve-accuracy-<bundle>/`: the dev split through the server on `bundle_folder`; current while
    the data settings and the bundle are unchanged."""
    return Stage(
        measured.of_bundle(STAGE, bundle_folder, run_dir(recipe)),
        recipe,
        ("data",),
        functools.partial(_build, console=console or Console(width=200)),
        (Artifact(measured.BUNDLE, bundle_folder),),
        extra={
            "server": served_settings(bundle_folder, 0),
            "tie_margin": tie_margin(recipe),
            "result_version": RESULT_VERSION,
        },
    )


def tie_margin(recipe: Recipe) -> float:
    """The recipe's `export.tie_margin`, or its default where the recipe has no export section."""
    if recipe.export is None:
        return ExportConfig.model_fields["tie_margin"].default
    return recipe.export.tie_margin


def check_labels(bundle: Served, label_names: list[str]) -> None:
    """`BenchError` unless the bundle (or cascade) answers with the recipe's `label_names`, in their order: the gold
    label ids are read by the recipe's, the served answers by the bundle's."""
    if bundle.labels != label_names:
        raise BenchError(
            f"{bundle.folder} answers with the labels {bundle.labels}, and the recipe's data.label_names are "
            f"{label_names}: measure it with the recipe (and data.label_names) it was built with"
        )


def check_examples(bundle: Served, examples: Examples) -> bool:
    """Whether the bundle's (or cascade's) manifest records the dev examples its dev_accuracy was measured on;
    `BenchError` where they are not `examples`."""
    recorded = bundle.manifest.info.get(DEV_EXAMPLES)
    if recorded is None:
        return False
    if recorded != (read := examples.digest()):
        raise BenchError(
            f"{bundle.folder}: its dev_accuracy was measured on {recorded['count']} dev examples (sha256 "
            f"{recorded['sha256'][:12]}), and the recipe's dev split ({examples.source}) holds {read['count']} others "
            f"(sha256 {read['sha256'][:12]}): measure it with the data.dev and data.dev_limit it was built with"
        )
    return True


def _build(inputs: Inputs, console: Console) -> Built:
    bundle = load_served(inputs.parent(measured.BUNDLE))
    check_labels(bundle, inputs.recipe.data.label_names)
    expected = bundle.manifest.metrics.get("dev_accuracy")
    if expected is None:
        raise BenchError(f"{bundle.folder}: the manifest has no dev_accuracy to compare with (rebuild the bundle)")
    examples = dev_split(inputs.recipe.data)
    check_kind(examples, bundle.pairs)
    checked = check_examples(bundle, examples)
    check_readable([load_bundle(folder) for folder in _bundles(bundle.folder)], examples)
    flags, settings = measured_server(bundle.folder, threads=0)
    members = member_logits(bundle.folder, examples, settings.max_texts)
    reference = routed(bundle.folder, members)
    grouping = grouping_margin(examples, members)
    margin = near_tie_margin(tie_margin(inputs.recipe), grouping)
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
    own = own_accuracy(examples.labels, reference, margin, correct_count(expected, count))
    apis = {api: compare(labels, examples.labels, reference, margin) for api, labels in predicted.items()}
    result = AccuracyResult(
        bundle={"path": str(bundle.folder)} | bundle.description,
        texts=texts_info(examples),
        bundle_dev_accuracy=expected,
        bundle_dev_correct=correct_count(expected, count),
        own=own,
        tie_margin=tie_margin(inputs.recipe),
        grouping_margin=grouping,
        apis=apis,
        agreement=sum(a == b for a, b in zip(predicted["classify"], predicted["kserve"], strict=True)) / count,
        examples_checked=checked,
        passed=own.matches_bundle and all(f.same_predictions and f.matches_own for f in apis.values()),
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
        + f": {'the same' if result.passed else 'DIFFERENT: ' + '; '.join(failures(result))}",
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
    own = result.own
    return rows + [
        ["bundle's own", f"{own.correct} / {count}", f"{own.accuracy:.4f}", ""],
        ["bundle (export stage)", "", f"{result.bundle_dev_accuracy:.4f}", ""],
    ]


def check_rows(result: AccuracyResult) -> list[list[str]]:
    own = result.own
    rows = [
        [
            "bundle (export stage) correct",
            str(result.bundle_dev_correct),
            f"{own.correct - own.may_lose} to {own.correct + own.may_gain}: the bundle's own {own.correct}, "
            f"-{own.may_lose} / +{own.may_gain} near-ties answered right / wrong",
            tables.result(own.matches_bundle),
        ]
    ]
    for api, f in result.apis.items():
        rows += [
            [
                f"{APIS[api]} correct",
                str(f.correct),
                f"the bundle's own {own.correct} ± its tie flips ({f.tie_flips})",
                tables.result(f.matches_own),
            ],
            [
                f"{APIS[api]} predictions unlike the bundle's",
                str(f.differing - f.tie_flips),
                f"0 (near-ties aside: {margin_text(result)})",
                tables.result(f.same_predictions),
            ],
        ]
    return rows


def margin_text(result: AccuracyResult) -> str:
    """The near-tie margin the check used, and where it came from."""
    margin = near_tie_margin(result.tie_margin, result.grouping_margin)
    if margin == result.tie_margin:
        return f"a label within {margin:g} of the bundle's top, export.tie_margin"
    quantized = (
        "a per-batch quantized member of this cascade"
        if result.bundle.get("kind") == "cascade"
        else "this per-batch quantized bundle"
    )
    return (
        f"a label within {margin:.3g} of the bundle's top, how far batch-mates moved the gap between two logits of "
        f"{quantized}"
    )


def markdown(result: AccuracyResult) -> str:
    lines = [f"Served accuracy: {heading(result)}.", ""]
    lines += markdown_results(HEADER, table_rows(result), ("check", check_rows(result)))
    lines += ["", f"The two APIs predicted the same label for {result.agreement:.2%} of the examples."]
    lines += [
        "The bundle's own predictions: the bundle run in the checking process by the server's tokenizer and model "
        f"runtime, without gRPC or the batcher. A near-tie ({margin_text(result)}) is one that another padding "
        f"may answer otherwise; {result.own.near_ties} of the {result.texts['count']} examples."
    ]
    if not result.examples_checked:
        lines += [
            "The bundle's manifest records no dev examples (it was built before bundles recorded them), so that its "
            f"dev_accuracy was measured on these {result.texts['count']} could not be checked."
        ]
    return "\n".join(lines) + "\n"
