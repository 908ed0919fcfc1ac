"""Fixtures for the server tests: a tiny torch-free bundle and cascade, servers on port 0 (in-process or as `python -m serve`
subprocesses), throwaway certificates."""

import asyncio
import json
import os
import queue
import shutil
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import edgedistill.serve.host as serve_host
import grpc
import numpy as np
import onnx
import pytest
from edgedistill.common import manifest as mf
from edgedistill.common.bundle import BundleSpec, TensorSpec
from edgedistill.common.cascade import MEMBERS, CascadeMember, CascadeSpec
from edgedistill.serve.encoding import TextEncoder
from edgedistill.serve.proto import classifier_pb2, classifier_pb2_grpc
from onnx import TensorProto, helper
from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors

ROOT = Path(__file__).resolve().parents[2]
SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]"]
POSITIVE = ["great", "good", "love", "wonderful", "best", "fun"]
NEGATIVE = ["bad", "awful", "boring", "worst", "hate", "dull"]
NEUTRAL = ["a", "the", "movie", "film", "was", "is", "this", "plot", "acting", "and", "it", "not", "very", "of"]
VOCAB = SPECIALS + POSITIVE + NEGATIVE + NEUTRAL
MAX_LENGTH = 16
LABELS = ["negative", "positive"]
PAIR_INPUTS = ("input_ids", "attention_mask", "token_type_ids")


def tiny_tokenizer(pair_types: bool = True) -> Tokenizer:
    """WordLevel over VOCAB, lower-cased, [CLS] a [SEP] (b [SEP]), saved with padding on (the server turns it off).
    A pair's `b [SEP]` is token type 1, or 0 without `pair_types` (a tokenizer that marks no sentence B)."""
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(VOCAB)}, unk_token="[UNK]"))
    tok.normalizer = normalizers.Lowercase()
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    cls, sep = VOCAB.index("[CLS]"), VOCAB.index("[SEP]")
    pair = "[CLS] $A [SEP] $B:1 [SEP]:1" if pair_types else "[CLS] $A [SEP] $B [SEP]"
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair=pair, special_tokens=[("[CLS]", cls), ("[SEP]", sep)]
    )
    tok.enable_padding(pad_id=0, pad_token="[PAD]", length=MAX_LENGTH)
    tok.enable_truncation(MAX_LENGTH)
    return tok


def tiny_model(bias: float = 0.0, pairs: bool = False) -> onnx.ModelProto:
    """Embedding lookup, masked mean pool, linear to 2 logits; dynamic batch and sequence axes.

    Dimension 0 of a word's embedding is its positivity, so sentiment words decide the label. With `pairs`, the
    model also takes token_type_ids and weighs the second text's tokens 4 times the first's, so the pair decides.
    """
    rng = np.random.default_rng(0)
    table = rng.normal(0, 0.05, (len(VOCAB), 4)).astype(np.float32)
    for word in POSITIVE:
        table[VOCAB.index(word), 0] = 1.0
    for word in NEGATIVE:
        table[VOCAB.index(word), 0] = -1.0
    weight = np.zeros((4, 2), np.float32)
    weight[0] = [-4.0, 4.0]
    weight[1:] = rng.normal(0, 0.5, (3, 2))
    inits = [
        helper.make_tensor("table", TensorProto.FLOAT, table.shape, table.ravel()),
        helper.make_tensor("weight", TensorProto.FLOAT, weight.shape, weight.ravel()),
        helper.make_tensor("bias", TensorProto.FLOAT, [2], [bias, -bias]),
        helper.make_tensor("axis1", TensorProto.INT64, [1], [1]),
        helper.make_tensor("axis2", TensorProto.INT64, [1], [2]),
    ]
    weighing = [helper.make_node("Cast", ["attention_mask"], ["mask"], to=TensorProto.FLOAT)]
    if pairs:
        inits += [
            helper.make_tensor("one", TensorProto.FLOAT, [], [1.0]),
            helper.make_tensor("three", TensorProto.FLOAT, [], [3.0]),
        ]
        weighing = [
            helper.make_node("Cast", ["attention_mask"], ["attended"], to=TensorProto.FLOAT),
            helper.make_node("Cast", ["token_type_ids"], ["segment"], to=TensorProto.FLOAT),
            helper.make_node("Mul", ["segment", "three"], ["extra"]),
            helper.make_node("Add", ["extra", "one"], ["weight_b"]),
            helper.make_node("Mul", ["attended", "weight_b"], ["mask"]),
        ]
    nodes = [
        helper.make_node("Gather", ["table", "input_ids"], ["emb"]),
        *weighing,
        helper.make_node("Unsqueeze", ["mask", "axis2"], ["mask3"]),
        helper.make_node("Mul", ["emb", "mask3"], ["masked"]),
        helper.make_node("ReduceSum", ["masked", "axis1"], ["summed"], keepdims=0),
        helper.make_node("ReduceSum", ["mask3", "axis1"], ["count"], keepdims=0),
        helper.make_node("Div", ["summed", "count"], ["pooled"]),
        helper.make_node("MatMul", ["pooled", "weight"], ["projected"]),
        helper.make_node("Add", ["projected", "bias"], ["logits"]),
    ]
    graph = helper.make_graph(
        nodes,
        "tiny-sentiment",
        [
            helper.make_tensor_value_info(name, TensorProto.INT64, ["batch", "sequence"])
            for name in ("input_ids", "attention_mask", "token_type_ids")[: 3 if pairs else 2]
        ],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 2])],
        initializer=inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    onnx.checker.check_model(model)
    return model


