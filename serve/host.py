"""The served model: a verified bundle with its tokenizer, backend and batcher, and the host that swaps it.

`ModelRuntime` turns texts (or token ids) into logits and probabilities through the batcher.
`ModelHost` holds the current runtime, answers for a model name/version, and reloads a bundle
without dropping requests: the new runtime is loaded and warmed while the old one serves, then
swapped in; the old one finishes what it had queued. A fault of a runtime's batcher (`ServerFault`)
breaks the host for good: it stops answering and says it is not live, so the server exits for its
supervisor to restart it. Once draining, the host installs no model any more. `reload_folder` decides what a
Reload call may have the host load: nothing without an admin token, a named folder only inside the reload root.
"""

import asyncio
import contextlib
import contextvars
import logging
import os
import time
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from functools import cached_property
from pathlib import Path

import numpy as np
from edgedistill.common import manifest as mf
from edgedistill.common.bundle import REBUILD, Bundle, NotABundle, ServedFiles, ServedModel, read_bundle
from edgedistill.common.cascade import softmax
from edgedistill.common.runtime import DeviceError
from edgedistill.common.textstyle import Style
from edgedistill.serve.backend import load_backend
from edgedistill.serve.batching import BatchObserver, DynamicBatcher, pad_rows
from edgedistill.serve.costmodel import INLINE_TOKENIZE_CHARS, Timing, runs_inline
from edgedistill.serve.encoding import TextEncoder
from edgedistill.serve.errors import (
    BatcherClosed,
    BundleRejected,
    InvalidInput,
    ModelNotFound,
    NotReady,
    PermissionDenied,
    ReloadFailed,
    ServerFault,
    TooLarge,
    UnreadableText,
)
from edgedistill.serve.logs import MODEL
from edgedistill.serve.metrics import Metrics
from edgedistill.serve.settings import Settings

log = logging.getLogger(__name__)

WARM_UP_TIMINGS = 2  # timed calls per warm-up shape for the batcher's cost model
WARM_UP_TEXT = "a warm up sentence to prime the model"
# Threads that tokenize large requests. The tokenizer spreads a batch over its own threads, so more of ours
# would only contend for the same cores; the batcher's admission bounds how many requests wait for them.
TOKENIZE_THREADS = 2


@dataclass
class Scores:
    logits: np.ndarray  # (N, labels) float32
    answered_by: list[str] | None = None  # a cascade's: per row, the bundle id of the member that answered
    escalation_refused: np.ndarray | None = None  # a cascade's: (N,) bool, rows the next member's queue refused
    queue_wait: float = 0.0  # seconds its first row waited before a batch took it

    @cached_property
    def probabilities(self) -> np.ndarray:
        """(N, labels) float32, computed when first asked for: a call that wants only logits skips it."""
        return softmax(self.logits).astype(np.float32)


@dataclass(frozen=True)
class ModelDescription:
    """What a runtime serves, as GetModelInfo answers and the logs record it."""

    name: str
    version: str
    labels: tuple[str, ...]
    text_inputs: tuple[str, ...]
    max_length: int
    runtime: str
    precision: str
    arch: str
    providers: tuple[str, ...]
    inputs: tuple[str, ...]
    bundle_path: str
    bundle_sha256: str
    max_batch_size: int
    text_style: Style
    cascade_rule: str = ""
    cascade_members: tuple["MemberDescription", ...] = ()


@dataclass(frozen=True)
class MemberDescription:
    """A cascade's member: its bundle, the confidence threshold at which it keeps a text (None: the last member)
    and the temperature the confidence is measured at."""

    model: ModelDescription
    threshold: float | None
    temperature: float


