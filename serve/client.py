"""The client library of the server: `Client` classifies texts through either API, with gRPC's retries, a token and
TLS; `wait_ready` waits for a server to serve. `edgedistill call` (`serve.call`) is its command line.

    from edgedistill.serve.client import Client

    with Client("localhost:50051") as client:
        print(client.classify(["a great movie", "a dull one"])["predictions"])
"""

import ipaddress
import json
import time
import warnings
from collections.abc import Callable, Iterable
from pathlib import Path

import grpc
import numpy as np
from edgedistill.common.bundle import text_inputs
from edgedistill.serve import tensors
from edgedistill.serve.proto import classifier_pb2, classifier_pb2_grpc
from edgedistill.serve.settings import (
    DEFAULT_PORT,
    DIRECT,
    GRPC_INT_MAX,
    MIN_MESSAGE_BYTES,
    blank,
    on_loopback,
    sendable,
)
from edgedistill.serve.tls import check_pem
from grpc_health.v1 import health_pb2, health_pb2_grpc

DEFAULT_ADDRESS = f"localhost:{DEFAULT_PORT}"
# A token the client refuses, as the server refuses such a TOKEN at start (`serve.settings.blank`): one set blank is a
# mistake (a compose file's `${VAR:-}`), which would otherwise go as no token and fail UNAUTHENTICATED
BLANK_TOKEN = "empty, 'none' or 'off', which no server's TOKEN can be"
TIMEOUT = 10.0  # seconds: a call's deadline unless the caller gives one
MAX_TIMEOUT = 1e9  # seconds; gRPC keeps a deadline in int64 nanoseconds since the epoch, which end in 2262
RETRIED_CODES = ("UNAVAILABLE", "RESOURCE_EXHAUSTED")  # a draining or restarting server, a full queue
MAX_ATTEMPTS = 5  # gRPC's own cap on retryPolicy.maxAttempts
RECEIVE_ANY = [("grpc.max_receive_message_length", -1)]  # no limit on a reply's size


RETRY_THROTTLING = {"maxTokens": 10, "tokenRatio": 0.1}


def _unspecified(address: str) -> bool:
    """Whether `address` (`host:port`) names the unspecified address (`0.0.0.0`, `[::]`), by which a client connects
    to this machine."""
    try:
        return ipaddress.ip_address(address.rpartition(":")[0].strip("[]")).is_unspecified
    except ValueError:  # a host name, a gRPC target
        return False


def retry_options(retries: int) -> list[tuple[str, object]]:
    """Channel options for gRPC's retry policy: up to `retries` more attempts of a call that failed with
    UNAVAILABLE or RESOURCE_EXHAUSTED, with exponential backoff (50 ms doubling, at most 1 s, jittered),
    within the call's deadline, whatever the call's size, throttled while most attempts fail. The server stops them for
    errors that would recur (a request over a limit)."""
    if not 0 <= retries < MAX_ATTEMPTS:
        raise ValueError(f"retries must be between 0 and {MAX_ATTEMPTS - 1}, got {retries}")
    if retries == 0:
        return [("grpc.enable_retries", 0)]
    policy = {
        "maxAttempts": retries + 1,
        "initialBackoff": "0.05s",
        "maxBackoff": "1s",
        "backoffMultiplier": 2,
        "retryableStatusCodes": list(RETRIED_CODES),
    }
    # Spelled out: kserve_pb2 is imported only when used (see `kserve_request`), and the server's modules never.
    services = ("edgedistill.v1.Classifier", "inference.GRPCInferenceService")
    config = {
        "methodConfig": [
            {"name": [{"service": name} for name in services], "retryPolicy": policy},
            # A Reload cut while the server loads (a connection's max age, a drain) is not sent again: the server
            # finishes each load it began. gRPC takes the most specific name, so this entry, without a policy, wins.
            {"name": [{"service": "edgedistill.v1.Classifier", "method": "Reload"}]},
        ],
        # retries stop while most recent attempts fail (gRFC A6: each failure takes a token, each success gives back
        # a tenth, and none is retried at half the tokens or less), so a server that stays overloaded is not sent
        # every call up to `retries` more times
        "retryThrottling": RETRY_THROTTLING,
    }
    # gRPC's C core keeps at most this much of a call to send it again (256 KiB by default) and never retries a larger
    # one; GRPC_INT_MAX is as much as a server's MAX_MESSAGE_BYTES may take. The buffer holds what a call has sent,
    # only until its reply starts.
    return [
        ("grpc.enable_retries", 1),
        ("grpc.service_config", json.dumps(config)),
        ("grpc.per_rpc_retry_buffer_size", GRPC_INT_MAX),
    ]


