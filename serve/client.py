"""A small client for the server, as a library (`Client`) and a CLI printing JSON.

python -m serve.client "a great movie" "a dull one"
EDGEDISTILL_TOKEN=... python -m serve.client --file reviews.txt --file more.txt --address host:50051 --tls-ca ca.pem
python -m serve.client "the plot" --pair "a dull one"      # a text pair, for models trained on pairs
python -m serve.client --tsv dev.tsv --header               # pairs: text<TAB>pair on each line
echo "a great movie" | python -m serve.client --kserve

The CLI sends the texts in calls of `--batch-size` texts and at most `--batch-bytes` of text (default: as many texts as
the server takes, its MAX_TEXTS, and half its MAX_MESSAGE_BYTES, asked of it), and writes one JSON document, its
predictions as they come.
"""

import argparse
import json
import os
import re
import ssl
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TextIO

import grpc
import numpy as np
from edgedistill.common.arguments import count, input_file
from edgedistill.common.settings import ENV_PREFIX
from edgedistill.common.text import BOM, shows_nothing, utf16_sign
from edgedistill.serve import tensors
from edgedistill.serve.proto import classifier_pb2, classifier_pb2_grpc
from edgedistill.serve.settings import (
    DIRECT,
    GRPC_INT_MAX,
    MIN_MESSAGE_BYTES,
    TARGET_SCHEMES,
    Settings,
    blank,
    on_loopback,
)
from edgedistill.serve.tls import TLS_FILES, check_pem
from grpc_health.v1 import health_pb2, health_pb2_grpc

DEFAULT_ADDRESS = "localhost:50051"
RETRIED_CODES = ("UNAVAILABLE", "RESOURCE_EXHAUSTED")  # a draining or restarting server, a full queue
MAX_ATTEMPTS = 5  # gRPC's own cap on retryPolicy.maxAttempts
MAX_TIMEOUT = 1e9  # seconds; gRPC keeps a deadline in int64 nanoseconds since the epoch, which end in 2262
# For a server that does not say its limits: its default MAX_TEXTS, and half its default MAX_MESSAGE_BYTES
MAX_TEXTS = Settings.model_fields["max_texts"].default
# what a text costs in a call beyond its UTF-8 bytes: a field tag and length (Classify), a 4-byte length (KServe's
# raw contents); short texts add more in these than in text
WIRE_BYTES = 8
BATCH_BYTES = Settings.model_fields["max_message_bytes"].default // 2
# How the server names a text or pair it refuses: "text" or "text pair", and its place in the call, counted from 0
SERVER_NAMED_TEXT = re.compile(r"(text(?: pair)?) (\d+) ")
# The CLI's token without --token (whose value every user of the machine sees in `ps`): the server's own variables
TOKEN_VAR, ADMIN_TOKEN_VAR = ENV_PREFIX + "TOKEN", ENV_PREFIX + "ADMIN_TOKEN"
# A token the client refuses, as the server refuses such a TOKEN at start (`serve.settings.blank`): one set blank is a
# mistake (a compose file's `${VAR:-}`), which would otherwise go as no token and fail UNAUTHENTICATED
BLANK_TOKEN = "empty, 'none' or 'off', which no server's TOKEN can be"
# Where each text and each pair is in the input, by the server's name for its kind: "text" and "text pair"
Origins = dict[str, list[str]]


