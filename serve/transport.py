"""gRPC servicers: proto <-> numpy, and errors -> status codes. The work happens in `serve.host`."""

import asyncio
import functools
import json
import logging
import os
from dataclasses import asdict
from importlib import metadata

import grpc
import numpy as np
from edgedistill.common.bundle import PADDING_SIDE, TOKEN_INPUTS, BundleSpec, text_inputs
from edgedistill.common.cascade import CascadeSpec
from edgedistill.common.runtime import TRITON_LABELS_FILE, TRITON_PLATFORMS
from edgedistill.serve import tensors
from edgedistill.serve.batching import ENDED_BY_SERVER
from edgedistill.serve.cascade import CascadeRuntime
from edgedistill.serve.errors import (
    BatcherClosed,
    DeadlineExpired,
    InvalidInput,
    ModelNotFound,
    NotReady,
    Overloaded,
    PermissionDenied,
    ReloadFailed,
    ServeError,
    TooLarge,
)
from edgedistill.serve.host import (
    Checked,
    ModelHost,
    ModelRuntime,
    Scores,
    check_texts,
    named_if_cut,
    reload_folder,
)
from edgedistill.serve.idle import IdleWatch, idle_limit
from edgedistill.serve.logs import MODEL, REQUEST_ID
from edgedistill.serve.observe import caller, refuse
from edgedistill.serve.proto import classifier_pb2, classifier_pb2_grpc, kserve_pb2, kserve_pb2_grpc
from edgedistill.serve.settings import Settings
from edgedistill.serve.workers import SupervisorLink
from google.protobuf.message import DecodeError

log = logging.getLogger(__name__)

CLASSIFIER = classifier_pb2.DESCRIPTOR.services_by_name["Classifier"].full_name
KSERVE = kserve_pb2.DESCRIPTOR.services_by_name["GRPCInferenceService"].full_name
ADMIN_METHODS = (f"/{CLASSIFIER}/Reload",)  # authorised by ADMIN_TOKEN (refused without one), not by TOKEN
OUTPUTS = ("logits", "probabilities")
CASCADE_OUTPUTS = {"answered_by": "BYTES", "escalation_refused": "BOOL"}  # per row, beside OUTPUTS, for a cascade
SHUTDOWN_STREAM = (
    "the server is shutting down: open a new stream (to another replica, or to this one after its restart)"
)
CASCADE_PLATFORM = "ensemble"  # Triton's platform of models composed in the server, with no backend of its own
EXTENSIONS = ("classification", "model_configuration")  # Triton's names for what ServerMetadata reports
TEXT_INPUTS = tuple(text_inputs(pairs=True))
# Triton's dims of a tensor of one element per row (a text input, a cascade's per-row outputs) without the batch axis:
# [batch, 1] with it, as ModelMetadata gives it and ModelInfer returns it (Triton's dims hold at least one axis).
ROW_DIMS = (1,)
# Triton's model-configuration data type of each KServe datatype ModelConfig lists (text inputs, outputs)
TRITON_TYPES = {"BYTES": "TYPE_STRING", "BOOL": "TYPE_BOOL", "FP32": "TYPE_FP32"}
INPUTS = {name: "BYTES" for name in TEXT_INPUTS} | {name: "INT64" for name in TOKEN_INPUTS}
# The parameter by which Triton's shared-memory extensions place a tensor outside the messages; not served here.
SHARED_MEMORY_REGION = "shared_memory_region"
STREAM_WINDOW = 16  # requests of one stream in flight at once
# gRPC's retry policy (gRFC A6) sends a call again after a retryable status unless the server's trailers carry
# a negative pushback: set for errors that would only recur, such as a request over a limit.
RETRY_PUSHBACK_KEY = "grpc-retry-pushback-ms"
# The status a call ends with when it raised one of these; any other error is internal.
STATUS_CODES: dict[type[ServeError], grpc.StatusCode] = {
    InvalidInput: grpc.StatusCode.INVALID_ARGUMENT,
    TooLarge: grpc.StatusCode.RESOURCE_EXHAUSTED,
    Overloaded: grpc.StatusCode.RESOURCE_EXHAUSTED,
    ModelNotFound: grpc.StatusCode.NOT_FOUND,
    PermissionDenied: grpc.StatusCode.PERMISSION_DENIED,
    NotReady: grpc.StatusCode.UNAVAILABLE,
    BatcherClosed: grpc.StatusCode.UNAVAILABLE,
    DeadlineExpired: grpc.StatusCode.DEADLINE_EXCEEDED,
    ReloadFailed: grpc.StatusCode.FAILED_PRECONDITION,
}