@dataclass(frozen=True)
class Checked:
    """A request's texts (and pairs) as `check_texts` leaves them, which of them it cut: (kind, row) pairs, the kind
    "text" or "text pair"; and what is wrong with its first blank pair, told once the model is known to take pairs."""

    texts: list[str]
    pairs: list[str] | None
    cut: frozenset[tuple[str, int]]
    blank_pair: str | None = None

    def classify(self, runtime: "ModelRuntime", deadline: float | None) -> Awaitable["Scores"]:
        """`runtime.classify` of these texts, once their pairs suit its model (`check_pairs`: a single-text model is
        told it takes none before it is told that one is blank) and none is blank."""
        check_pairs(runtime.spec, self.pairs)
        if self.blank_pair:
            raise InvalidInput(self.blank_pair)
        return runtime.classify(self.texts, self.pairs, deadline)


def _blank(kind: str, i: int, value: str, max_chars: int) -> str | None:
    """What is wrong with text (or pair: `kind`) `i`, `value`, where it shows nothing in its first `max_chars`."""
    if value[:max_chars].strip():
        return None
    if not value.strip():
        return f"{kind} {i} is empty or whitespace only"
    return (  # the words come after the part the server reads
        f"{kind} {i} is whitespace only in its first {max_chars} characters (MAX_TEXT_CHARS), all of a text the "
        "server reads: send it without the leading whitespace"
    )


def check_texts(texts: Sequence[str], pairs: Sequence[str] | None, max_texts: int, max_chars: int) -> Checked:
    """Validated texts (and pairs), each cut to `max_chars` characters, as lists; their numbers are checked first. A
    blank pair is recorded, not refused, as the model is not known yet (`Checked.classify`)."""
    if not texts:
        raise InvalidInput("empty request: send at least one text")
    if len(texts) > max_texts:
        raise TooLarge(f"{len(texts)} texts in one request; the limit is {max_texts}: split the request")
    if pairs is not None and len(pairs) != len(texts):
        raise InvalidInput(  # the model is not known yet: the advice holds for either kind
            f"{len(pairs)} text pairs for {len(texts)} texts: send one pair per text (none to a model of single texts)"
        )
    for i, value in enumerate(texts):
        if problem := _blank("text", i, value, max_chars):
            raise InvalidInput(problem)
    blank_pair = next(
        filter(None, (_blank("text pair", i, value, max_chars) for i, value in enumerate(pairs or []))), None
    )
    cut = frozenset(
        (kind, i) for kind, values in (("text", texts), ("text pair", pairs or [])) for i, value in enumerate(values)
        if len(value) > max_chars
    )  # fmt: skip
    cut_pairs = None if pairs is None else [p[:max_chars] for p in pairs]
    return Checked([t[:max_chars] for t in texts], cut_pairs, cut, blank_pair)


@contextlib.contextmanager
def named_if_cut(checked: Checked, max_chars: int):
    """Re-raise an `UnreadableText` of a text (or pair) that `check_texts` cut to `max_chars` characters naming the
    limit: what the tokenizer keeps may lie past it, as in a text padded with zero-width characters."""
    try:
        yield
    except UnreadableText as err:
        if (err.kind, err.row) not in checked.cut:
            raise
        raise err.cut_at(max_chars) from None


def check_pairs(spec: ServedModel, pairs: list[str] | None) -> None:
    """A pair model needs a pair for every text; a single-text model takes none."""
    if spec.pairs and pairs is None:
        raise InvalidInput(
            f"model {spec.name!r} takes text pairs: send a pair for every text (Classify: text_pairs; "
            "KServe: a BYTES 'text_pair' input beside 'text')"
        )
    if not spec.pairs and pairs is not None:
        raise InvalidInput(
            f"model {spec.name!r} takes single texts, not text pairs: send no text_pairs (KServe: no 'text_pair' input)"
        )


def _unreadable() -> str:
    """Advice for a bundle file the server may not open: one written under `umask 077`, mounted into the image, whose
    user is not its owner."""
    return (
        f" (this server runs as uid {os.getuid()}, gid {os.getgid()}: make the bundle readable by it, e.g. "
        "chmod -R a+rX on its folder)"
    )