def retry_options(retries: int) -> list[tuple[str, object]]:
    """Channel options for gRPC's retry policy: up to `retries` more attempts of a call that failed with
    UNAVAILABLE or RESOURCE_EXHAUSTED, with exponential backoff (50 ms doubling, at most 1 s, jittered),
    within the call's deadline, whatever the call's size. The server stops them for errors that would recur (a request
    over a limit)."""
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
    # Spelled out: kserve_pb2 is imported only when used (see `kserve_infer`), and the server's modules never.
    services = ("edgedistill.v1.Classifier", "inference.GRPCInferenceService")
    config = {"methodConfig": [{"name": [{"service": name} for name in services], "retryPolicy": policy}]}
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
        timeout: float = 10.0,
        retries: int = 3,
    ):
        """`retries`: more attempts of a call that failed with UNAVAILABLE or RESOURCE_EXHAUSTED (`retry_options`).
        `OSError` for TLS files that cannot be read, `ssl.SSLError` (one) for those gRPC cannot use (`check_pem`). A
        server on this machine's loopback is called straight, past a proxy the environment names (`DIRECT`)."""
        options = retry_options(retries) + (DIRECT if on_loopback(address) else [])
        if tls or tls_ca or tls_cert:
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

    def classify(self, texts: list[str], pairs: list[str] | None = None, model: str = "") -> dict:
        """Classify through `Classifier/Classify`; `NotSent` for a request over the server's largest message."""
        request = classifier_pb2.ClassifyRequest(texts=texts, text_pairs=pairs or [], model_name=model)
        reply = self._send(self.stub.Classify, request, model)
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
                from edgedistill.serve.proto import kserve_pb2, kserve_pb2_grpc  # see `kserve_infer`

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

    def kserve_infer(self, texts: list[str], pairs: list[str] | None = None, model: str = "") -> dict:
        """Classify through `inference.GRPCInferenceService/ModelInfer` with raw BYTES `text` (and `text_pair`). No
        output is named, so all come back: a cascade's `answered_by` and `escalation_refused` too. `NotSent` for a
        request over the server's largest message."""
        # imported here: its `inference.*` messages clash with tritonclient's in one process
        from edgedistill.serve.proto import kserve_pb2, kserve_pb2_grpc

        stub = kserve_pb2_grpc.GRPCInferenceServiceStub(self.channel)
        request = kserve_pb2.ModelInferRequest(model_name=model)
        for name, values in (("text", texts), ("text_pair", pairs)):
            if values is not None:
                request.inputs.add(name=name, datatype="BYTES", shape=[len(values)])
                request.raw_input_contents.append(tensors.serialize_bytes([v.encode("utf-8") for v in values]))
        reply = self._send(stub.ModelInfer, request, model, kserve=True)
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
        from edgedistill.serve.proto import kserve_pb2, kserve_pb2_grpc  # see `kserve_infer`

        stub = kserve_pb2_grpc.GRPCInferenceServiceStub(self.channel)
        config = self._call(stub.ModelConfig, kserve_pb2.ModelConfigRequest(name=name, version=version)).config
        labels = config.parameters.get("labels")
        if labels is None:
            raise LookupError("no parameter 'labels'")
        return json.loads(labels.string_value)

    def reload(self, bundle_path: str = "") -> dict:
        reply = self._call(self.stub.Reload, classifier_pb2.ReloadRequest(bundle_path=bundle_path))
        return {"model": _info(reply.model), "previous": _info(reply.previous)}


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


def _info(message) -> dict:
    """A ModelInfo (or a message within it) as JSON-ready values: nested messages as dicts, unset optional fields
    (a cascade's last member's threshold) as None."""
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


class UsageError(ValueError):
    """Arguments or input files the CLI cannot use; the message says why."""


class LabelsUnavailable(RuntimeError):
    """A reply's label names could not be read (`answered_labels`): the texts were answered, not refused."""


class ModelChanged(RuntimeError):
    """The served model changed between the batches of one run (a reload): its predictions would mix models."""


class CallFailed(Exception):
    """A call of a run in batches failed with `error`: `where` names its texts in the input (`classify_in_batches`)."""

    def __init__(self, error: grpc.RpcError, where: str):
        super().__init__(where)
        self.error, self.where = error, where


def _not_utf8(source: str, err: UnicodeDecodeError) -> UsageError:
    """The error for input that is not UTF-8, naming the line and byte."""
    line = err.object.count(b"\n", 0, err.start) + 1
    return UsageError(f"cannot read {source}: it is not UTF-8 ({err.reason} at byte {err.start}, line {line})")


