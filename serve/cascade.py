"""A served confidence cascade: member bundles, cheapest first, each with its own backend and batcher.

A request's texts go to the first member; the texts it does not keep (`common.cascade.keeps`: a confidence
below its threshold, or undefined) go on to the next member's batcher, where escalated texts of many requests
share batches; the last member answers what reaches it. When the next member's queue cannot take all of a
request's escalated texts, `CASCADE_OVERLOAD` decides: `answer` sends on those it can take (the least
confident first, an undefined confidence least of all) and has the earlier member answer the rest, flagged;
`refuse` fails the request (`Overloaded`). Warm-up checks, on fixed probe texts, that this routing gives the
answers of `common.cascade.route` on every member's logits.
"""

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path

import numpy as np
from edgedistill.common import manifest as mf
from edgedistill.common.cascade import (
    Cascade,
    CascadeSpec,
    is_cascade,
    keeps,
    least_sure_first,
    load_cascade,
    on_onnx_runtime,
    route,
    served_bundles,
)
from edgedistill.serve.errors import (
    BatcherClosed,
    BundleRejected,
    InvalidInput,
    Overloaded,
    ServerFault,
    UnreadableText,
)
from edgedistill.serve.host import MemberDescription, ModelDescription, ModelRuntime, Scores, check_pairs
from edgedistill.serve.metrics import MemberObserver, Metrics
from edgedistill.serve.settings import Settings, env_name, flag_name

log = logging.getLogger(__name__)

# Texts the routing check at warm-up runs through every member: varied in length and in how sure a model is.
PROBE_TEXTS = (
    "a great movie",
    "the worst film of the year",
    "it was fine",
    "an uneven but often moving story , with one wonderful performance and a plot that goes nowhere",
    "not bad",
    "dull",
    "i loved the acting and hated the ending",
    "the",
)
PROBE_PAIRS = tuple(reversed(PROBE_TEXTS))
LOGITS_TOLERANCE = 1e-5  # the same text run alone twice may differ by this much (a runtime's kernel choice)

# (member index, texts, pairs) -> the member's (N, labels) logits
RunMember = Callable[[int, list[str], list[str] | None], Awaitable[np.ndarray]]
# (member index, rows escalated to it, their (N, labels) logits at the member before) -> the rows it takes
Admit = Callable[[int, np.ndarray, np.ndarray], np.ndarray]


def pick(values: list[str] | None, rows: np.ndarray) -> list[str] | None:
    return None if values is None else [values[i] for i in rows.tolist()]