def bearer(token: str | None) -> tuple[tuple[str, str], ...]:
    """The call metadata carrying `token` as the server's TOKEN wants it ('authorization: Bearer ...'); () without."""
    return (("authorization", f"Bearer {token}"),) if token else ()


def health_serving(channel: grpc.Channel) -> bool:
    """Whether the gRPC health service on `channel` reports SERVING."""
    reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=""), timeout=1)
    return reply.status == health_pb2.HealthCheckResponse.SERVING


def wait_ready(
    address: str,
    seconds: float,
    ready: Callable[[grpc.Channel], bool] = health_serving,
    running: Callable[[], bool] = lambda: True,
) -> bool:
    """Poll `ready` (by default the health service) on a plaintext channel to `address`, a server on this machine
    (`DIRECT`), until it says yes: True; False when `seconds` pass first, or when `running()` says, before a poll, that
    the server is gone. A poll whose call fails (a server not listening yet) says no."""
    deadline = time.monotonic() + seconds
    with grpc.insecure_channel(address, options=DIRECT) as channel:
        while time.monotonic() < deadline and running():
            try:
                if ready(channel):
                    return True
            except grpc.RpcError:
                pass
            time.sleep(0.2)
    return False


def token_problem(token: str) -> str | None:
    """Why `token` cannot be sent (blank: `BLANK_TOKEN`; not printable ASCII, as gRPC metadata values are), or None."""
    if blank(token):
        return f"is {BLANK_TOKEN}"
    if not sendable(token):
        return "must be printable ASCII, as gRPC metadata values are (a trailing newline?)"
    return None


def timeout_problem(seconds: float) -> str | None:
    """Why a call deadline of `seconds` cannot be used, or None: 0 or less, or nan, fails every call before it is
    sent; one past `MAX_TIMEOUT` overflows gRPC's clock."""
    return None if 0 < seconds <= MAX_TIMEOUT else f"must be above 0 and at most {MAX_TIMEOUT:.0e}, got {seconds}"


def uses_tls(tls: bool, tls_ca, tls_cert) -> bool:
    """Whether a channel of these options is TLS: asked for, or implied by a CA to trust or a client certificate."""
    return bool(tls or tls_ca or tls_cert)