def lines_of(path: Path, stdin: TextIO, layout: str = "one text per line") -> list[str]:
    """The lines of `path` ('-': stdin's bytes, whatever the locale's encoding), which must be UTF-8 (a leading byte
    order mark, as Windows tools write, is dropped), each ended by LF, CR LF or CR only: `str.splitlines` would also
    end one at a form feed, U+0085 or U+2028, characters a text may hold."""
    if str(path) == "-":
        if stdin is None:  # started with stdin closed (`<&-`)
            raise UsageError("stdin is closed: give the texts as arguments, --file or --tsv")
        if stdin.isatty():  # else a call without texts would seem to hang
            print(f"reading from the terminal, {layout}; end with Ctrl-D", file=sys.stderr, flush=True)
        if hasattr(stdin, "buffer"):
            text = _utf8_text(stdin.buffer.read(), "stdin")
        else:  # a text stream over no bytes (io.StringIO)
            text = stdin.read()
            try:  # for lone surrogates, as a C locale's text stdin lets bytes that are not UTF-8 through
                text.encode("utf-8")
            except UnicodeEncodeError as err:
                raise UsageError(f"cannot read stdin: it is not UTF-8 ({err.reason} at position {err.start})") from err
    else:
        try:
            text = _utf8_text(path.read_bytes(), str(path))
        except OSError as err:
            raise UsageError(f"cannot read {path}: {err}") from err
    return text.removeprefix(BOM).replace("\r\n", "\n").replace("\r", "\n").split("\n")


def _utf8_text(data: bytes, source: str) -> str:
    """`data` of `source` decoded as UTF-8; `UsageError` naming how it is not, and UTF-16 text (Notepad's "Unicode")
    by how it shows (`utf16_sign`)."""
    if utf16 := utf16_sign(data[: data.find(b"\n") + 1] or data):
        raise UsageError(f"cannot read {source}: it is UTF-16 text ({utf16}), not UTF-8; save it as UTF-8")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise _not_utf8(source, err) from err


def _comma_separated(line: str, option: str) -> str:
    """For the error about a line `option` (`--tsv`) cannot split: what it says where the line looks like CSV (a
    recipe's data may be CSV, and `--columns` takes its column names)."""
    if "\t" in line or "," not in line:
        return ""
    return f" (separated by commas: a CSV file? {option} reads tab-separated fields only: save the file as TSV)"


def add_columns_arguments(parser: argparse.ArgumentParser, files: str) -> None:
    """`--header` and `--columns TEXT PAIR`: how `read_tsv` reads `files` ("each --tsv file"), for every command that
    takes text pairs from such files (`check_columns` checks them)."""
    parser.add_argument(
        "--header", action="store_true", help=f"skip the header of {files}: its first line that is not blank"
    )
    parser.add_argument(
        "--columns",
        nargs=2,
        metavar=("TEXT", "PAIR"),
        help=f"the text and pair columns of {files}, named as in its header (a recipe's data.text_column and "
        "data.text_pair_column); default: the first two fields, whatever the header says",
    )


def check_columns(columns: list[str] | None, header: bool, files_given: bool, option: str) -> None:
    """`UsageError` for `--columns` or `--header` without a file of `option` to read them in (either would do
    nothing), or `--columns` naming one column twice."""
    if columns and not files_given:
        raise UsageError(f"--columns names the columns of {option} files: give one")
    if header and not files_given:
        raise UsageError(f"--header skips the first line of {option} files: give one, or drop --header")
    if columns and columns[0] == columns[1]:
        raise UsageError(f"--columns names {columns[0]!r} twice: name the text's column, then the pair's")


def read_tsv(
    path: Path, header: bool, stdin: TextIO, columns: tuple[str, str] | None = None, option: str = "--tsv"
) -> tuple[list[str], list[str]]:
    """Texts and their pairs, as `numbered_pairs` reads them."""
    rows = numbered_pairs(path, header, stdin, columns, option)
    return [text for _, text, _ in rows], [pair for _, _, pair in rows]