def status_of(err: BaseException) -> grpc.StatusCode | None:
    """The status code for `err` from `STATUS_CODES` (its class or the nearest base listed); None: internal."""
    return next((STATUS_CODES[cls] for cls in type(err).__mro__ if cls in STATUS_CODES), None)


def fail(context: grpc.aio.ServicerContext, err: Exception, where: str = "") -> None:
    """Set the call's status for `err` (its details after `where`, a stream's request), for the handler to return
    with; unexpected errors are logged and reported as INTERNAL."""
    if (code := status_of(err)) is not None:
        if err.recurs:  # e.g. RESOURCE_EXHAUSTED for a request over a limit, unlike overload
            context.set_trailing_metadata((*(context.trailing_metadata() or ()), (RETRY_PUSHBACK_KEY, "-1")))
        # an error that recurs for the same request is the request's fault, not the server's, whatever its code
        refuse(context, code, f"{where}: {err}" if where else str(err), clients_fault=err.recurs)
        return
    log.error("unexpected error", exc_info=err, extra={"event": "internal_error"})
    refuse(context, grpc.StatusCode.INTERNAL, f"internal error (request id {REQUEST_ID.get()}); see the server log")


def output_value(scores: Scores, name: str) -> np.ndarray:
    """The values of the KServe output `name` (one of `outputs_of`), computed only when asked for: (N, labels) for
    OUTPUTS, (N, 1) for a cascade's per-row outputs (ROW_DIMS)."""
    if name == "answered_by":
        return np.array([member.encode() for member in scores.answered_by or ()], dtype=object).reshape(-1, *ROW_DIMS)
    if name == "escalation_refused":
        return scores.escalation_refused.reshape(-1, *ROW_DIMS)
    return getattr(scores, name)


def handles_errors(method):
    """Map the serving layer's exceptions to gRPC statuses for a unary handler."""

    @functools.wraps(method)
    async def wrapper(self, request, context):
        try:
            return await method(self, request, context)
        except Exception as err:
            fail(context, err)
            return None

    return wrapper


def discard(work: asyncio.Future, why: str | None = None) -> None:
    """Cancel work whose result no one will read, with the message `why` (`ENDED_BY_SERVER`: the batcher counts its
    rows as ended, not cancelled by the client); an error it already ended with is marked as seen, else asyncio logs
    it ("Task exception was never retrieved") when the task is freed."""
    work.cancel(why)
    if work.done() and not work.cancelled():
        work.exception()


def deadline_of(context: grpc.aio.ServicerContext) -> float | None:
    """The client's deadline in event-loop time, or None without one."""
    remaining = context.time_remaining()
    return None if remaining is None else asyncio.get_running_loop().time() + remaining


def classify_response(spec: BundleSpec | CascadeSpec, scores: Scores) -> classifier_pb2.ClassifyResponse:
    """One prediction per row of `scores`: the most probable label, its probability, and all probabilities and
    logits; for a cascade's scores, the member that answered and whether an escalation was refused."""
    reply = classifier_pb2.ClassifyResponse(model_name=spec.name, model_version=spec.version)
    best = scores.probabilities.argmax(axis=-1)
    for i, label_id in enumerate(best.tolist()):
        prediction = reply.predictions.add(
            label=spec.labels[label_id],
            label_id=label_id,
            score=float(scores.probabilities[i, label_id]),
            probabilities=scores.probabilities[i].tolist(),
            logits=scores.logits[i].tolist(),
        )
        if scores.answered_by is not None:
            prediction.answered_by = scores.answered_by[i]
            prediction.escalation_refused = bool(scores.escalation_refused[i])
    return reply