class Client:
    """Blocking client for `edgedistill.v1.Classifier` and, with `kserve_infer`, the KServe v2 protocol."""

    def __init__(
        self,
        address: str = DEFAULT_ADDRESS,
        *,
        token: str | None = None,
        tls: bool = False,
        tls_ca: Path | None = None,
        tls_cert: Path | None = None,
        tls_key: Path | None = None,
        timeout: float = TIMEOUT,
        retries: int = 3,
    ):
        """`retries`: more attempts of a call that failed with UNAVAILABLE or RESOURCE_EXHAUSTED (`retry_options`).
        `OSError` for TLS files that cannot be read, `ssl.SSLError` (one) for those gRPC cannot use (`check_pem`),
        `ValueError` for a certificate without its key or the reverse, a token that cannot be sent (`token_problem`)
        and a `timeout` no call can keep (`timeout_problem`); a `UserWarning` for a token to go in plaintext beyond
        this machine's loopback. A server on this machine's loopback is called straight, past a proxy the environment
        names (`DIRECT`)."""
        if (tls_cert is None) != (tls_key is None):
            raise ValueError(
                "tls_cert and tls_key go together (a client certificate and its key): give both or neither"
            )
        if token is not None and (problem := token_problem(token)):
            raise ValueError(f"token {problem}: give None to send no token")
        if problem := timeout_problem(timeout):
            raise ValueError(f"timeout {problem}")
        # Replies as large as the server sends, which sets no send limit: a reply of MAX_TEXTS texts outgrows gRPC's
        # default 4 MiB receive limit long before their request reaches MAX_MESSAGE_BYTES
        options = retry_options(retries) + RECEIVE_ANY + (DIRECT if on_loopback(address) else [])
        secure = uses_tls(tls, tls_ca, tls_cert)
        if token and not secure and not (on_loopback(address) or _unspecified(address)):
            warnings.warn(
                f"the token goes to {address} in plaintext, readable on the network between: use TLS (tls_ca or tls; "
                "the CLI's --tls-ca or --tls), unless a mesh or proxy encrypts the traffic",
                UserWarning,
                stacklevel=2,
            )
        if secure:
            root, key, chain = _read(tls_ca), _read(tls_key), _read(tls_cert)  # an OSError naming its file first
            check_pem(tls_cert, tls_key, tls_ca)
            credentials = grpc.ssl_channel_credentials(root_certificates=root, private_key=key, certificate_chain=chain)
            self.channel = grpc.secure_channel(address, credentials, options=options)
        else:
            self.channel = grpc.insecure_channel(address, options=options)
        self.metadata = bearer(token)
        self.timeout = timeout
        self.stub = classifier_pb2_grpc.ClassifierStub(self.channel)
        self._labels: dict[tuple[str, str], list[str]] = {}
        self._message_limits: dict[bool, int | None] = {}  # MAX_MESSAGE_BYTES by API (KServe's or not), once given

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def close(self) -> None:
        self.channel.close()

    def _call(self, method, request):
        return method(request, timeout=self.timeout, metadata=self.metadata)

    def model_info(self, model: str = "", version: str = "") -> dict:
        """The info of model `model` at `version` (empty: the served one); NOT_FOUND for a model it does not serve."""
        request = classifier_pb2.GetModelInfoRequest(model_name=model, model_version=version)
        return _info(self._call(self.stub.GetModelInfo, request))

    def labels(self, name: str = "", version: str = "") -> list[str]:
        """The labels of model `name` at `version`. An explicit name and version are asked of the server once, then
        kept; an empty name or version (the served one) is asked each time, as a reload changes it, and the answer kept
        under the name and version the server gives. NOT_FOUND once the server no longer serves a version it was
        asked for (a reload), rather than another version's labels."""
        if (name, version) not in self._labels:
            info = self.model_info(name, version)
            self._labels[(info["name"], info["version"])] = info["labels"]
            return info["labels"]
        return self._labels[(name, version)]

    def answered_labels(self, name: str, version: str, *tried: str) -> list[str]:
        """The labels of a reply from model `name` at `version` (`labels`). `LabelsUnavailable` where GetModelInfo
        cannot give them, naming the ways `tried` before it ('ModelConfig: ...') too: the texts were answered, and are
        not to blame. A NOT_FOUND is not asked again: the version that answered is gone (a reload), as the message says."""
        try:
            return self.labels(name, version)
        except grpc.RpcError as err:
            failures = [*tried, f"GetModelInfo: {_failure(err)}"]
            if err.code() == grpc.StatusCode.NOT_FOUND:
                failures.append(
                    "the server no longer serves that version (it was reloaded): classify those texts again"
                )
            raise LabelsUnavailable(
                f"the server answered, but the labels of model {name} version {version} cannot be read: "
                + "; ".join(failures)
            ) from err

    def _send(self, method, request, model: str, kserve: bool = False):
        """`method`'s reply to `request`, or `NotSent` where the request is larger than the server's largest message (its
        MAX_MESSAGE_BYTES, asked of it through `limits`): gRPC would refuse it with RESOURCE_EXHAUSTED, and the retry
        policy send it again `retries` times. A request no server refuses, or one to a server that does not say its
        limit, is sent. The limit is kept, and asked again before a refusal and after a large request is refused, as the
        server behind the address may have been restarted with another."""
        size = request.ByteSize()
        if size > MIN_MESSAGE_BYTES:  # a request over the smallest MAX_MESSAGE_BYTES
            self._check_size(size, model, kserve)
        try:
            return self._call(method, request)
        except grpc.RpcError as err:
            if size > MIN_MESSAGE_BYTES and err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED:
                self._message_limits.pop(kserve, None)
            raise

    def _check_size(self, size: int, model: str, kserve: bool) -> None:
        """`NotSent` where `size` bytes are over the server's message limit, as it says now (see `_send`); where it
        cannot be asked again, the limit it gave before stands."""
        kept = self._message_limits.get(kserve, 0)  # 0: not asked yet; a limit given is positive, or None
        if kept != 0 and (kept is None or size <= kept):
            return
        try:
            limit = self.limits(model, kserve)[1]  # not asked yet, or asked again before a refusal
        except grpc.RpcError:  # the call itself says what is wrong with the server or the model
            limit = kept or None
        if limit is not None and size > limit:
            raise NotSent(
                f"the request is {size} bytes, over the {limit} the server takes in a message (its "
                "MAX_MESSAGE_BYTES): not sent; send fewer texts in a call, or shorter ones"
            )

    def classify(self, texts: Iterable[str], pairs: Iterable[str] | None = None, model: str = "") -> dict:
        """Classify through `Classifier/Classify`; `NotSent` for a request over the server's largest message, and the
        errors of `_checked` for a string given as the texts or pairs, or pairs other in number than the texts."""
        texts, pairs = _checked(texts, pairs)
        reply = self._send(self.stub.Classify, classify_request(texts, pairs, model), model)
        labels = self.answered_labels(reply.model_name, reply.model_version)
        predictions = [
            _prediction(given, p.probabilities, labels) | _cascade_fields(p.answered_by, p.escalation_refused)
            for given, p in zip(_given(texts, pairs), reply.predictions, strict=True)
        ]
        return {"model": reply.model_name, "version": reply.model_version, "predictions": predictions}

    def limits(self, model: str = "", kserve: bool = False) -> tuple[int | None, int | None]:
        """The most texts the server takes in one call (its MAX_TEXTS) and its largest message (MAX_MESSAGE_BYTES), from
        `GetModelInfo`, or with `kserve` KServe's `ModelConfig`; each None where the server does not say, or has no
        such method (UNIMPLEMENTED, as behind a gateway that exposes one API only). The message limit is kept for
        the client's check of a large request (`_send`)."""
        try:
            if kserve:
                from edgedistill.serve.proto import kserve_pb2, kserve_pb2_grpc  # see `kserve_request`

                stub = kserve_pb2_grpc.GRPCInferenceServiceStub(self.channel)
                config = self._call(stub.ModelConfig, kserve_pb2.ModelConfigRequest(name=model)).config
                message = config.parameters.get("max_message_bytes")
                texts, message_bytes = config.max_batch_size, int(message.string_value) if message is not None else 0
            else:
                info = self._call(self.stub.GetModelInfo, classifier_pb2.GetModelInfoRequest(model_name=model))
                texts, message_bytes = info.max_texts, info.max_message_bytes
                self._labels[(info.name, info.version)] = list(info.labels)  # a reply of that model asks none
        except grpc.RpcError as err:
            if err.code() != grpc.StatusCode.UNIMPLEMENTED:
                raise
            texts = message_bytes = None
        self._message_limits[kserve] = message_bytes or None
        return texts or None, message_bytes or None

    def kserve_infer(self, texts: Iterable[str], pairs: Iterable[str] | None = None, model: str = "") -> dict:
        """Classify through `inference.GRPCInferenceService/ModelInfer` with raw BYTES `text` (and `text_pair`). No
        output is named, so all come back: a cascade's `answered_by` and `escalation_refused` too. `NotSent` for a
        request over the server's largest message, and the errors of `_checked`, as `classify`."""
        from edgedistill.serve.proto import kserve_pb2_grpc  # see `kserve_request`

        texts, pairs = _checked(texts, pairs)
        stub = kserve_pb2_grpc.GRPCInferenceServiceStub(self.channel)
        reply = self._send(stub.ModelInfer, kserve_request(texts, pairs, model), model, kserve=True)
        outputs = {
            out.name: tensors.decode(out.name, out.datatype, list(out.shape), raw=data)
            for out, data in zip(reply.outputs, reply.raw_output_contents, strict=True)
        }
        # a cascade's per-row outputs, [batch, 1] (or [batch], as earlier servers sent them): one value per text
        members = outputs["answered_by"].reshape(-1) if "answered_by" in outputs else [b""] * len(texts)
        refused = outputs["escalation_refused"].reshape(-1) if "escalation_refused" in outputs else [False] * len(texts)
        labels = self.kserve_labels(reply.model_name, reply.model_version)
        predictions = [
            _prediction(given, row, labels) | _cascade_fields(member.decode(), bool(flag))
            for given, row, member, flag in zip(
                _given(texts, pairs), outputs["probabilities"], members, refused, strict=True
            )
        ]
        return {"model": reply.model_name, "version": reply.model_version, "predictions": predictions}

    def kserve_labels(self, name: str, version: str) -> list[str]:
        """The labels of model `name` at `version` as a client behind a gateway that exposes only KServe reads them:
        `ModelConfig`'s parameter `labels`, else the Classifier API's (`answered_labels`); kept per name and version.
        `LabelsUnavailable` where neither gives them."""
        if (name, version) not in self._labels:
            try:
                self._labels[(name, version)] = self._model_config_labels(name, version)
            except (grpc.RpcError, LookupError, ValueError) as kserve:  # ValueError: labels that are no JSON
                return self.answered_labels(name, version, f"ModelConfig: {_failure(kserve)}")
        return self._labels[(name, version)]

    def _model_config_labels(self, name: str, version: str) -> list[str]:
        """KServe `ModelConfig`'s parameter `labels` (a JSON list); `LookupError` where it has none."""
        from edgedistill.serve.proto import kserve_pb2, kserve_pb2_grpc  # see `kserve_request`

        stub = kserve_pb2_grpc.GRPCInferenceServiceStub(self.channel)
        config = self._call(stub.ModelConfig, kserve_pb2.ModelConfigRequest(name=name, version=version)).config
        labels = config.parameters.get("labels")
        if labels is None:
            raise LookupError("no parameter 'labels'")
        return json.loads(labels.string_value)

    def reload(self, bundle_path: str = "") -> dict:
        reply = self._call(self.stub.Reload, classifier_pb2.ReloadRequest(bundle_path=bundle_path))
        return {"model": _info(reply.model), "previous": _info(reply.previous)}


