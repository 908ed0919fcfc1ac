"""Build a confidence cascade (`export.cascades`): member bundles, cheapest first, with thresholds chosen for a target.

The thresholds are chosen on calibration texts that are neither dev nor test: unlabelled text past the
lines the transfer set read (split and written as the transfer set is), any overlapping a dev or test text
left out by the transfer set's leak filter, labelled by the last member.
Each member but the last gets a softmax temperature fitted there (the last member's answers as labels),
then the lowest threshold whose answers, with the texts it passes on counted as the last member's,
agree with the last member on at least `target_agreement` of the texts that reach it. The whole
cascade is then run on the dev set: its accuracy, the share of texts each member answers, and the
curve (first threshold -> dev accuracy, escalated share) are recorded.
"""

import contextlib
import itertools
import shutil
from pathlib import Path

import numpy as np
from edgedistill.common import manifest as mf
from edgedistill.common.bundle import read_bundle, text_inputs
from edgedistill.common.cascade import MEMBERS, CascadeMember, CascadeSpec, confidence, route, softmax
from edgedistill.common.config.export import CascadeRecipe
from edgedistill.common.data import DEV_EXAMPLES, load_dev, load_test, unlabelled_lines
from edgedistill.common.recipe import Recipe
from edgedistill.common.runtime import GPU_HINT, ProviderFallback, cascade_missing_here, open_bundle
from edgedistill.common.stage import Built, Inputs
from edgedistill.distill.augment import split_sentences
from edgedistill.distill.metrics import task_metrics
from edgedistill.distill.tokenization import load_tokenizer
from edgedistill.distill.transfer_texts import adjacent, held_out_texts, leak_filter
from edgedistill.export import bundle_stage, stages, validate
from edgedistill.export.onnx_export import ExportError

CURVE_POINTS = 41
THREADS = 2


def fit_temperature(logits: np.ndarray, labels: np.ndarray) -> float:
    """The softmax temperature minimising the negative log-likelihood of `labels`: a grid over log T, refined."""

    def nll(temperature: float) -> float:
        p = softmax(logits, temperature)[np.arange(len(labels)), labels]
        return float(-np.log(np.clip(p, 1e-12, None)).mean())

    grid = np.exp(np.linspace(np.log(0.05), np.log(20.0), 61))
    best = min(grid, key=nll)
    fine = best * np.exp(np.linspace(-0.1, 0.1, 41))
    return float(min(fine, key=nll))


def choose_threshold(scores: np.ndarray, agrees: np.ndarray, target: float) -> tuple[float, float]:
    """The lowest threshold on `scores` such that keeping the texts at or above it, and passing the rest on (counted
    as agreeing), agrees on at least `target` of all texts; and the share kept. Nothing kept: threshold +inf."""
    order = np.argsort(-scores, kind="stable")
    sorted_scores, wrong = scores[order], np.cumsum(~agrees[order])
    allowed = (1 - target) * len(scores) + 1e-9
    # Keep the first k texts only where the score drops after the k-th, so `>= threshold` keeps exactly k.
    ends = np.flatnonzero(np.append(sorted_scores[1:] < sorted_scores[:-1], True))
    fits = ends[wrong[ends] <= allowed]
    if len(fits) == 0:
        return float("inf"), 0.0
    last = fits[-1]
    return float(sorted_scores[last]), (last + 1) / len(scores)


def unreached(member: str, cfg: CascadeRecipe, name: str, texts: int, unlike: int) -> ExportError:
    """The error of a member of cascade `name` that no calibration text reaches, the members before it keeping all
    `texts`, `unlike` of them answered unlike the last member: where none is, no target_agreement passes one on."""
    last = cfg.members[-1]
    drop = f"drop the cascade (export.cascades.{name}: null)" if member == last else "drop it from the members"
    head = (
        f"cascade member {member}: no calibration text reaches it, as the members before it keep all {texts} at "
        f"target_agreement {cfg.target_agreement}"
    )
    if unlike:
        return ExportError(
            f"{head}, answering {unlike} of them unlike {last}: raise target_agreement, which passes those on, or {drop}"
        )
    return ExportError(
        f"{head}, answering every one as {last} does, so that no target_agreement (1.0 included) passes one on: "
        f"{drop}, or calibrate on more texts (export.cascades.{name}.calibration_sentences, read further into "
        "transfer.unlabelled_files)"
    )