def platform_of(runtime: ModelRuntime | CascadeRuntime) -> tuple[str, str]:
    """Triton's platform and backend of the served model; Triton's backends are named as the runtimes, and a runtime
    Triton has no platform for (none in `TRITON_PLATFORMS`) reports none, as a Triton model with a custom backend."""
    if isinstance(runtime, CascadeRuntime):
        return CASCADE_PLATFORM, ""
    return TRITON_PLATFORMS.get(runtime.spec.runtime, ""), runtime.spec.runtime


def outputs_of(runtime: ModelRuntime | CascadeRuntime) -> dict[str, str]:
    """The KServe outputs of the served model and their datatypes: OUTPUTS, and CASCADE_OUTPUTS for a cascade."""
    return dict.fromkeys(OUTPUTS, "FP32") | (CASCADE_OUTPUTS if isinstance(runtime, CascadeRuntime) else {})


def output_dims(name: str, labels: int) -> tuple[int, ...]:
    """Triton's dims of the output `name` (one of `outputs_of`) without the batch axis: a value per label for
    OUTPUTS, ROW_DIMS for a cascade's per-row outputs."""
    return (labels,) if name in OUTPUTS else ROW_DIMS


def triton_type(datatype: str) -> int:
    """Triton's model-configuration data type (`ModelConfigResponse.DataType`) of a KServe `datatype`."""
    return kserve_pb2.ModelConfigResponse.DataType.Value(TRITON_TYPES[datatype])


def model_config(
    runtime: ModelRuntime | CascadeRuntime, max_texts: int, max_message_bytes: int
) -> kserve_pb2.ModelConfigResponse.ModelConfig:
    """Triton's model configuration of the served model: the text inputs and the outputs without the batch axis,
    a request's most rows (MAX_TEXTS) as `max_batch_size`, the label names as the parameter `labels` (a JSON list)
    beside each output's `label_filename`, the largest message (MAX_MESSAGE_BYTES) as `max_message_bytes`, the
    style the server writes texts in before tokenizing as `text_style`, and, for a bundle (a cascade takes no token
    ids), what a client that sends token ids needs, as the bundle's Triton `config.pbtxt` gives it: the token inputs
    (`token_inputs`, a JSON list), `max_length`, `pad_token_id`, `padding_side` (PADDING_SIDE), and `pair_segments`
    where a pair's segment ids come from sequence ids (`common.segments`): how it makes `token_type_ids`."""
    spec = runtime.spec
    platform, backend = platform_of(runtime)
    Config = kserve_pb2.ModelConfigResponse
    config = Config.ModelConfig(name=spec.name, platform=platform, backend=backend, max_batch_size=max_texts)
    for name in spec.text_inputs:
        config.input.add(name=name, data_type=triton_type(INPUTS[name]), dims=ROW_DIMS)
    for name, datatype in outputs_of(runtime).items():
        output = config.output.add(name=name, data_type=triton_type(datatype), dims=output_dims(name, len(spec.labels)))
        if name in OUTPUTS:  # a value per label
            output.label_filename = TRITON_LABELS_FILE
    config.parameters["labels"].string_value = json.dumps(spec.labels)
    config.parameters["max_message_bytes"].string_value = str(max_message_bytes)
    config.parameters["text_style"].string_value = runtime.describe().text_style
    if isinstance(runtime, ModelRuntime):  # what a client that sends token ids needs: a cascade takes texts alone
        config.parameters["token_inputs"].string_value = json.dumps(runtime.spec.input_names)
        config.parameters["max_length"].string_value = str(runtime.spec.max_length)
        config.parameters["pad_token_id"].string_value = str(runtime.spec.pad_token_id)
        config.parameters["padding_side"].string_value = PADDING_SIDE
        if runtime.spec.pair_segments != "token_types":
            config.parameters["pair_segments"].string_value = runtime.spec.pair_segments
    return config