def classify_request(texts: list[str], pairs: list[str] | None, model: str) -> classifier_pb2.ClassifyRequest:
    """The `Classifier/Classify` request of `texts` (and `pairs`) for `model` (empty: the served one)."""
    return classifier_pb2.ClassifyRequest(texts=texts, text_pairs=[] if pairs is None else pairs, model_name=model)


def kserve_request(texts: list[str], pairs: list[str] | None, model: str):
    """The KServe `ModelInfer` request of `texts` (and `pairs`) for `model`: raw BYTES `text` (and `text_pair`)."""
    # imported here: its `inference.*` messages clash with tritonclient's in one process
    from edgedistill.serve.proto import kserve_pb2

    request = kserve_pb2.ModelInferRequest(model_name=model)
    for name, values in zip(text_inputs(pairs=True), (texts, pairs), strict=True):
        if values is not None:
            request.inputs.add(name=name, datatype="BYTES", shape=[len(values)])
            request.raw_input_contents.append(tensors.serialize_bytes([v.encode("utf-8") for v in values]))
    return request


def _checked(texts: Iterable[str], pairs: Iterable[str] | None) -> tuple[list[str], list[str] | None]:
    """`texts` and `pairs` as lists (a generator or an array read once, None kept), before anything is sent:
    `TypeError` for a string given for either (which would be sent as its characters, one text each), `ValueError` for
    pairs other in number than the texts."""
    for name, values in (("texts", texts), ("pairs", pairs)):
        if isinstance(values, str | bytes):
            raise TypeError(f"{name} is a {type(values).__name__}: give a list of texts ([{values!r}] for one)")
    texts, pairs = list(texts), None if pairs is None else list(pairs)
    if pairs is not None and len(pairs) != len(texts):
        raise ValueError(f"{len(pairs)} pairs for {len(texts)} texts: give one pair for each text, or pairs=None")
    return texts, pairs