def fit_routing(
    calibration: list[np.ndarray], cfg: CascadeRecipe, name: str
) -> tuple[list[tuple[float | None, float]], float]:
    """Each member's (threshold, temperature) of cascade `name` from every member's logits on the calibration texts,
    the last's (None, 1.0), and the share of the texts the first member keeps. A member that no calibration text
    reaches (the last included), or that keeps none of those that do, is refused (`ExportError`): it would run on texts
    and answer none of them; so is one with a non-finite logit on a text, whose confidence (or, for the last, whose
    label) is undefined."""
    for member, logits in zip(cfg.members, calibration, strict=True):
        if undefined := int((~np.isfinite(logits)).any(-1).sum()):
            raise ExportError(
                f"cascade member {member} gives a non-finite logit (inf or NaN) on {undefined} of the "
                f"{len(logits)} calibration texts, where no threshold can be chosen: fix its bundle "
                f"(export.bundles.{member}, e.g. a precision that does not overflow) or drop it from the members"
            )
    reference = calibration[-1].argmax(-1)
    routing, reaching, first_kept = [], np.ones(len(reference), dtype=bool), None
    unlike = 0  # texts kept by a member answering unlike the last
    for member, logits in zip(cfg.members[:-1], calibration[:-1], strict=True):
        if not reaching.any():
            raise unreached(member, cfg, name, len(reference), unlike)
        temperature = fit_temperature(logits[reaching], reference[reaching]) if cfg.temperature_scaling else 1.0
        scores = confidence(logits, cfg.rule, temperature)
        agrees = logits.argmax(-1) == reference
        threshold, kept = choose_threshold(scores[reaching], agrees[reaching], cfg.target_agreement)
        if not kept:
            raise ExportError(
                f"cascade member {member} keeps none of the {reaching.sum()} calibration texts that reach it at "
                f"target_agreement {cfg.target_agreement} (its surest answers disagree with {cfg.members[-1]}'s): "
                "drop it or lower target_agreement"
            )
        first_kept = round(kept, 4) if first_kept is None else first_kept
        keeps = reaching & (scores >= threshold)
        unlike += int((keeps & ~agrees).sum())
        reaching &= ~keeps
        routing.append((threshold, temperature))
    if not reaching.any():
        raise unreached(cfg.members[-1], cfg, name, len(reference), unlike)
    return [*routing, (None, 1.0)], first_kept  # the last member answers what reaches it


def calibration_texts(recipe: Recipe, count: int) -> tuple[list[str], list[str] | None]:
    """Up to `count` unlabelled texts (for a pair task, adjacent sentences of a line, paired as the transfer set pairs
    them) from the lines after those the transfer set read (as many as it takes), in its text style; a text, or a
    pair with either side, overlapping a dev or test text is left out."""
    cfg = recipe.transfer  # unlabelled_max_lines is set: a recipe with cascades refuses to load without
    lines = itertools.islice(unlabelled_lines(cfg.unlabelled_files), cfg.unlabelled_max_lines, None)  # as needed
    leaks = leak_filter(held_out_texts(load_dev(recipe.data), load_test(recipe.data)), cfg.text_style)
    examples = []
    read = 0  # lines past the transfer set's, for the message when they hold too few texts
    for line in lines:
        read += 1
        sentences = split_sentences(line, cfg.text_style)
        candidates = adjacent(sentences) if recipe.data.pairs else [(sentence,) for sentence in sentences]
        examples.extend(sides for sides in candidates if not any(leaks(side) for side in sides))
        if len(examples) >= count:
            break
    if len(examples) < min(count, 100):
        raise ExportError(
            f"cascade calibration found {len(examples)} unlabelled texts in the {read} lines of "
            f"transfer.unlabelled_files past the transfer set's {cfg.unlabelled_max_lines}, and needs "
            f"{min(count, 100)}: lower transfer.unlabelled_max_lines or add unlabelled text (either changes the "
            "transfer set's settings, so it is labelled again and every student trained again)"
        )
    examples = examples[:count]
    return [sides[0] for sides in examples], ([sides[1] for sides in examples] if recipe.data.pairs else None)


class Member:
    """A member bundle opened once, through ONNX Runtime or TensorRT as it is served, for calibration and dev; as a
    context manager, closed on leaving it (an engine holds device memory and a CUDA stream until then)."""

    def __init__(self, folder: Path):
        bundle, files = read_bundle(folder)
        self.max_length, self.segments = bundle.spec.max_length, bundle.spec.pair_segments
        self.runner = open_bundle(bundle, model=files.model, threads=THREADS, max_batch=validate.DEV_BATCH)
        self.run = validate.logits_runner(self.runner)

    def __enter__(self) -> "Member":
        return self

    def __exit__(self, *exc) -> None:
        self.runner.close()

    def logits(self, tokenizer, texts: list[str], pairs: list[str] | None) -> np.ndarray:
        """The member's logits on texts (and pairs, with the segment ids its spec's `pair_segments` makes)."""
        feats = bundle_stage.token_features(tokenizer, texts, pairs, self.max_length, self.segments)
        return validate.dev_logits(validate.as_forward(self.run), feats, tokenizer.pad_token_id)


def _curve(dev_logits: list[np.ndarray], spec: CascadeSpec, labels: list[int], calibration: np.ndarray) -> list[dict]:
    """Dev accuracy and escalated share as the first member's threshold sweeps the calibration scores' quantiles."""
    points = []
    for threshold in sorted(set(np.quantile(calibration, np.linspace(0, 1, CURVE_POINTS)).tolist())):
        members = [spec.members[0].model_copy(update={"threshold": threshold}), *spec.members[1:]]
        logits, answered_by = route(dev_logits, spec.model_copy(update={"members": members}))
        points.append(
            {
                "threshold": round(threshold, 6),
                "dev_accuracy": float((logits.argmax(-1) == np.asarray(labels)).mean()),
                "escalated": float((answered_by > 0).mean()),
            }
        )
    return points