def spec(**changes) -> BundleSpec:
    fields = {
        "name": "tiny-sentiment",
        "version": "1",
        "labels": LABELS,
        "text_inputs": ["text"],
        "max_length": MAX_LENGTH,
        "pad_token_id": 0,
        "inputs": [
            TensorSpec(name="input_ids", dtype="int64", shape=["batch", "sequence"]),
            TensorSpec(name="attention_mask", dtype="int64", shape=["batch", "sequence"]),
        ],
        "outputs": [TensorSpec(name="logits", dtype="float32", shape=["batch", 2])],
        "precision": "fp32",
        "runtime": "onnxruntime",
        "providers": ["CPUExecutionProvider"],
        "model_file": "model.onnx",
        "arch": "tiny",
        "opset": 17,
    }
    return BundleSpec(**(fields | changes))


def pair_spec(**changes) -> dict:
    """Spec changes for the tiny pair model: three token inputs, a text and its pair per example."""
    tokens = [TensorSpec(name=n, dtype="int64", shape=["batch", "sequence"]) for n in PAIR_INPUTS]
    return {"name": "tiny-pairs", "text_inputs": ["text", "text_pair"], "inputs": tokens} | changes


def write_bundle(
    folder: Path,
    bias: float = 0.0,
    model: bytes | None = None,
    metrics: dict | None = None,
    tokenizer: Tokenizer | None = None,
    info: dict | None = None,
    **spec_changes,
) -> Path:
    """A bundle folder as the export stage writes it: model, tokenizer.json (`tokenizer`, else `tiny_tokenizer()`),
    manifest with the spec (and `metrics`, and `info` beside the spec).

    The model file holds `model` when given, else the tiny ONNX model (with `bias` towards "negative"; the pair
    model when the spec takes pairs).
    """
    bundle_spec = spec(**spec_changes)
    with mf.stage_folder(folder) as tmp:
        built = tiny_model(bias, pairs=bundle_spec.pairs).SerializeToString()
        (tmp / bundle_spec.model_file).write_bytes(model or built)
        (tokenizer or tiny_tokenizer()).save(str(tmp / "tokenizer.json"))
        manifest = mf.Manifest(
            stage="bundle",
            recipe="tests",
            recipe_hash="0" * 16,
            config_hash="0" * 16,
            metrics=metrics or {},
            info={"bundle": bundle_spec.model_dump()} | (info or {}),
        )
        mf.commit(tmp, folder, manifest)
    return folder