class ModelRuntime:
    """One loaded bundle, ready to warm up and serve: its tokenizer and model opened from `files`, the bytes
    verified against its manifest (`ModelRuntime.load` reads them).

    What the host and the servicers use of it, `serve.cascade.CascadeRuntime` has too: `name`, `version`, `spec`
    (name, version, labels, text_inputs), `folder`, `max_length`, `queued_rows`, `warm_up`, `start`,
    `classify`, `classify_ids`, `describe` and `close`."""

    def __init__(
        self,
        bundle: Bundle,
        files: ServedFiles,
        settings: Settings,
        observer: BatchObserver | None = None,
        on_fault: Callable[[ServerFault], None] | None = None,
    ):
        self.bundle = bundle
        self.spec = bundle.spec
        self.settings = settings
        self.manifest_sha256 = bundle.manifest_sha256
        if not self.spec.outputs:
            raise BundleRejected(f"{bundle.folder}: the bundle spec names no outputs")
        self.output = self.spec.outputs[0].name
        self.encoder = TextEncoder.for_bundle(bundle, files.tokenizer)
        self.backend = load_backend(bundle, settings, model=files.model)
        self._tokenizing = ThreadPoolExecutor(TOKENIZE_THREADS, thread_name_prefix="tokenize")
        largest = settings.largest_batch
        self.max_batch_size = min(largest, self.backend.max_batch_size or largest)
        self.batcher = DynamicBatcher(
            self._infer_logits,
            max_batch_size=self.max_batch_size,
            max_delay=settings.max_queue_delay,
            inline_max=settings.inline_infer,
            max_queued=settings.max_queued,
            pad_values=self.encoder.pad_values,
            observer=observer,
            batch_timeout=settings.batch_timeout_s,
            on_fault=on_fault,
        )

    def _infer_logits(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The backend's logits alone, for the batcher: it stacks every output of a request's rows, and another output
        (one per token, say) is as long as its batch's padded rows, which differ between a request's batches."""
        return {self.output: self.backend.infer(inputs)[self.output]}

    @classmethod
    def load(
        cls,
        folder: str | Path,
        settings: Settings,
        observer: BatchObserver | None = None,
        on_fault: Callable[[ServerFault], None] | None = None,
    ) -> "ModelRuntime":
        """Verify and load the bundle in `folder`, each file read once; `BundleRejected` says why it cannot be
        served."""
        try:
            return cls(*read_bundle(folder), settings, observer, on_fault)
        except NotABundle as err:  # says which folder to name instead
            raise BundleRejected(f"bundle refused: {err}") from err
        except mf.ArtifactError as err:
            if isinstance(err.__cause__, PermissionError):
                raise BundleRejected(f"bundle refused: {err}{_unreadable()}") from err
            built = (Path(folder) / mf.MANIFEST).is_file()  # else the error says what to build
            again = f"; {REBUILD}" if built else ""
            raise BundleRejected(f"bundle refused: {err}{again}") from err
        except OSError as err:  # unreadable (permissions, a file gone since verified), or a name too long to look up
            denied = _unreadable() if isinstance(err, PermissionError) else ""
            raise BundleRejected(
                f"bundle refused: cannot read {err.filename or folder}: {err.strerror or err}{denied}"
            ) from err

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def version(self) -> str:
        return self.spec.version

    @property
    def folder(self) -> Path:
        return self.bundle.folder

    @property
    def max_length(self) -> int:
        return self.spec.max_length

    @property
    def queued_rows(self) -> int:
        return self.batcher.queued_rows

    async def start(self) -> None:
        """Start taking batches (after `warm_up`)."""
        self.batcher.start()

    def retire(self) -> None:
        """Leave the shared gauges to the runtime that replaced this one (`DynamicBatcher.retire`)."""
        self.batcher.retire()

    def grace_ends(self, deadline: float) -> None:
        """The shutdown cancels the calls still running at loop time `deadline` (`DynamicBatcher.grace_ends`)."""
        self.batcher.grace_ends(deadline)

    def logits(self, texts: list[str], pairs: list[str] | None) -> np.ndarray:
        """(N, labels) float32 logits of texts (and pairs) in one backend call, outside the batcher."""
        rows = self.encoder.encode(texts, pairs)
        outputs = self.backend.infer(pad_rows(rows, self.encoder.pad_values))
        return np.asarray(outputs[self.output], dtype=np.float32)

    def warm_up(self) -> None:
        """Run the backend at several batch sizes and lengths, check the logits' shape and values, then time
        the same shapes again to calibrate the batcher's cost model."""
        pair = ["and its pair"] if self.spec.pairs else None
        try:
            ids = self.encoder.encode([WARM_UP_TEXT], pair)[0]
        except InvalidInput as err:  # a tokenizer that keeps nothing of plain words cannot serve any text
            raise BundleRejected(f"warm-up: the bundle's tokenizer.json reads {WARM_UP_TEXT!r} so that {err}") from None
        shapes = [
            (batch, length)
            for length in sorted({1, max(1, self.spec.max_length // 2), self.spec.max_length})
            for batch in sorted({1, self.max_batch_size})
        ]
        feeds = []
        for batch, length in shapes:
            inputs = {name: np.tile(np.resize(row, length), (batch, 1)) for name, row in ids.items()}
            if "attention_mask" in inputs:
                inputs["attention_mask"][:] = 1
            self._check_warm_up(inputs, batch, length)
            feeds.append(inputs)
        timings = []
        for (batch, length), inputs in zip(shapes, feeds, strict=True):
            for _ in range(WARM_UP_TIMINGS):
                start = time.perf_counter()
                self.backend.infer(inputs)
                timings.append(Timing(batch, length, time.perf_counter() - start))
        if len(shapes) > 1:
            self.batcher.calibrate(timings)
            cost = self.batcher.cost
            log.info(
                "backend cost %.0f us per call + %.2f us per padded token + %.4f us per padded token and position",
                cost.overhead * 1e6,
                cost.per_token * 1e6,
                cost.per_token_length * 1e6,
                extra={
                    "event": "backend_cost",
                    "overhead_s": cost.overhead,
                    "per_token_s": cost.per_token,
                    "per_token_length_s": cost.per_token_length,
                },
            )

    def _check_warm_up(self, inputs: dict[str, np.ndarray], batch: int, length: int) -> None:
        """Every output the spec names: present, `batch` rows, the spec's fixed sizes, finite; the first
        (the logits) one column per label."""
        at = f"{self.bundle.folder}: warm-up at batch {batch}, length {length}"
        try:
            outputs = self.backend.infer(inputs)
        except Exception as err:  # any runtime failure means the bundle cannot be served
            raise BundleRejected(f"{at} failed: {err}") from err
        for output in self.spec.outputs:
            if output.name not in outputs:
                raise BundleRejected(f"{at} gave no output {output.name!r} (outputs: {sorted(outputs)})")
            value = np.asarray(outputs[output.name])
            if output.name == self.output:
                expected = [batch, len(self.spec.labels)]
                what = f"expected {tuple(expected)} for labels {self.spec.labels}"
            else:  # named sizes (the batch's aside) may take any value
                expected = [batch, *output.shape[1:]]
                what = f"expected {output.shape} with batch {batch}"
            if len(value.shape) != len(expected) or any(
                isinstance(size, int) and size != got for size, got in zip(expected, value.shape, strict=False)
            ):
                raise BundleRejected(f"{at} gave {output.name} of shape {value.shape} ({what})")
            if np.issubdtype(value.dtype, np.floating) and not np.isfinite(value).all():
                raise BundleRejected(f"{at} gave {output.name} of shape {value.shape} with non-finite values")

    async def classify(self, texts: list[str], pairs: list[str] | None, deadline: float | None) -> Scores:
        """Texts (and their pairs, as the model takes them) through the model. The queue admits the rows before
        they are tokenized, so an overloaded server refuses at once. Small requests are tokenized on the event
        loop (cheaper than a thread hop), large ones in one of TOKENIZE_THREADS threads."""
        check_pairs(self.spec, pairs)
        with self.batcher.admit(len(texts)) as admission:
            if runs_inline(sum(map(len, texts)) + sum(map(len, pairs or ())), INLINE_TOKENIZE_CHARS):
                rows = self.encoder.encode(texts, pairs)
            else:
                rows = await admission.making(self._tokenizing, self.encoder.encode, texts, pairs)
        return await self.run(rows, deadline)

    async def run(self, rows: list[dict[str, np.ndarray]], deadline: float | None) -> Scores:
        result = await self.batcher.submit(rows, deadline)
        logits = result.outputs[self.output].astype(np.float32, copy=False)
        return Scores(logits, queue_wait=result.queue_wait)

    async def classify_ids(self, tensors: dict[str, np.ndarray], deadline: float | None) -> Scores:
        """(N, L) token-id tensors through the model."""
        return await self.run(self.rows_from_ids(tensors), deadline)

    def rows_from_ids(self, tensors: dict[str, np.ndarray]) -> list[dict[str, np.ndarray]]:
        """Rows from (N, L) token-id tensors; trailing positions the attention mask leaves out are trimmed. Each
        mask must be 1s then 0s: every model here reads a row's real tokens first (its length from the mask's sum)."""
        expected = set(self.spec.input_names)
        if set(tensors) != expected:
            raise InvalidInput(f"token inputs must be exactly {sorted(expected)}, got {sorted(tensors)}")
        shapes = {name: value.shape for name, value in tensors.items()}
        first = tensors["input_ids"]
        if first.ndim != 2 or any(shape != first.shape for shape in shapes.values()):
            raise InvalidInput(f"token inputs must all have the same [batch, sequence] shape, got {shapes}")
        count, length = first.shape
        if count == 0 or length == 0:
            raise InvalidInput(f"empty request: input_ids has shape {list(first.shape)}")
        if count > self.settings.max_texts:
            raise TooLarge(f"{count} rows in one request; the limit is {self.settings.max_texts}: split the request")
        if length > self.spec.max_length:
            raise InvalidInput(f"sequence length {length} exceeds the model's max_length {self.spec.max_length}")
        if first.min() < 0 or first.max() >= self.encoder.vocab_size:
            raise InvalidInput(f"input_ids must lie in [0, {self.encoder.vocab_size}) (the tokenizer's vocabulary)")
        for name in ("attention_mask", "token_type_ids"):
            if name in tensors and not np.isin(tensors[name], (0, 1)).all():
                raise InvalidInput(f"{name} must hold only 0 and 1")
        mask = tensors.get("attention_mask")
        kept = np.full(count, length) if mask is None else mask.sum(axis=1)
        if mask is not None:
            padded_elsewhere = np.flatnonzero((mask != (np.arange(length) < kept[:, None])).any(axis=1))
            if padded_elsewhere.size:
                i = padded_elsewhere[0]
                j = np.flatnonzero(np.diff(mask[i]) > 0)[0] + 1
                raise InvalidInput(
                    f"row {i}: attention_mask has a 1 after a 0 (position {j}): the model reads a row's tokens first "
                    "and its padding after them; pad on the right (a Hugging Face tokenizer: padding_side='right')"
                )
        rows = []
        for i, keep in enumerate(kept.tolist()):
            if keep == 0:
                raise InvalidInput(f"row {i}: attention_mask is all zeros")
            rows.append(
                {
                    name: np.ascontiguousarray(value[i, :keep], dtype=self.encoder.dtypes[name])
                    for name, value in tensors.items()
                }
            )
        return rows

    def describe(self) -> ModelDescription:
        return ModelDescription(
            name=self.name,
            version=self.version,
            labels=tuple(self.spec.labels),
            text_inputs=tuple(self.spec.text_inputs),
            max_length=self.spec.max_length,
            runtime=self.spec.runtime,
            precision=self.spec.precision,
            arch=self.spec.arch,
            providers=tuple(self.backend.providers),
            inputs=tuple(self.spec.input_names),
            bundle_path=str(self.bundle.folder),
            bundle_sha256=self.manifest_sha256,
            max_batch_size=self.max_batch_size,
            text_style=self.spec.text_style,
        )

    async def close(self, timeout: float | None = None) -> None:
        """Finish the queued rows within `timeout` seconds (default: SHUTDOWN_GRACE_S), then release the backend,
        unless a call still runs in it: closing it would free what the call uses, so it stays open until the process
        exits."""
        self.release(backend=await self.batcher.close(self.settings.shutdown_grace_s if timeout is None else timeout))

    def release(self, backend: bool = True) -> None:
        """Release the tokenizing threads and, with `backend`, the backend; what is being tokenized then meets the
        closed batcher. A backend its device fails to release (`DeviceError`: a CUDA error leaves the device broken
        for every later call, freeing its memory too) is logged, not raised: the error that broke it (a fault, a
        failed warm-up) is the one to report, and the process's exit frees the device."""
        self._tokenizing.shutdown(wait=False)
        if backend:
            try:
                self.backend.close()
            except DeviceError as err:
                log.warning(
                    "the backend of %s could not be released on its device: %s",
                    self.folder,
                    err,
                    extra={"event": "backend_release_failed"},
                )


def reload_folder(path: str, settings: Settings, worker: bool = False) -> Path | None:
    """The bundle folder a Reload call names, as named (None: the one being served): every reload of it follows its
    links anew (`confined`, in the reload's thread). Reload is allowed only with an admin token set (SIGHUP reloads
    without one); a path only with a reload root set too, inside that root (a relative path names a folder of the
    root), and not on a `worker` of several (the call reaches one worker; the others would go on serving the served
    folder)."""
    if settings.admin_token is None:
        raise PermissionDenied(
            "Reload is off on this server: set EDGEDISTILL_ADMIN_TOKEN and send it as 'authorization: Bearer "
            "<token>' to allow it; SIGHUP to the server process reloads the served bundle without a token"
        )
    if not path:
        return None
    if worker:
        raise PermissionDenied(
            "Reload may not name a bundle_path on a server of several workers (EDGEDISTILL_WORKERS): the call "
            "reaches one worker only. Serve the bundle as EDGEDISTILL_BUNDLE, or send Reload without a path (or "
            "SIGHUP to the server process) to reload the served bundle in every worker"
        )
    root = settings.reload_root
    if root is None:
        raise PermissionDenied(
            "Reload may not name a bundle_path on this server: set EDGEDISTILL_RELOAD_ROOT to allow it, "
            "or send Reload without a path to reload the served bundle"
        )
    return root / path  # relative: to the root, as the caller cannot know the server's directory


def confined(folder: Path, root: Path) -> Path:
    """`folder` resolved, its links followed as they point now; `PermissionDenied` unless it lies inside the reload
    `root`. A Reload call's folder is checked so at that reload and at every later reload of it, as a link in it may
    have been pointed elsewhere meanwhile."""
    try:
        resolved = folder.resolve()
    except (OSError, ValueError, RuntimeError) as err:  # RuntimeError: a symlink loop, before Python 3.13
        raise InvalidInput(f"bundle_path is not a usable path: {err}") from err
    if not resolved.is_relative_to(root.resolve()):
        raise PermissionDenied(
            f"bundle_path must lie inside {root} (the reload root, EDGEDISTILL_RELOAD_ROOT), its links followed"
        )
    return resolved


Loader = Callable[[Path, Settings, Metrics | None, Callable[[ServerFault], None]], ModelRuntime]


class ModelHost:
    """Holds the runtime being served; `None` until the first one is warm. `load` makes a runtime of a folder
    (`serve.cascade.load_runtime` in the server: a bundle's or a cascade's)."""

    def __init__(self, settings: Settings, metrics: Metrics | None = None, load: Loader = ModelRuntime.load):
        self.settings = settings
        self.metrics = metrics
        self.load = load
        self.current: ModelRuntime | None = None
        self.folder = settings.bundle  # what a reload without a folder loads: as named, its links followed each time
        self.root: Path | None = None  # the reload root `folder` must lead inside, for a folder a Reload call named
        self.shutting_down = asyncio.Event()  # set once the server drains: open streams end, no model is installed
        self.fault: ServerFault | None = None
        self.faulted = asyncio.Event()
        self._lock = asyncio.Lock()
        self._reloads: set[asyncio.Task] = set()

    @property
    def draining(self) -> bool:
        return self.shutting_down.is_set()

    @property
    def ready(self) -> bool:
        return self.current is not None and not self.draining and self.fault is None

    @property
    def live(self) -> bool:
        """False after a batcher fault: the process must be restarted."""
        return self.fault is None

    def on_fault(self, fault: ServerFault) -> None:
        """A runtime's batcher stopped on a fault: answer nothing any more and tell the server."""
        if self.fault is None:
            self.fault = fault
            self.faulted.set()

    async def drain(self, deadline: float, settle: float = 0.1) -> None:
        """Refuse new work (UNAVAILABLE) and wait, until the loop time `deadline`, for the queue to empty."""
        self.shutting_down.set()
        if self.current is not None:
            self.current.grace_ends(deadline)
        loop = asyncio.get_running_loop()
        while self.current is not None and self.current.queued_rows and loop.time() < deadline:
            await asyncio.sleep(0.01)
        await asyncio.sleep(max(0.0, min(settle, deadline - loop.time())))

    def get(self, name: str = "", version: str = "") -> ModelRuntime:
        """The runtime serving `name` (empty: the served model) at `version` (empty: any); the call's log lines name
        it from then on."""
        runtime = self.current
        if self.fault is not None:
            raise ServerFault(str(self.fault))
        if self.draining:
            raise NotReady("the server is shutting down; retry (another replica, or this one after its restart)")
        if runtime is None:
            raise NotReady("the model is still loading or warming up; retry shortly")
        if name and name != runtime.name:
            raise ModelNotFound(f"unknown model {name!r}; this server serves {runtime.name!r}")
        if version and version != runtime.version:
            raise ModelNotFound(
                f"model {runtime.name!r} has no version {version!r}; it serves version {runtime.version!r}"
            )
        MODEL.set((runtime.name, runtime.version))
        return runtime

    async def activate(self, runtime: ModelRuntime) -> ModelRuntime | None:
        """Warm `runtime` up and make it current; the runtime it replaced finishes its queue, is closed and returned."""
        async with self._lock:
            return await self._swap(runtime)

    async def _swap(self, runtime: ModelRuntime) -> ModelRuntime | None:
        try:
            self._refuse_at_shutdown()  # shutdown began while this runtime loaded
            await finish_in_thread(runtime.warm_up)
            self._refuse_at_shutdown()  # ... or while it warmed up
            await runtime.start()
        except BaseException:
            await runtime.close()
            raise
        previous, self.current = self.current, runtime
        description = runtime.describe()
        if self.metrics is not None:
            self.metrics.set_model(description.name, description.version, description.runtime, description.providers)
        log.info(
            "serving %s version %s from %s",
            runtime.name,
            runtime.version,
            runtime.folder,
            extra={"event": "model_active", "served": asdict(description)},
        )
        if previous is not None:
            previous.retire()
            await previous.close()
        return previous

    def _refuse_at_shutdown(self) -> None:
        if self.draining:
            raise NotReady("the server is shutting down; the new model was not installed")

    async def reload(
        self,
        folder: str | Path | None = None,
        trigger: str = "a Reload call",
        then: Callable[[], None] | None = None,
        root: Path | None = None,
    ) -> tuple[ModelRuntime, ModelRuntime | None]:
        """Load `folder` (default: the folder being served) and swap it in; on failure keep serving the old one.
        `trigger` (what asked for it) goes in the log lines, with the request id of a Reload call; `then` runs once the
        new model serves and the old one is closed; `root`: the reload root a `folder` a Reload call named must lead
        inside (`confined`), at this reload and every later one of it. The reload runs in a task of its own, to its
        end: a caller cancelled meanwhile (a Reload call past its deadline) leaves it to end with `model_active` or
        `reload_failed` in the log, and `then` to run."""
        task = asyncio.get_running_loop().create_task(self._reload(folder, trigger, then, root), name="reload")
        self._reloads.add(task)
        task.add_done_callback(self._reload_done)
        return await asyncio.shield(task)

    def _reload_done(self, task: asyncio.Task) -> None:
        self._reloads.discard(task)
        if not task.cancelled():
            task.exception()  # seen: `_reload` logged it, and a caller that went away never reads it

    async def _reload(
        self, folder: str | Path | None, trigger: str, then: Callable[[], None] | None, root: Path | None
    ) -> tuple[ModelRuntime, ModelRuntime | None]:
        async with self._lock:
            named = bool(folder)
            folder, root = (Path(folder), root) if named else (self.folder, self.root)
            about = {"folder": str(folder), "trigger": trigger}
            log.info("reloading %s on %s", folder, trigger, extra={"event": "reload_started"} | about)
            try:
                self._refuse_at_shutdown()
                runtime = await asyncio.to_thread(self._load_inside, folder, root)
                previous = await self._swap(runtime)
                self.folder, self.root = folder, root
            # PermissionDenied, InvalidInput: the folder leads outside the root (now), or nowhere usable;
            # OSError: a file the file system refuses (permission, name)
            except (BundleRejected, PermissionDenied, InvalidInput, OSError) as err:
                log.error(
                    "reload of %s failed, the current model keeps serving: %s",
                    folder,
                    err,
                    extra={"event": "reload_failed"} | about,
                )
                if named and isinstance(err, PermissionDenied | InvalidInput):  # the call's own path: refused as such
                    raise
                raise ReloadFailed(f"reload of {folder} failed, the current model keeps serving: {err}") from err
            except NotReady as err:
                log.warning("reload of %s ended: %s", folder, err, extra={"event": "reload_failed"} | about)
                raise
            except Exception as err:  # the server's own error, not the bundle's
                log.error("reload of %s failed", folder, exc_info=err, extra={"event": "reload_failed"} | about)
                raise
        if then is not None:
            then()
        return runtime, previous

    def _load_inside(self, folder: Path, root: Path | None) -> ModelRuntime:
        """The runtime of `folder`, its links followed as they point now and `confined` to `root` (None: anywhere).
        For a thread: resolving the folder reads the file system, which may stop answering (a hung mount)."""
        return self.load(folder if root is None else confined(folder, root), self.settings, self.metrics, self.on_fault)

    async def dispatch(self, name: str, version: str, work) -> tuple[ModelRuntime, object]:
        """`await work(runtime)` on the runtime for `name`/`version`; retried once the runtime was swapped meanwhile."""
        while True:
            runtime = self.get(name, version)
            try:
                return runtime, await work(runtime)
            except BatcherClosed:
                if self.current is runtime:
                    raise

    @property
    def reloading(self) -> bool:
        """Whether a reload is under way (after `close` on a fault: left to its load or warm-up)."""
        return bool(self._reloads)

    async def close(self, timeout: float | None = None) -> None:
        """Install nothing more; close the current runtime, its queue given `timeout` seconds (default:
        SHUTDOWN_GRACE_S), then wait for the reloads under way to end: one loading or warming up a model finishes
        that step in its thread (a thread cannot be stopped), then closes that model. After a fault none is waited
        for: its step may hang on the device that broke, and the process exits for a restart."""
        self.shutting_down.set()
        if self.current is not None:
            runtime, self.current = self.current, None
            await runtime.close(timeout)
        if self._reloads and self.fault is None:
            await asyncio.wait(set(self._reloads))


async def finish_in_thread(function: Callable[[], None]) -> None:
    """`function()` in a thread of the loop's executor, in the caller's context. A caller cancelled meanwhile waits
    for it to return, as a thread cannot be stopped, so that what it uses is not released under it; then the
    cancellation goes on."""
    call = asyncio.get_running_loop().run_in_executor(None, contextvars.copy_context().run, function)
    try:
        await asyncio.shield(call)
    except asyncio.CancelledError:
        await asyncio.wait([call])
        call.exception()  # seen: the caller was cancelled, which is the news
        raise