def numbered_pairs(
    path: Path, header: bool, stdin: TextIO, columns: tuple[str, str] | None = None, option: str = "--tsv"
) -> list[tuple[int, str, str]]:
    """(line number, text, pair): the first two tab-separated fields of each line, or with `columns` the fields under
    those two names of the header; no quoting, other fields such as a label ignored, neither text may be empty;
    blank lines skipped, and with `header` or `columns` the first other line, the header, as the data loader reads
    it. Errors name the file's `option`."""
    rows = []
    where = (0, 1)
    wants = "text<TAB>pair on each line"
    layout = "text<TAB>pair on each line" if columns is None else "the header line, then tab-separated fields"
    lines = lines_of(path, stdin, layout)
    header_due = header or columns is not None
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        if header_due:
            header_due = False
            if columns:
                names = [name.strip() for name in line.split("\t")]
                if missing := [name for name in columns if name not in names]:
                    raise UsageError(
                        f"{path}:{number} (the header): no column {missing}; found {names}"
                        f"{_comma_separated(line, option)}"
                    )
                where = (names.index(columns[0]), names.index(columns[1]))
                wants = f"the columns {list(columns)} on each line"
            continue
        fields = line.split("\t")
        if len(fields) <= max(where):
            short = "no tab" if len(fields) < 2 else f"{len(fields)} fields"
            # after a line holding a tab (a header too, skipped or split into the columns), the file is TSV and a
            # comma the text's own
            tabbed = any("\t" in before for before in lines[: number - 1])
            csv = "" if tabbed else _comma_separated(line, option)
            raise UsageError(f"{path}:{number}: {short}; {option} wants {wants}{csv}")
        text, pair = fields[where[0]], fields[where[1]]
        if shows_nothing(text) or shows_nothing(pair):  # the server would name its place in a call
            raise UsageError(
                f"{path}:{number}: an empty text or pair (or one of control, zero-width or replacement characters "
                f"only); {option} wants {wants}"
            )
        rows.append((number, text, pair))
    return rows


def read_lines(path: Path, stdin: TextIO) -> list[str]:
    """The lines of `path` ('-': stdin) that are not blank, as `numbered_lines` reads them."""
    return [line for _, line in numbered_lines(path, stdin)]


def numbered_lines(path: Path, stdin: TextIO) -> list[tuple[int, str]]:
    """(line number, line) of the lines of `path` ('-': stdin) that are not blank. One that shows nothing
    (`shows_nothing`) is refused, naming its line: the server would refuse it too (the model reads it as nothing),
    naming its place in one call."""
    texts = []
    for number, line in enumerate(lines_of(path, stdin), 1):
        if line.strip():
            if shows_nothing(line):
                raise UsageError(
                    f"{path}:{number}: only control, zero-width or replacement (U+FFFD) characters, which the model "
                    "reads as nothing; remove them or the line"
                )
            texts.append((number, line))
    return texts


def read_texts(args: argparse.Namespace, stdin: TextIO) -> tuple[list[str], list[str] | None, Origins]:
    """Texts, their pairs (None: single texts) and where each is (`Origins`: 'reviews.txt:70', 'argument 2', '--pair
    2'): from each `--tsv`; else the arguments, then each `--file` (one per line; `-` is stdin), else stdin, blank
    lines skipped, with the `--pair` values."""
    check_columns(args.columns, args.header, bool(args.tsv), "--tsv")
    if args.tsv:
        if args.texts or args.file or args.pair:
            raise UsageError("give texts either in --tsv files or as arguments, --file and --pair, not both")
        texts, pairs, origins = [], [], []
        for path in args.tsv:
            for number, text, pair in numbered_pairs(path, args.header, stdin, args.columns):
                texts.append(text)
                pairs.append(pair)
                origins.append(f"{path}:{number}")
        pair_origins = origins  # a pair is on its text's line
    else:
        texts = list(args.texts)
        origins = [f"argument {i}" for i in range(1, len(texts) + 1)]
        paths = args.file or ([] if texts else [Path("-")])
        for path in paths:
            for number, line in numbered_lines(path, stdin):
                texts.append(line)
                origins.append(f"{path}:{number}")
        pairs = args.pair
        pair_origins = [f"--pair {i}" for i in range(1, len(pairs or []) + 1)]
    if not texts:
        raise UsageError("no texts (give them as arguments, --file, --tsv or on stdin)")
    if pairs is not None and len(pairs) != len(texts):
        raise UsageError(
            f"{len(pairs)} --pair values for {len(texts)} texts: give one per text (none to a model of single texts)"
        )
    return texts, pairs, {"text": origins, "text pair": pair_origins}