class CascadeRuntime:
    """A verified cascade, one `ModelRuntime` per member (with its `MemberObserver` where there are `metrics`); serves
    as a `ModelRuntime` does (see its docstring)."""

    def __init__(
        self,
        cascade: Cascade,
        members: list[ModelRuntime],
        settings: Settings,
        metrics: Metrics | None = None,
        observers: Sequence[MemberObserver] = (),
    ):
        self.cascade = cascade
        self.spec: CascadeSpec = cascade.spec
        self.members = members
        self.observers = observers
        self.ids = [member.bundle for member in self.spec.members]
        self.settings = settings
        self.metrics = metrics
        self.manifest_sha256 = cascade.manifest_sha256
        self._inflight = 0
        self._idle = asyncio.Event()
        self._idle.set()
        self._closing = False

    @classmethod
    def load(
        cls,
        folder: str | Path,
        settings: Settings,
        metrics: Metrics | None = None,
        on_fault: Callable[[ServerFault], None] | None = None,
    ) -> "CascadeRuntime":
        """Check the cascade in `folder` (each member's manifest against the hash it recorded) and load each member
        as a bundle, which verifies every file of the member as it reads it; `BundleRejected` says why it cannot be
        served."""
        try:
            cascade = load_cascade(folder, verify=False)  # each member's files are verified as ModelRuntime reads them
        except mf.ArtifactError as err:
            raise BundleRejected(f"cascade refused: {err}") from err
        observers = (
            [] if metrics is None else [metrics.member(cascade.spec.name, m.bundle) for m in cascade.spec.members]
        )
        members: list[ModelRuntime] = []
        try:
            for index, (member, bundle) in enumerate(zip(cascade.spec.members, cascade.members, strict=True)):
                observer = observers[index] if observers else None
                try:
                    runtime = ModelRuntime.load(bundle.folder, settings, observer, on_fault)
                except BundleRejected as err:
                    raise BundleRejected(f"cascade {folder}: member {member.bundle}: {err}") from err
                members.append(runtime)
                if runtime.manifest_sha256 != member.manifest_sha256:  # swapped since load_cascade checked it
                    raise BundleRejected(
                        f"cascade {folder}: member {member.bundle} changed while it was loaded (its manifest's "
                        "sha256 differs from the cascade's): rebuild or copy the cascade again"
                    )
        except BaseException:
            for runtime in members:
                runtime.release()
            raise
        return cls(cascade, members, settings, metrics, observers)

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def version(self) -> str:
        return self.spec.version

    @property
    def folder(self) -> Path:
        return self.cascade.folder

    @property
    def max_length(self) -> int:
        """The most tokens any member reads per text: an escalated text's; each member truncates at its own."""
        return max(member.max_length for member in self.members)

    @property
    def queued_rows(self) -> int:
        return sum(member.queued_rows for member in self.members)

    def warm_up(self) -> None:
        """Warm every member up, then check the routing against `common.cascade.route` (`BundleRejected`)."""
        for member in self.members:
            member.warm_up()
        self._check_routing()

    def _check_routing(self) -> None:
        """PROBE_TEXTS through this cascade's routing give `route`'s answers on every member's logits of all of
        them: the same member per text, and its logits. Each text runs alone, so that batches of other sizes
        (padding, dynamically quantized activations) cannot blur the comparison of the routing itself."""
        texts = list(PROBE_TEXTS)
        pairs = list(PROBE_PAIRS) if self.spec.pairs else None

        def alone(index: int, texts: list[str], pairs: list[str] | None) -> np.ndarray:
            member = self.members[index]
            return np.concatenate([member.logits([text], pick(pairs, np.array([i]))) for i, text in enumerate(texts)])

        async def run_alone(index: int, texts: list[str], pairs: list[str] | None) -> np.ndarray:
            return alone(index, texts, pairs)

        expected, expected_by = route([alone(i, texts, pairs) for i in range(len(self.members))], self.spec)
        routed = asyncio.run(self._route(texts, pairs, run_alone, lambda index, rows, logits: rows))
        answered_by = np.array([self.ids.index(member) for member in routed.answered_by])
        if (answered_by != expected_by).any():
            raise BundleRejected(
                f"cascade {self.folder}: routing check failed: the members answering the probe texts "
                f"{answered_by.tolist()} differ from common.cascade.route's {expected_by.tolist()}"
            )
        difference = float(np.abs(routed.logits - expected).max())
        if difference > LOGITS_TOLERANCE:
            raise BundleRejected(
                f"cascade {self.folder}: routing check failed: the answers' logits differ from "
                f"common.cascade.route's by {difference:.3g} (limit {LOGITS_TOLERANCE:g})"
            )
        log.info(
            "cascade routing checked on %d probe texts: answered per member %s",
            len(texts),
            np.bincount(answered_by, minlength=len(self.members)).tolist(),
            extra={"event": "cascade_checked", "members": self.ids},
        )

    async def start(self) -> None:
        for member in self.members:
            await member.start()

    def grace_ends(self, deadline: float) -> None:
        """The shutdown cancels the calls still running at loop time `deadline`: each member's batcher is told."""
        for member in self.members:
            member.grace_ends(deadline)

    def retire(self) -> None:
        """Leave the shared gauges to the runtime that replaced this cascade, while its requests finish; once closed,
        a member's queue depth that runtime does not write reads 0 (`Metrics.member_closed`)."""
        for member in self.members:
            member.retire()

    async def classify(self, texts: list[str], pairs: list[str] | None, deadline: float | None) -> Scores:
        """Texts (and pairs) through the cascade, each member's part through its batcher; the answers name the
        member that gave each."""
        check_pairs(self.spec, pairs)
        if self._closing:
            raise BatcherClosed("the model is shutting down or being replaced; retry")

        waits = []  # at each member reached

        async def through_batcher(index: int, texts: list[str], pairs: list[str] | None) -> np.ndarray:
            scores = await self.members[index].classify(texts, pairs, deadline)
            waits.append(scores.queue_wait)
            return scores.logits

        self._inflight += 1
        self._idle.clear()
        try:
            scores = await self._route(texts, pairs, through_batcher, self._admissible)
        finally:
            self._inflight -= 1
            if not self._inflight:
                self._idle.set()
        if self.metrics is not None:
            self.metrics.request_done(sum(waits))  # once per request, as a bundle's batcher records it
            answered = np.array([self.ids.index(member) for member in scores.answered_by])
            for index, observer in enumerate(self.observers):
                observer.routed(
                    answered=int((answered == index).sum()),
                    escalated=int((answered > index).sum()),
                    refused=int(((answered == index) & scores.escalation_refused).sum()),
                )
        return scores

    async def _route(self, texts: list[str], pairs: list[str] | None, run: RunMember, admit: Admit) -> Scores:
        """The cascade's answers, each member `run` on the texts that reach it and that it `admit`s (the others
        answered by the member before, flagged)."""
        count = len(texts)
        logits = np.empty((count, len(self.spec.labels)), dtype=np.float32)
        answered = np.zeros(count, dtype=np.intp)
        refused = np.zeros(count, dtype=bool)
        reaching = np.arange(count)
        for index, member in enumerate(self.spec.members):
            if index:
                taken = admit(index, reaching, logits[reaching])
                refused[np.setdiff1d(reaching, taken)] = True
                reaching = taken
                if not len(reaching):
                    break
            try:
                logits[reaching] = await run(index, pick(texts, reaching), pick(pairs, reaching))
            except UnreadableText as err:  # numbered among the rows that reached the member: name the request's
                raise err.at(int(reaching[err.row]), f"cascade member {self.ids[index]}'s tokenizer") from None
            answered[reaching] = index
            if member.threshold is None:
                break
            reaching = reaching[~keeps(logits[reaching], self.spec, index)]
            if not len(reaching):
                break
        return Scores(logits, [self.ids[i] for i in answered.tolist()], refused)

    def _admissible(self, index: int, reaching: np.ndarray, logits: np.ndarray) -> np.ndarray:
        """The rows of `reaching` (with the member before's `logits`) that go on to member `index`: all of them while
        its queue has room; else, with CASCADE_OVERLOAD=answer, the least confident that fit (in row order; an
        undefined confidence, from a non-finite logit, counts as the least), and with `refuse`, `Overloaded`."""
        batcher = self.members[index].batcher
        room = batcher.room
        if room >= len(reaching):
            return reaching
        if self.settings.cascade_overload == "refuse":  # the failed request is counted as such, none of its texts
            raise Overloaded(
                f"cascade member {self.ids[index]} cannot take {len(reaching)} escalated texts: {room} of its "
                f"{batcher.max_queued} queue places are free (CASCADE_OVERLOAD=refuse); retry with backoff"
            )
        return np.sort(reaching[least_sure_first(logits, self.spec, index - 1)[:room]])

    async def classify_ids(self, tensors: dict[str, np.ndarray], deadline: float | None) -> Scores:
        raise self.token_ids_refused()

    def token_ids_refused(self) -> InvalidInput:
        """The refusal of token ids sent to this cascade, whose members each take texts."""
        return InvalidInput(
            f"model {self.name!r} is a confidence cascade, whose members tokenize on their own: send BYTES 'text' "
            "(and 'text_pair'), not token ids"
        )

    def describe(self) -> ModelDescription:
        members = [member.describe() for member in self.members]
        providers = dict.fromkeys(p for member in members for p in member.providers)
        return ModelDescription(
            name=self.name,
            version=self.version,
            labels=tuple(self.spec.labels),
            text_inputs=tuple(self.spec.text_inputs),
            max_length=self.max_length,
            runtime="cascade",
            precision="",
            arch="cascade",
            providers=tuple(providers),
            inputs=(),
            bundle_path=str(self.folder),
            bundle_sha256=self.manifest_sha256,
            max_batch_size=min(
                member.max_batch_size for member in members
            ),  # the most rows every member takes in one call
            text_style=members[0].text_style,
            cascade_rule=self.spec.rule,
            cascade_members=tuple(
                MemberDescription(model, member.threshold, member.temperature)
                for model, member in zip(members, self.spec.members, strict=True)
            ),
        )

    async def close(self, timeout: float | None = None) -> None:
        """Take no new requests; let those in progress finish within `timeout` seconds (default:
        SHUTDOWN_GRACE_S), then close the members (what is still queued at the limit fails)."""
        timeout = self.settings.shutdown_grace_s if timeout is None else timeout
        self._closing = True
        loop = asyncio.get_running_loop()
        end = loop.time() + timeout
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._idle.wait(), timeout)
        for member in self.members:
            await member.close(max(0.0, end - loop.time()))