def _given(texts: list[str], pairs: list[str] | None) -> list[dict]:
    """What each prediction was asked about: its "text", and its "pair" for a text pair."""
    if pairs is None:
        return [{"text": text} for text in texts]
    return [{"text": text, "pair": pair} for text, pair in zip(texts, pairs, strict=True)]


def _prediction(given: dict, probabilities, labels: list[str]) -> dict:
    probabilities = [float(p) for p in probabilities]
    best = int(np.argmax(probabilities))
    return given | {
        "label": labels[best],
        "score": probabilities[best],
        "probabilities": dict(zip(labels, probabilities, strict=True)),
    }


def _cascade_fields(answered_by: str, escalation_refused: bool) -> dict:
    """A cascade's `answered_by` (and `escalation_refused` where set); nothing for a single bundle (no member)."""
    if not answered_by:
        return {}
    return {"answered_by": answered_by} | ({"escalation_refused": True} if escalation_refused else {})


def _failure(error: Exception) -> str:
    """A failed call's status and details, or another error's text."""
    return f"{error.code().name} ({error.details()})" if isinstance(error, grpc.RpcError) else str(error)


def _read(path: Path | None) -> bytes | None:
    return None if path is None else Path(path).read_bytes()


SERVER_WIDE = ("pid", "max_texts", "max_message_bytes")  # a cascade member's ModelInfo has 0: the cascade's gives them