def batches(texts: list[str], pairs: list[str] | None, batch_size: int, batch_bytes: int) -> Iterator[slice]:
    """Consecutive slices of at most `batch_size` texts whose bytes on the wire (UTF-8 and WIRE_BYTES each, their
    pairs' included) add up to at most `batch_bytes`; a text longer than that on its own is a batch of one, for the
    server to take or refuse."""
    start, size = 0, 0
    for i, text in enumerate(texts):
        length = WIRE_BYTES + len(text.encode()) + (0 if pairs is None else WIRE_BYTES + len(pairs[i].encode()))
        if i > start and (i - start == batch_size or size + length > batch_bytes):
            yield slice(start, i)
            start, size = i, 0
        size += length
    if texts:
        yield slice(start, len(texts))


def classify_in_batches(
    infer,
    texts: list[str],
    pairs: list[str] | None,
    batch_size: int,
    model: str = "",
    batch_bytes: int = BATCH_BYTES,
    origins: Origins | None = None,
) -> Iterator[dict]:
    """`infer` (`Client.classify` or `Client.kserve_infer`) on consecutive `batches`; each reply in order;
    `ModelChanged` when the served model changes between batches; `CallFailed` for a call that fails, naming where
    its texts are by their `origins` (default: 'text N' and 'text pair N', counted from 1)."""
    numbers = range(1, len(texts) + 1)
    origins = origins or {kind: [f"{kind} {number}" for number in numbers] for kind in ("text", "text pair")}
    first = None
    for batch in batches(texts, pairs, batch_size, batch_bytes):
        start = batch.start
        try:
            result = infer(texts[batch], None if pairs is None else pairs[batch], model=model)
        except grpc.RpcError as err:
            raise CallFailed(err, _where(err, {kind: places[batch] for kind, places in origins.items()})) from err
        served = (result["model"], result["version"])
        if first is not None and served != first:
            raise ModelChanged(
                f"the server switched from model {first[0]} version {first[1]} to {served[0]} version {served[1]} "
                f"after {start} texts: classify the texts again"
            )
        first = served
        yield result


def _where(error: grpc.RpcError, origins: Origins) -> str:
    """Where the texts of a call that failed with `error` are: the text or pair the server refused where it names it
    (as 'text 5' or 'text pair 5', counted from 0 in the call), else the call's first and last texts."""
    named = SERVER_NAMED_TEXT.match(error.details() or "")
    if error.code() == grpc.StatusCode.INVALID_ARGUMENT and named and int(named[2]) < len(origins[named[1]]):
        return origins[named[1]][int(named[2])]
    texts = origins["text"]
    return texts[0] if len(texts) == 1 else f"{texts[0]} to {texts[-1]}"


def write_streamed(results: Iterator[dict], out: TextIO) -> None:
    """One JSON document {"model", "version", "predictions": [...]}, each prediction written (one a line) as its
    batch arrives. Where `results` raise after the first batch (a refused call, a reload, Ctrl-C), the document is
    still closed, holding the predictions so far and `"complete": false`, and the error goes on."""
    separator, complete = None, False  # None: the head is not written yet
    try:
        for result in results:
            if separator is None:
                head = json.dumps({"model": result["model"], "version": result["version"]})
                out.write(head[:-1] + ', "predictions": [\n')
                separator = "  "
            for prediction in result["predictions"]:
                out.write(separator + json.dumps(prediction))
                separator = ",\n  "
            out.flush()
        complete = True
    finally:
        if separator is not None:
            out.write("\n]" + ("}" if complete else ', "complete": false}') + "\n")
            out.flush()