def inputs_taken(served: ModelRuntime | CascadeRuntime) -> str:
    """What `served` takes, for a message refusing other inputs: its texts, and but for a cascade its token ids."""
    texts = f"BYTES {' and '.join(repr(name) for name in served.spec.text_inputs)} [batch]"
    if isinstance(served, CascadeRuntime):
        return texts
    return f"{texts}, or INT64 token ids {', '.join(repr(name) for name in served.spec.input_names)} [batch, sequence]"


def class_count(output: kserve_pb2.ModelInferRequest.InferRequestedOutputTensor) -> int | None:
    """The number of classes a requested output asks for with Triton's classification extension, or None."""
    if "classification" not in output.parameters:
        return None
    if output.name not in OUTPUTS:
        raise InvalidInput(f"output {output.name!r}: 'classification' applies only to {' and '.join(OUTPUTS)}")
    parameter = output.parameters["classification"]
    if parameter.WhichOneof("parameter_choice") != "int64_param":
        raise InvalidInput(
            f"output {output.name!r}: the 'classification' parameter must be an int64_param (the number of classes)"
        )
    if parameter.int64_param < 1:
        raise InvalidInput(f"output {output.name!r}: 'classification' must be at least 1, got {parameter.int64_param}")
    return parameter.int64_param


def check_no_shared_memory(request: kserve_pb2.ModelInferRequest) -> None:
    """Refuse inputs and outputs placed in shared memory: this server reads and writes tensors only in the messages,
    so such an input would seem empty and such an output would come back in the reply, its region left unwritten."""
    for kind, entries in (("input", request.inputs), ("output", request.outputs)):
        for tensor in entries:
            if SHARED_MEMORY_REGION in tensor.parameters:
                raise InvalidInput(
                    f"{kind} {tensor.name!r} is in shared memory, which this server does not serve (ServerMetadata lists "
                    "no shared-memory extension): send the tensors in the messages"
                )


def check_shape(name: str, shape: list[int], max_length: int) -> None:
    """Refuse an input's shape that the input never takes, before its elements are counted against a request's limit:
    a text input is [batch] or [batch, 1], token ids [batch, sequence] of at most `max_length`."""
    if name in TEXT_INPUTS:
        if len(shape) == 1 or (len(shape) == 2 and shape[1] == 1):
            return
        raise InvalidInput(f"input {name!r} must have shape [batch] or [batch, 1], got {shape}")
    if len(shape) != 2:
        raise InvalidInput(f"input {name!r} must have shape [batch, sequence], got {shape}")
    if shape[1] > max_length:
        raise InvalidInput(f"sequence length {shape[1]} exceeds the model's max_length {max_length}")


def top_classes(values: np.ndarray, count: int, labels: list[str]) -> np.ndarray:
    """Triton's classification extension: per row of (N, C) `values`, the `count` highest (at most C; ties: the
    lower index first) as b"value:index:label", the value printed as C's %f. Shape (N, min(count, C)), bytes."""
    order = np.argsort(-values, axis=1, kind="stable")[:, : min(count, values.shape[1])]
    rows = [[f"{float(values[i, j]):f}:{j}:{labels[j]}".encode() for j in row] for i, row in enumerate(order.tolist())]
    classes = np.empty(order.shape, dtype=object)
    classes[:] = rows
    return classes


def model_info(runtime: ModelRuntime) -> classifier_pb2.ModelInfo:
    """What `GetModelInfo` and `Reload` say of a served model, with the request limits of the server serving it."""
    limits = {"max_texts": runtime.settings.max_texts, "max_message_bytes": runtime.settings.max_message_bytes}
    return classifier_pb2.ModelInfo(**asdict(runtime.describe()), pid=os.getpid(), **limits)