def write_engine(folder: Path) -> Path:
    """A bundle of a TensorRT engine (runtime 'tensorrt') whose plan file is a placeholder: for what is decided from
    its manifest, before the engine is opened."""
    return write_bundle(
        folder, model=b"engine", runtime="tensorrt", model_file="model.plan", providers=["TensorrtExecutionProvider"]
    )


def write_cascade(
    folder: Path,
    members: dict[str, Path],
    thresholds: list[float],
    rule: str = "max_prob",
    temperatures: list[float] | None = None,
    name: str = "tiny-cascade",
) -> Path:
    """A cascade folder as export.cascade writes it: each member bundle copied to members/<id>/ (ids in order,
    cheapest first), the spec in the manifest's info with a threshold per member but the last."""
    specs = [mf.load(bundle, verify=False).info["bundle"] for bundle in members.values()]
    temperatures = temperatures or [1.0] * len(members)
    cascade = CascadeSpec(
        name=name,
        labels=specs[0]["labels"],
        text_inputs=specs[0]["text_inputs"],
        rule=rule,
        members=[
            CascadeMember(
                bundle=member,
                manifest_sha256=mf.sha256_file(bundle / mf.MANIFEST),
                threshold=threshold,
                temperature=temperature,
            )
            for (member, bundle), threshold, temperature in zip(
                members.items(), [*thresholds, None], temperatures, strict=True
            )
        ],
    )
    with mf.stage_folder(folder) as tmp:
        for member, bundle in members.items():
            shutil.copytree(bundle, tmp / MEMBERS / member)
        manifest = mf.Manifest(
            stage="bundle-cascade",
            recipe="tests",
            recipe_hash="0" * 16,
            config_hash="0" * 16,
            info={"cascade": cascade.model_dump()},
        )
        mf.commit(tmp, folder, manifest)
    return folder


@pytest.fixture(scope="session")
def bundle(tmp_path_factory) -> Path:
    return write_bundle(tmp_path_factory.mktemp("bundles") / "bundle-tiny")


@pytest.fixture(scope="session")
def pair_bundle(tmp_path_factory) -> Path:
    """The tiny pair model's bundle: the second text of a pair decides the label."""
    return write_bundle(tmp_path_factory.mktemp("bundles") / "bundle-pairs", **pair_spec())


@pytest.fixture
def make_bundle(tmp_path):
    """Write a bundle into tmp_path/<name> with spec changes (version, bias, runtime...)."""

    def make(name: str = "bundle", bias: float = 0.0, model: bytes | None = None, **spec_changes) -> Path:
        return write_bundle(tmp_path / name, bias, model, **spec_changes)

    return make


def settings_for(bundle: Path, **changes):
    from edgedistill.serve.settings import Settings

    base = {"bundle": bundle, "host": "127.0.0.1", "port": 0, "metrics_port": 0, "threads": 1}
    return Settings(**(base | changes))


@dataclass(frozen=True)
class Refusal:
    """A refused `Reload`: its status code and details, and the model the server serves after it."""

    code: grpc.StatusCode
    details: str
    serving: object  # classifier_pb2.ModelInfo


class RunningServer:
    """A real server on port 0, on its own event loop in a background thread; tests talk to it with sync gRPC."""

    def __init__(self, settings, warm: bool = True):
        from edgedistill.serve.app import create_server

        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="server-loop", daemon=True)
        self.thread.start()

        async def build():
            server, port = create_server(settings)
            await server.start()
            if warm:
                await server.warm_up()
            return server, port

        self.server, self.port = self.call(build())
        self.address = f"127.0.0.1:{self.port}"
        self.settings = settings

    def call(self, coro, timeout: float = 30):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def channel(self) -> grpc.Channel:
        return grpc.insecure_channel(self.address)

    def refused_reload(self, bundle: Path | None, metadata=()) -> Refusal:
        """What a `Reload` onto `bundle` (None: the served folder again), sent with `metadata`, is refused with; fails
        the test where it succeeds."""
        request = classifier_pb2.ReloadRequest(bundle_path=str(bundle) if bundle is not None else "")
        with self.channel() as channel:
            stub = classifier_pb2_grpc.ClassifierStub(channel)
            with pytest.raises(grpc.RpcError) as caught:
                stub.Reload(request, metadata=metadata, timeout=30)
            serving = stub.GetModelInfo(classifier_pb2.GetModelInfoRequest(), timeout=10)
        return Refusal(caught.value.code(), caught.value.details(), serving)

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.server.metrics_port}/metrics"

    def close(self):
        try:
            self.call(self.server.stop(0))
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(10)
            self.loop.close()