def _info(message) -> dict:
    """A ModelInfo (or a message within it) as JSON-ready values: nested messages as dicts, unset optional fields
    (a cascade's last member's threshold) as None, and a cascade member's model without the fields of the server
    (`SERVER_WIDE`), which the cascade's own gives."""
    fields = {}
    for field in message.DESCRIPTOR.fields:
        value = getattr(message, field.name)
        if field.message_type is not None:
            value = [_info(v) for v in value] if field.is_repeated else _info(value)
        elif field.is_repeated:
            value = list(value)
        elif field.has_presence and not message.HasField(field.name):
            value = None
        fields[field.name] = value
    if isinstance(message, classifier_pb2.CascadeMember):
        fields["model"] = {name: value for name, value in fields["model"].items() if name not in SERVER_WIDE}
    return fields


class NotSent(grpc.RpcError):
    """A request the client refused before sending it, as the server would refuse it: RESOURCE_EXHAUSTED, with the
    server's limit in `details()`, so that a caller handles it as the server's answer."""

    def __init__(self, details: str):
        super().__init__(details)
        self._details = details

    def code(self) -> grpc.StatusCode:
        return grpc.StatusCode.RESOURCE_EXHAUSTED

    def details(self) -> str:
        return self._details


class LabelsUnavailable(RuntimeError):
    """A reply's label names could not be read (`answered_labels`): the texts were answered, not refused."""