class ClassifierServicer(classifier_pb2_grpc.ClassifierServicer):
    """The Classifier API. As a worker of `supervisor`, a Reload reloads the served folder in every worker: this one,
    then the others through the supervisor."""

    def __init__(self, host: ModelHost, settings: Settings, supervisor: SupervisorLink | None = None):
        self.host = host
        self.settings = settings
        self.supervisor = supervisor

    def _checked(self, request: classifier_pb2.ClassifyRequest) -> tuple[str, str, Checked]:
        """The model name and version, and the texts and pairs checked and cut to MAX_TEXT_CHARS: all that a call
        needs of its message, so that a waiting call holds none."""
        # the repeated fields as they are: their length is checked before a Python string is made of any element
        pairs = request.text_pairs or None
        checked = check_texts(request.texts, pairs, self.settings.max_texts, self.settings.max_text_chars)
        return request.model_name, request.model_version, checked

    async def _classify(self, name: str, version: str, checked: Checked, deadline: float | None):
        with named_if_cut(checked, self.settings.max_text_chars):
            runtime, scores = await self.host.dispatch(name, version, lambda rt: checked.classify(rt, deadline))
        return classify_response(runtime.spec, scores)

    @handles_errors
    async def Classify(self, request, context):
        return await self._classify(*self._checked(request), deadline_of(context))

    async def ClassifyStream(self, request_iterator, context):
        """Requests are worked on concurrently (up to STREAM_WINDOW), replies written in arrival order. A stream
        whose client keeps it waiting for STREAM_IDLE_S (sends no request while no reply is being made, or reads no
        reply, which stops the writing and reading here) is ended with DEADLINE_EXCEEDED; the time a reply takes to
        make does not count. When the server drains, a stream ends with UNAVAILABLE once the replies to the requests
        it received before are written, instead of holding the drain for its grace."""
        with idle_limit(self.settings.stream_idle_s, context) as idle:
            await self._serve_stream(request_iterator, context, idle)

    async def _serve_stream(self, request_iterator, context, idle: IdleWatch) -> None:
        deadline = deadline_of(context)
        window = asyncio.Semaphore(STREAM_WINDOW)  # a place from a request's start until its reply is written
        pending: asyncio.Queue = asyncio.Queue()  # holds at most STREAM_WINDOW requests, and the stream's end

        # Each item is (the request's place in the stream, counted from 0, or None for the stream's own end; its
        # reply's work, or the error that ends the stream), or None once the request stream ended.
        async def read():
            received, checking = 0, None
            try:
                async for request in request_iterator:
                    idle.touch()
                    checking, received = received, received + 1
                    checked = self._checked(request)
                    # Up to STREAM_WINDOW requests are in flight per stream, in one call's place among
                    # MAX_CONCURRENT_RPCS: each holds only what `_checked` kept; of the messages, up to
                    # MAX_MESSAGE_BYTES, only the last is kept (by gRPC too, until the next one comes).
                    await window.acquire()  # waits while STREAM_WINDOW requests are in flight
                    pending.put_nowait((checking, asyncio.ensure_future(self._classify(*checked, deadline))))
                    checking = None
            except DecodeError as err:  # bytes from the client that do not parse as a ClassifyRequest
                error = InvalidInput(f"stream message {received} is not a valid ClassifyRequest: {err}")
                await pending.put((None, error))
            except Exception as err:  # a request refused by its checks, or a broken request stream, ends the call
                await pending.put((checking, err))
            await pending.put(None)

        async def end_at_shutdown():  # after the replies to what came before, as a call arriving now is refused
            await self.host.shutting_down.wait()
            await pending.put((None, NotReady(SHUTDOWN_STREAM)))

        reader = asyncio.ensure_future(read())
        ender = asyncio.ensure_future(end_at_shutdown())
        place, answered = None, False  # answered: the server ends the stream with an error of its own
        try:
            while (item := await pending.get()) is not None:
                place, item = item
                if isinstance(item, Exception):
                    raise item
                with idle.paused():  # the server, not the client, is waited on
                    reply = await item
                MODEL.set((reply.model_name, reply.model_version))  # from the reply: `item` ran in a task of its own
                await context.write(reply)
                window.release()
        except Exception as err:
            # gRPC's own errors (a failed read or write, a finished call) mean the call already ended: the
            # client went away, or gRPC refused a message and answered the client itself. No one to answer.
            if context.done() or isinstance(err, grpc.aio.BaseError):
                context.set_code(grpc.StatusCode.CANCELLED)
                log.info("stream ended before its replies: %r", err, extra={"event": "stream_ended"})
                return
            answered = True
            fail(context, err, "" if place is None else f"stream request {place}")
        finally:
            reader.cancel()
            ender.cancel()
            why = ENDED_BY_SERVER if answered or idle.expired else None
            while not pending.empty():
                if (item := pending.get_nowait()) is not None and isinstance(item[1], asyncio.Future):
                    discard(item[1], why)

    @handles_errors
    async def GetModelInfo(self, request, context):
        return model_info(self.host.get(request.model_name, request.model_version))

    @handles_errors
    async def Reload(self, request, context):
        folder = reload_folder(request.bundle_path, self.settings, worker=self.supervisor is not None)
        reloaded = None if self.supervisor is None else self.supervisor.reloaded
        trigger = f"a Reload call from {caller(context)}"
        runtime, previous = await self.host.reload(folder, trigger, reloaded, root=self.settings.reload_root)
        reply = classifier_pb2.ReloadResponse(model=model_info(runtime))
        if previous is not None:
            reply.previous.CopyFrom(model_info(previous))
        return reply