def served_probabilities(bundle: Path, texts: list[str], pairs: list[str] | None = None) -> np.ndarray:
    """The probabilities a real server of `bundle` answers one `Classify` of `texts` (with their `pairs`) with,
    (N, C); the server is stopped after."""
    server = RunningServer(settings_for(bundle))
    try:
        with server.channel() as channel:
            request = classifier_pb2.ClassifyRequest(texts=texts, text_pairs=pairs or [])
            reply = classifier_pb2_grpc.ClassifierStub(channel).Classify(request, timeout=30)
    finally:
        server.close()
    return np.array([p.probabilities for p in reply.predictions])


@pytest.fixture
def start_server():
    """`start_server(settings, warm=True) -> RunningServer`, stopped at the end of the test."""
    started = []

    def start(settings, warm: bool = True) -> RunningServer:
        server = RunningServer(settings, warm)
        started.append(server)
        return server

    yield start
    for server in reversed(started):
        server.close()


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """One warm server on the tiny bundle, shared by a test module: at most 8 texts of 200 characters, 64 KiB messages."""
    folder = write_bundle(tmp_path_factory.mktemp("served") / "bundle-tiny")
    server = RunningServer(settings_for(folder, max_texts=8, max_text_chars=200, max_message_bytes=64 * 1024))
    yield server
    server.close()


@pytest.fixture(scope="module")
def served_pairs(pair_bundle):
    """One warm server on the tiny pair bundle, shared by a test module: at most 8 texts per request."""
    server = RunningServer(settings_for(pair_bundle, max_texts=8))
    yield server
    server.close()


def run_openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


@pytest.fixture(scope="session")
def certs(tmp_path_factory) -> Path:
    """A throwaway CA, a server certificate for localhost/127.0.0.1 and a client certificate (openssl CLI);
    and from another CA (`other-ca`) `stranger.pem`/`.key`, a client certificate, and `rotated.pem`/`.key`, a server
    certificate."""
    folder = tmp_path_factory.mktemp("certs")
    (folder / "server.ext").write_text("subjectAltName=DNS:localhost,IP:127.0.0.1\n")
    (folder / "client.ext").write_text("extendedKeyUsage=clientAuth\n")
    for ca, certificates in (
        ("ca", {"server": "server", "client": "client"}),
        ("other-ca", {"stranger": "client", "rotated": "server"}),
    ):
        run_openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", f"/CN=test-{ca}",
                    "-keyout", f"{ca}.key", "-out", f"{ca}.pem", cwd=folder)  # fmt: skip
        for name, ext in certificates.items():
            run_openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN={name}",
                        "-keyout", f"{name}.key", "-out", f"{name}.csr", cwd=folder)  # fmt: skip
            run_openssl("x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.pem", "-CAkey", f"{ca}.key",
                        "-CAcreateserial", "-days", "2", "-extfile", f"{ext}.ext", "-out", f"{name}.pem", cwd=folder)  # fmt: skip
    return folder


def serve_command(bundle: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "serve", "--bundle", str(bundle), "--host", "127.0.0.1", "--port", "0", *extra]