def build_stage(inputs: Inputs, name: str) -> Built:
    """The body of `export.stages.cascade`."""
    recipe = inputs.recipe
    cfg: CascadeRecipe = recipe.export.cascades[name]
    tokenizer = load_tokenizer(str(inputs.parent("teacher")))
    folders = [inputs.parent(f"bundle-{member}") for member in cfg.members]
    texts, pairs = calibration_texts(recipe, cfg.calibration_sentences)
    if len(texts) < cfg.calibration_sentences:
        print(
            f"[bundle-{name}] warning: cascade calibration found {len(texts)} of the {cfg.calibration_sentences} "
            f"unlabelled texts export.cascades.{name}.calibration_sentences asks for in transfer.unlabelled_files "
            f"past the transfer set's {recipe.transfer.unlabelled_max_lines} lines, and chooses the thresholds on "
            f"those {len(texts)}: add unlabelled text, or lower transfer.unlabelled_max_lines or calibration_sentences"
        )
    split = load_dev(recipe.data)
    dev = split.as_served(recipe.text_style)
    with contextlib.ExitStack() as members:  # each opened one closed, also where a later one fails to open or run
        opened = [members.enter_context(Member(folder)) for folder in folders]
        calibration = [member.logits(tokenizer, texts, pairs) for member in opened]
        dev_logits = [member.logits(tokenizer, dev.texts, dev.pairs) for member in opened]  # as the server writes them
    reference = calibration[-1].argmax(-1)
    routing, first_kept = fit_routing(calibration, cfg, name)
    spec = CascadeSpec(
        name=f"{recipe.name}-{name}",
        labels=recipe.data.label_names,
        text_inputs=text_inputs(recipe.data.pairs),
        rule=cfg.rule,
        members=[
            CascadeMember(
                bundle=member,
                manifest_sha256=mf.sha256_file(folder / mf.MANIFEST),
                threshold=threshold,
                temperature=temperature,
            )
            for member, folder, (threshold, temperature) in zip(cfg.members, folders, routing, strict=True)
        ],
    ).content_versioned()  # the spec holds the members' manifest hashes
    answers, answered_by = route(dev_logits, spec)
    figures = task_metrics(answers, dev.labels, recipe.data)
    shares = np.bincount(answered_by, minlength=len(folders)) / len(dev)
    first = confidence(calibration[0], cfg.rule, spec.members[0].temperature)
    curve = _curve(dev_logits, spec, dev.labels, first)
    calibration_agreement = float((route(calibration, spec)[0].argmax(-1) == reference).mean())
    member_accuracy = {
        member: float((logits.argmax(-1) == np.asarray(dev.labels)).mean())
        for member, logits in zip(cfg.members, dev_logits, strict=True)
    }

    def write(folder: Path) -> None:
        for member, source in zip(cfg.members, folders, strict=True):
            shutil.copytree(source, folder / MEMBERS / member)

    escalated = float(1 - shares[0])
    return Built(
        write,
        metrics={
            "dev_accuracy": figures["dev_accuracy"],
            **{k: v for k, v in figures.items() if k.startswith("dev_") and k != "dev_confusion"},
            "dev_escalated": escalated,
            "expected_escalated": round(1 - first_kept, 4),
            "calibration_agreement": calibration_agreement,
            "calibration_texts": len(texts),
            "calibration_texts_asked": cfg.calibration_sentences,
        },
        info={
            "cascade": spec.model_dump(),
            "dev_answered_share": dict(zip(cfg.members, shares.round(4).tolist(), strict=True)),
            "member_dev_accuracy": member_accuracy,
            "curve": curve,
            "recipe": cfg.model_dump(),
            DEV_EXAMPLES: split.digest(),
        },
        line=f"dev_accuracy={figures['dev_accuracy']:.4f} (members {members_line(member_accuracy)}) escalated "
        f"{escalated:.1%} of dev (expected {1 - first_kept:.1%}), threshold {spec.members[0].threshold:.4f} "
        f"at T={spec.members[0].temperature:.2f}, calibration agreement {calibration_agreement:.4f}",
    )


def members_line(accuracy: dict[str, float]) -> str:
    """`a 0.7067, b 0.6900`: each member's dev accuracy, as the stage's line gives figures."""
    return ", ".join(f"{name} {value:.4f}" for name, value in accuracy.items())


def build(recipe: Recipe, names: list[str], force: bool = False) -> list[mf.Manifest]:
    """The cascades `names` of the recipe (`export.stages.of_command` chooses them). One named with `--only` whose
    members this machine cannot run fails at once, naming each such member and why, before any work."""
    for name in names:
        if reasons := cascade_missing_here(recipe.export, name):
            raise ProviderFallback(f"cascade {name}: {reasons}. {GPU_HINT}")
    return [stages.cascade(recipe, name).run(force) for name in names]