def load_runtime(
    folder: str | Path,
    settings: Settings,
    metrics: Metrics | None = None,
    on_fault: Callable[[ServerFault], None] | None = None,
) -> ModelRuntime | CascadeRuntime:
    """The runtime serving `folder`: a cascade's when it holds one (`common.cascade.is_cascade`), else a bundle's;
    `BundleRejected` for `settings` it would not use (`refuse_unused_by`), at start as for a reload."""
    cascade = is_cascade(folder)
    refuse_unused_by(folder, settings, cascade)
    if cascade:
        return CascadeRuntime.load(folder, settings, metrics, on_fault)
    return ModelRuntime.load(folder, settings, metrics, on_fault)


def refuse_unused_by(folder: str | Path, settings: Settings, cascade: bool) -> None:
    """`BundleRejected` naming a setting given (flag or variable) that the runtime serving `folder` (a `cascade` or
    not) would not use: CASCADE_OVERLOAD for a bundle that is no cascade; PROVIDERS, THREADS, SPIN or
    ALLOW_CPU_FALLBACK, which set ONNX Runtime's session, where every model is a TensorRT engine (THREADS=0, SPIN and
    ALLOW_CPU_FALLBACK false and no PROVIDERS, the defaults, ask for nothing). A folder that cannot be read is left to
    the load, which says why."""
    try:
        bundles = served_bundles(folder)
    except (mf.ArtifactError, ValueError, OSError):
        return
    if not cascade and "cascade_overload" in settings.model_fields_set:
        raise BundleRejected(
            f"{folder} is a single bundle, not a confidence cascade: {env_name('cascade_overload')} "
            f"({flag_name('cascade_overload')}) {settings.cascade_overload} would do nothing; unset it, or serve a "
            "cascade"
        )
    shown = {
        "providers": ",".join(settings.providers),
        "threads": str(settings.threads),
        "spin": "true",
        "allow_cpu_fallback": "true",
    }
    given = [f"{env_name(name)} ({flag_name(name)}) {shown[name]}" for name in shown if getattr(settings, name)]
    if given and not on_onnx_runtime(bundles):
        models = "every member of the cascade is" if cascade else "it is"
        raise BundleRejected(
            f"{folder}: {models} a TensorRT engine (runtime 'tensorrt'), which runs on its GPU without ONNX Runtime: "
            f"{' and '.join(given)} would do nothing; unset {'them' if len(given) > 1 else 'it'}, or serve an ONNX "
            "bundle (runtime 'onnxruntime')"
        )