def subprocess_env(**extra: str) -> dict[str, str]:
    """This environment without EDGEDISTILL_* settings or gRPC's verbosity (the server's own default); one worker (no
    supervisor) unless `extra` says otherwise."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("EDGEDISTILL_") and k != "GRPC_VERBOSITY"}
    return env | {"OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT), "EDGEDISTILL_WORKERS": "1"} | extra


class ServerProcess:
    """`python -m serve` in a subprocess; its JSON log lines are collected as they come (others as "unstructured")."""

    def __init__(self, bundle, *flags: str, process_group: int | None = None, **env: str):
        """`process_group=0` starts it in a group of its own, which its workers join, as a terminal's foreground job."""
        self.proc = subprocess.Popen(
            serve_command(bundle, "--metrics-port", "0", *flags),
            cwd=ROOT,
            env=subprocess_env(**env),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            process_group=process_group,
        )
        self.lines: list[dict] = []
        self._new: queue.Queue = queue.Queue()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self):
        for line in self.proc.stdout:
            try:
                entry = json.loads(line)  # every line of ours is one JSON object
            except ValueError:  # gRPC's C core writes its own lines, e.g. about a client's oversized metadata
                entry = {"event": "unstructured", "msg": line.rstrip("\n")}
            self.lines.append(entry)
            self._new.put(entry)
        self._new.put(None)

    def wait(self, timeout: float) -> int:
        """The exit status, once the process exits within `timeout` seconds and its log is read to its end: `lines`
        then holds every line, where the process's exit alone can come before its last lines are read."""
        status = self.proc.wait(timeout)
        self._reader.join(timeout)
        if self._reader.is_alive():
            raise AssertionError(f"the server exited, but its output stayed open for {timeout} s: a child holds it")
        return status

    def wait_for(self, event: str, timeout: float = 30) -> dict:
        for entry in self.lines:
            if entry.get("event") == event:
                return entry
        deadline = time.monotonic() + timeout
        while (remaining := deadline - time.monotonic()) > 0:
            try:
                entry = self._new.get(timeout=remaining)
            except queue.Empty:
                break
            if entry is None:
                break
            if entry.get("event") == event:
                return entry
        raise AssertionError(f"no {event!r} log line; the log so far: {self.lines[-10:]}")

    def close(self):
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(10)


@pytest.fixture
def spawn(tmp_path):
    """`spawn(bundle, *flags, process_group=None, **env) -> ServerProcess`, killed at the end of the test if still running. Its
    temporary files (a supervisor's metrics folder, which a killed one leaves) go to the test's folder."""
    started = []

    def start(bundle, *flags, process_group: int | None = None, **env) -> ServerProcess:
        process = ServerProcess(bundle, *flags, process_group=process_group, **{"TMPDIR": str(tmp_path)} | env)
        started.append(process)
        return process

    yield start
    for process in started:
        process.close()


@pytest.fixture(scope="module")
def channel(served):
    """A channel to the module's `served` server."""
    channel = served.channel()
    yield channel
    channel.close()


GATED = "great " * 60  # over INLINE_TOKENIZE_CHARS characters: tokenized in a thread


class Gate:
    """Holds every `encode` of a text holding GATED until `open` is set; counts those held at once."""

    def __init__(self):
        self.open = threading.Event()
        self.held = 0
        self.most = 0
        self._lock = threading.Lock()

    def hold(self) -> None:
        with self._lock:
            self.held += 1
            self.most = max(self.most, self.held)
        try:
            assert self.open.wait(30)
        finally:
            with self._lock:
                self.held -= 1

    def wait_held(self, count: int, timeout: float = 5) -> None:
        deadline = time.monotonic() + timeout
        while self.held < count:
            assert time.monotonic() < deadline, f"{self.held} encode calls held, expected {count}"
            time.sleep(0.005)


@pytest.fixture
def slow_tokenizer(monkeypatch) -> Gate:
    """Servers started in the test tokenize texts holding GATED only once the gate opens (a real TextEncoder)."""
    gate = Gate()

    class GatedEncoder(TextEncoder):
        def encode(self, texts, pairs=None):
            if any(GATED in text for text in texts):
                gate.hold()
            return super().encode(texts, pairs)

    monkeypatch.setattr(serve_host, "TextEncoder", GatedEncoder)
    yield gate
    gate.open.set()