class InferenceServicer(kserve_pb2_grpc.GRPCInferenceServiceServicer):
    """The KServe v2 predict protocol: BYTES `text` (and `text_pair` for a pair model) in, or INT64 token ids;
    FP32 `logits` and `probabilities` out (or their top classes, with Triton's classification extension), raw
    when the request was raw. Triton's `ModelConfig` describes the model."""

    def __init__(self, host: ModelHost, settings: Settings):
        self.host = host
        self.settings = settings

    async def ServerLive(self, request, context):
        return kserve_pb2.ServerLiveResponse(live=self.host.live)

    async def ServerReady(self, request, context):
        return kserve_pb2.ServerReadyResponse(ready=self.host.ready)

    async def ModelReady(self, request, context):
        try:
            self.host.get(request.name, request.version)
        except (NotReady, ModelNotFound):
            return kserve_pb2.ModelReadyResponse(ready=False)
        return kserve_pb2.ModelReadyResponse(ready=True)

    async def ServerMetadata(self, request, context):
        try:
            version = metadata.version("edgedistill")
        except metadata.PackageNotFoundError:
            version = "unknown"
        return kserve_pb2.ServerMetadataResponse(name="edgedistill", version=version, extensions=EXTENSIONS)

    @handles_errors
    async def ModelMetadata(self, request, context):
        runtime = self.host.get(request.name, request.version)
        labels = len(runtime.spec.labels)
        Tensor = kserve_pb2.ModelMetadataResponse.TensorMetadata
        return kserve_pb2.ModelMetadataResponse(
            name=runtime.name,
            versions=[runtime.version],
            platform=platform_of(runtime)[0],
            inputs=[
                Tensor(name=name, datatype=INPUTS[name], shape=[-1, *ROW_DIMS]) for name in runtime.spec.text_inputs
            ],
            outputs=[
                Tensor(name=name, datatype=datatype, shape=[-1, *output_dims(name, labels)])
                for name, datatype in outputs_of(runtime).items()
            ],
        )

    @handles_errors
    async def ModelConfig(self, request, context):
        runtime = self.host.get(request.name, request.version)
        settings = self.settings
        return kserve_pb2.ModelConfigResponse(
            config=model_config(runtime, settings.max_texts, settings.max_message_bytes)
        )

    def _inputs(
        self, request: kserve_pb2.ModelInferRequest, served: ModelRuntime | CascadeRuntime
    ) -> dict[str, np.ndarray]:
        """The request's tensors, each refused before decoding when it holds more elements than a request may:
        MAX_TEXTS texts, or MAX_TEXTS rows of the `served` model's `max_length` token ids (none for a cascade)."""
        max_length = served.max_length
        raw = list(request.raw_input_contents)
        if raw and len(raw) != len(request.inputs):
            raise InvalidInput(f"{len(raw)} raw_input_contents for {len(request.inputs)} inputs: send one per input")
        decoded = {}
        for i, tensor in enumerate(request.inputs):
            if raw and tensor.HasField("contents"):
                raise InvalidInput(f"input {tensor.name!r} has contents although the request uses raw_input_contents")
            if tensor.name in decoded:
                raise InvalidInput(f"input {tensor.name!r} appears twice")
            if tensor.name not in INPUTS:
                raise InvalidInput(f"unknown input {tensor.name!r}: send {inputs_taken(served)}")
            if isinstance(served, CascadeRuntime) and tensor.name not in TEXT_INPUTS:
                raise served.token_ids_refused()
            if tensor.datatype != INPUTS[tensor.name]:
                raise InvalidInput(f"input {tensor.name!r} must be {INPUTS[tensor.name]}, got {tensor.datatype!r}")
            check_shape(tensor.name, list(tensor.shape), max_length)
            limit = self.settings.max_texts * (1 if tensor.name in TEXT_INPUTS else max_length)
            decoded[tensor.name] = tensors.decode(
                tensor.name, tensor.datatype, list(tensor.shape), tensor.contents, raw[i] if raw else None, limit
            )
        return decoded

    def _texts(self, name: str, value: np.ndarray) -> list[str]:
        """The UTF-8 texts of a BYTES input whose shape `check_shape` passed."""
        texts = []
        for i, element in enumerate(value.reshape(-1).tolist()):
            try:
                texts.append(element.decode("utf-8"))
            except UnicodeDecodeError as err:
                raise InvalidInput(
                    f"input {name!r} element {i} is not valid UTF-8 ({err.reason} at byte {err.start})"
                ) from err
        return texts

    async def _scores(
        self, request: kserve_pb2.ModelInferRequest, served: ModelRuntime | CascadeRuntime, deadline: float | None
    ):
        inputs = self._inputs(request, served)
        if "text" in inputs:
            if set(inputs) - set(TEXT_INPUTS):
                raise InvalidInput("send either the 'text' input or token-id inputs, not both")
            texts = self._texts("text", inputs["text"])
            pairs = self._texts("text_pair", inputs["text_pair"]) if "text_pair" in inputs else None
            checked = check_texts(texts, pairs, self.settings.max_texts, self.settings.max_text_chars)
            with named_if_cut(checked, self.settings.max_text_chars):
                return await self.host.dispatch(
                    request.model_name, request.model_version, lambda rt: checked.classify(rt, deadline)
                )
        if "input_ids" not in inputs:
            raise InvalidInput(f"missing input: send {inputs_taken(served)}")
        return await self.host.dispatch(
            request.model_name, request.model_version, lambda rt: rt.classify_ids(inputs, deadline)
        )

    @handles_errors
    async def ModelInfer(self, request, context):
        served = self.host.get(request.model_name, request.model_version)  # unknown model: NOT_FOUND before decoding
        check_no_shared_memory(request)
        outputs = outputs_of(served)
        wanted: dict[str, int | None] = {}  # output -> its class count (classification extension), or None
        for out in request.outputs:
            if out.name not in outputs:
                raise InvalidInput(f"unknown output {out.name!r}; this model has {list(outputs)}")
            if out.name in wanted:
                raise InvalidInput(f"output {out.name!r} is requested twice: name each output once")
            wanted[out.name] = class_count(out)
        wanted = wanted or dict.fromkeys(outputs)
        runtime, scores = await self._scores(request, served, deadline_of(context))
        if missing := wanted.keys() - outputs_of(runtime).keys():  # a reload swapped the model meanwhile
            raise NotReady(f"the model was replaced during the call and has no output {sorted(missing)}: retry")
        raw = len(request.raw_input_contents) > 0
        reply = kserve_pb2.ModelInferResponse(model_name=runtime.name, model_version=runtime.version, id=request.id)
        for name, count in wanted.items():
            value, datatype = output_value(scores, name), outputs[name]
            if count is not None:
                value, datatype = top_classes(value, count, runtime.spec.labels), "BYTES"
            output = reply.outputs.add(name=name, datatype=datatype, shape=list(value.shape))
            data = tensors.encode(value, datatype, output.contents, raw)
            if raw:
                reply.raw_output_contents.append(data)
        return reply