def _utf8(value: str) -> str:
    """An argument that is UTF-8: Python passes bytes that are not on as lone surrogates, which no message can carry."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as err:
        raise argparse.ArgumentTypeError(f"not UTF-8 ({err.reason} at position {err.start})") from None
    return value


def _token(value: str) -> str:
    """A token to send: not blank (`BLANK_TOKEN`), and printable ASCII, as gRPC metadata values are."""
    if blank(value):
        raise argparse.ArgumentTypeError(f"{BLANK_TOKEN}: drop --token to send none")
    if not (value.isascii() and value.isprintable()):
        raise argparse.ArgumentTypeError("must be printable ASCII, as gRPC metadata values are")
    return value


# `host:port` or `[v6]:port`, where the rest is no gRPC target of a scheme (`dns:`, `unix:` and the others)
HOST_PATTERN = r"\[[^\]]*\]|[^:\[\]]+"  # a name or IPv4 address, or an IPv6 one in brackets
HOST_PORT = re.compile(rf"(?!(?:{'|'.join(TARGET_SCHEMES)}):)({HOST_PATTERN}):([^:]*)")
HOST = re.compile(HOST_PATTERN)  # a host alone, which gRPC would dial on port 443


def _address(value: str) -> str:
    if not value.strip():
        raise argparse.ArgumentTypeError("must name the server, host:port")
    if HOST.fullmatch(value):
        port = DEFAULT_ADDRESS.rsplit(":", 1)[1]
        raise argparse.ArgumentTypeError(
            f"{value} names no port, and gRPC would dial 443: give host:port, e.g. {value}:{port}, the server's default"
        )
    # gRPC takes a port past 65535 modulo 65536: another port, on which another server may answer
    if (plain := HOST_PORT.fullmatch(value)) and not (plain[2].isdigit() and 0 < int(plain[2]) < 65536):
        raise argparse.ArgumentTypeError(f"the port of {value} must be a number from 1 to 65535")
    return value


def _seconds(value: str) -> float:
    seconds = float(value)
    # A deadline of 0 or less, or nan, fails every call before it is sent; so does one past MAX_TIMEOUT, which
    # overflows gRPC's clock.
    if not 0 < seconds <= MAX_TIMEOUT:
        raise argparse.ArgumentTypeError(f"must be above 0 and at most {MAX_TIMEOUT:.0e}, got {value}")
    return seconds


def build_parser(prog: str = "python -m serve.client") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog, description="Classify texts with an edgedistill server.")
    parser.add_argument(
        "texts", nargs="*", type=_utf8, help="texts to classify (default: --file, else one per line on stdin)"
    )
    parser.add_argument(
        "--file", type=input_file, action="append", help="a file with one text per line ('-': stdin); repeatable"
    )
    parser.add_argument(
        "--pair", action="append", type=_utf8, help="the second text of a pair, one per text in order; repeatable"
    )
    parser.add_argument(
        "--tsv",
        type=input_file,
        action="append",
        help="text pairs, text<TAB>pair on each line, or the --columns (no quoting; further fields ignored; '-': "
        "stdin); repeatable",
    )
    add_columns_arguments(parser, "each --tsv file")
    parser.add_argument(
        "--batch-size",
        type=count,
        metavar="N",
        help=f"texts per call, at most the server's MAX_TEXTS (default: that limit, asked of the server; {MAX_TEXTS} "
        "where it does not say)",
    )
    parser.add_argument(
        "--batch-bytes",
        type=count,
        metavar="N",
        help=f"bytes per call (each text's UTF-8 and {WIRE_BYTES}), below the server's MAX_MESSAGE_BYTES; a longer "
        "text goes alone (default: half "
        f"that limit, asked of the server; {BATCH_BYTES} where it does not say)",
    )
    parser.add_argument(
        "--address", default=DEFAULT_ADDRESS, type=_address, help=f"server host:port (default {DEFAULT_ADDRESS})"
    )
    parser.add_argument("--kserve", action="store_true", help="use the KServe v2 protocol (ModelInfer)")
    parser.add_argument("--model", default="", type=_utf8, help="model name (default: the served one)")
    parser.add_argument(
        "--token",
        type=_token,
        help=f"bearer token (default: ${TOKEN_VAR}, for --reload ${ADMIN_TOKEN_VAR}: a flag shows in `ps`)",
    )
    parser.add_argument("--tls", action="store_true", help="TLS with the system's root certificates")
    parser.add_argument("--tls-ca", type=Path, help="CA certificate (PEM) to verify the server with; implies TLS")
    parser.add_argument("--tls-cert", type=Path, help="client certificate (PEM) for mutual TLS")
    parser.add_argument("--tls-key", type=Path, help="client private key (PEM) for mutual TLS")
    parser.add_argument("--timeout", type=_seconds, default=10.0, help="deadline per call in seconds (default 10)")
    parser.add_argument(
        "--retries",
        type=int,
        default=3,
        choices=range(MAX_ATTEMPTS),
        metavar="N",
        help=f"retries of a call refused with UNAVAILABLE or RESOURCE_EXHAUSTED, with backoff, 0-{MAX_ATTEMPTS - 1} "
        "(default 3)",
    )
    instead = parser.add_mutually_exclusive_group()  # each makes one call of its own, and sends no texts
    instead.add_argument("--info", action="store_true", help="print the served model's info instead")
    instead.add_argument(
        "--reload",
        nargs="?",
        const="",
        type=_utf8,
        metavar="BUNDLE",
        help="reload the served bundle, or load BUNDLE: a folder inside the server's RELOAD_ROOT, absolute or relative "
        "to that root",
    )
    return parser


# The options that only a classification uses, by their `argparse` destination: --info and --reload send no texts.
CLASSIFY_OPTIONS = {
    "texts": "text arguments",
    "file": "--file",
    "pair": "--pair",
    "tsv": "--tsv",
    "header": "--header",
    "columns": "--columns",
    "kserve": "--kserve",
    "batch_size": "--batch-size",
    "batch_bytes": "--batch-bytes",
}


def check_arguments(args: argparse.Namespace) -> None:
    """`UsageError` for options given where they would do nothing: those of a classification with --info or
    --reload, --model with --reload (a Reload call names no model), and a client certificate without its key or the
    reverse."""
    if (args.tls_cert is None) != (args.tls_key is None):
        raise UsageError(
            "--tls-cert and --tls-key go together (a client certificate and its key): give both or neither"
        )
    command = "--info" if args.info else "--reload" if args.reload is not None else None
    if command is None:
        return
    if unused := [option for name, option in CLASSIFY_OPTIONS.items() if getattr(args, name)]:
        raise UsageError(f"{command} sends no texts: {', '.join(unused)} would do nothing with it; drop them")
    if command == "--reload" and args.model:
        raise UsageError("--reload names no model (it reloads the served bundle, or loads BUNDLE): drop --model")


def check_batches(batch_size: int | None, batch_bytes: int | None, max_texts: int | None, max_bytes: int | None):
    """`UsageError` for a --batch-size or --batch-bytes past the server's limits (None: it does not say), asked for
    the other: every call would be refused."""
    if batch_size and max_texts and batch_size > max_texts:
        raise UsageError(f"--batch-size {batch_size} is over the server's MAX_TEXTS, {max_texts}: give at most that")
    if batch_bytes and max_bytes and batch_bytes >= max_bytes:
        raise UsageError(
            f"--batch-bytes {batch_bytes} is not below the server's MAX_MESSAGE_BYTES, {max_bytes}: give less"
        )


def environ_token(reload: bool) -> str | None:
    """The token of the variable the server reads it from (ADMIN_TOKEN_VAR for a Reload, else TOKEN_VAR); None
    where unset. `UsageError` for one set but blank (`BLANK_TOKEN`), or one gRPC metadata cannot carry."""
    name = ADMIN_TOKEN_VAR if reload else TOKEN_VAR
    token = os.environ.get(name)
    if token is not None and blank(token):
        raise UsageError(f"{name} is {BLANK_TOKEN}: unset it to send no token, or set it to the server's token")
    if token is not None and not (token.isascii() and token.isprintable()):
        raise UsageError(f"{name} must be printable ASCII, as gRPC metadata values are (a trailing newline?)")
    return token


def _input_hint(client: Client, model: str, given_pairs: bool) -> str | None:
    """After a refused call, what to give the CLI where the texts were of the wrong shape for the served model
    (single texts for a model of pairs, or the reverse); None where they were not, or the server does not say."""
    try:
        takes_pairs = "text_pair" in client.model_info(model)["text_inputs"]
    except grpc.RpcError:
        return None
    if takes_pairs and not given_pairs:
        return "the served model takes text pairs: give --pair once per text, or --tsv FILE (text<TAB>pair lines)"
    if given_pairs and not takes_pairs:
        return "the served model takes single texts: give them as arguments or --file, without --pair or --tsv"
    return None


def main(argv: list[str] | None = None, stdin=None, prog: str = "python -m serve.client") -> int:
    # intermixed: texts may follow options, as `TEXT --pair PAIR TEXT --pair PAIR` does
    args = build_parser(prog).parse_intermixed_args(argv)
    if sys.stdout is None:  # started with stdout closed (`>&-`): every answer would be lost
        print(f"{prog}: stdout is closed: nowhere to write the answers", file=sys.stderr)
        return 2
    try:
        check_arguments(args)
        token = args.token or environ_token(args.reload is not None)
    except UsageError as err:
        print(f"{prog}: {err}", file=sys.stderr)
        return 2
    try:
        client = Client(
            args.address,
            token=token,
            tls=args.tls,
            tls_ca=args.tls_ca,
            tls_cert=args.tls_cert,
            tls_key=args.tls_key,
            timeout=args.timeout,
            retries=args.retries,
        )
    except ssl.SSLError as err:  # read, but not PEM, or a key that is not the certificate's
        print(f"{prog}: cannot use --tls-ca, --tls-cert or --tls-key ({TLS_FILES}): {err}", file=sys.stderr)
        return 2
    except OSError as err:  # a --tls-ca, --tls-cert or --tls-key that cannot be read
        print(f"{prog}: cannot read {err.filename}: {err.strerror}", file=sys.stderr)
        return 2
    hint = None  # what to give instead, where a call was refused for texts of the wrong shape
    where = None  # the texts of the call that failed, in the input
    try:
        with client:
            if args.info:
                print(json.dumps(client.model_info(args.model), indent=2), flush=True)
            elif args.reload is not None:
                print(json.dumps(client.reload(args.reload), indent=2), flush=True)
            else:
                texts, pairs, origins = read_texts(args, sys.stdin if stdin is None else stdin)
                infer = client.kserve_infer if args.kserve else client.classify
                batch_size, batch_bytes = args.batch_size, args.batch_bytes
                # A single text goes alone whatever they are; with both given, the server is not asked.
                if len(texts) > 1 and not (batch_size and batch_bytes):
                    max_texts, max_bytes = client.limits(args.model, args.kserve)
                    check_batches(batch_size, batch_bytes, max_texts, max_bytes)
                    batch_size = batch_size or max_texts
                    batch_bytes = batch_bytes or (max_bytes // 2 if max_bytes else None)
                results = classify_in_batches(
                    infer, texts, pairs, batch_size or MAX_TEXTS, args.model, batch_bytes or BATCH_BYTES, origins
                )
                try:
                    write_streamed(results, sys.stdout)
                except CallFailed as failed:
                    where = failed.where
                    if failed.error.code() == grpc.StatusCode.INVALID_ARGUMENT:
                        hint = _input_hint(client, args.model, pairs is not None)
                    raise failed.error from None
    except UsageError as err:
        print(f"{prog}: {err}", file=sys.stderr)
        return 2
    except (ModelChanged, LabelsUnavailable) as err:
        print(f"{prog}: {err}", file=sys.stderr)
        return 1
    except grpc.RpcError as err:
        error = {"code": err.code().name, "message": err.details()}
        error |= ({"where": where} if where else {}) | ({"hint": hint} if hint else {})
        print(json.dumps({"error": error}), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":  # its usage names the module as it was run: `edgedistill.` first when installed
    from edgedistill.cli import run_module

    run_module(main, f"python -m {__spec__.name}", "call")