class Refusing(classifier_pb2_grpc.ClassifierServicer):
    """Only the Classifier service, without KServe's (as behind a gateway exposing one API): refuses the first
    `refusals` Classify attempts with `code`, then answers; counts attempts, and the texts of each call answered. Its
    GetModelInfo gives `max_texts` (0: says nothing of it)."""

    def __init__(self, refusals: int, code: grpc.StatusCode, max_texts: int = 0):
        self.refusals, self.code, self.max_texts = refusals, code, max_texts
        self.attempts, self.texts_per_call = 0, []

    async def Classify(self, request, context):
        self.attempts += 1
        if self.attempts <= self.refusals:
            await context.abort(self.code, "busy, retry")
        self.texts_per_call.append(len(request.texts))
        prediction = classifier_pb2.Prediction(label="positive", label_id=1, score=0.9, probabilities=[0.1, 0.9])
        return classifier_pb2.ClassifyResponse(
            predictions=[prediction] * len(request.texts), model_name="m", model_version="1"
        )

    async def GetModelInfo(self, request, context):
        return classifier_pb2.ModelInfo(
            name="m", version="1", labels=["negative", "positive"], max_texts=self.max_texts
        )


@pytest.fixture
def refusing():
    """`refusing(refusals, code, max_texts) -> (servicer, address)`: a gRPC server on loopback running `Refusing`."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    servers = []

    def start(refusals: int, code=grpc.StatusCode.RESOURCE_EXHAUSTED, max_texts: int = 0):
        servicer = Refusing(refusals, code, max_texts)

        async def build():
            server = grpc.aio.server()
            classifier_pb2_grpc.add_ClassifierServicer_to_server(servicer, server)
            port = server.add_insecure_port("127.0.0.1:0")
            await server.start()
            return server, port

        server, port = asyncio.run_coroutine_threadsafe(build(), loop).result(10)
        servers.append(server)
        return servicer, f"127.0.0.1:{port}"

    yield start
    for server in servers:
        asyncio.run_coroutine_threadsafe(server.stop(0), loop).result(10)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(10)


class Gateway(grpc.GenericRpcHandler):
    """A gRPC server on loopback that forwards the unary calls of the methods it exposes to `upstream`, their bytes as
    they are, and the status of one that fails, as a gateway in front of the server would, counting them by method;
    any other is UNIMPLEMENTED. `after` is called with each forwarded call's method once its reply is in, before the
    gateway answers (a reload between two calls)."""

    def __init__(self, upstream: str, exposed: tuple[str, ...], after: Callable[[str], None] | None = None):
        self.exposed = exposed  # full method names ('/package.Service/Method'), or a service's prefix
        self.after = after
        self.calls: Counter[str] = Counter()
        self.upstream = grpc.insecure_channel(upstream)
        self.server = grpc.server(ThreadPoolExecutor(4))
        self.server.add_generic_rpc_handlers((self,))
        self.address = f"127.0.0.1:{self.server.add_insecure_port('127.0.0.1:0')}"
        self.server.start()

    def service(self, handler_call_details):
        method = handler_call_details.method
        if not method.startswith(self.exposed):
            return None
        forward = self.upstream.unary_unary(method)

        def handle(request: bytes, context) -> bytes:
            self.calls[method] += 1
            try:
                reply = forward(request, timeout=10)
            except grpc.RpcError as err:
                context.abort(err.code(), err.details())
            if self.after is not None:
                self.after(method)
            return reply

        return grpc.unary_unary_rpc_method_handler(handle)

    def point_to(self, upstream: str) -> None:
        """Forward from now on to `upstream`, as the same address does once its server is replaced."""
        self.upstream.close()
        self.upstream = grpc.insecure_channel(upstream)

    def close(self) -> None:
        self.server.stop(0)
        self.upstream.close()


@pytest.fixture
def gateway():
    """`gateway(upstream, exposed, after) -> Gateway`, stopped at the end of the test."""
    started = []

    def start(upstream: str, exposed: tuple[str, ...], after: Callable[[str], None] | None = None) -> Gateway:
        started.append(Gateway(upstream, exposed, after))
        return started[-1]

    yield start
    for server in started:
        server.close()
