"""Confidence cascades served: routing and the member that answered through both APIs, the answers equal to
`common.cascade.route` on the members' logits, metrics, overload of the last member, deadlines, drain and
reload, refused cascades, several workers."""

import asyncio
import json
import os
import shutil
import threading
import urllib.request
from collections import Counter

import grpc
import numpy as np
import onnxruntime as ort
import pytest
from edgedistill.common import manifest as mf
from edgedistill.common.cascade import MEMBERS, ServedModels, confidence, load_cascade, route
from edgedistill.serve import host, tensors
from edgedistill.serve.backend import load_backend
from edgedistill.serve.cascade import load_runtime, refuse_unused_by
from edgedistill.serve.client import SERVER_WIDE, Client
from edgedistill.serve.errors import BundleRejected
from edgedistill.serve.metrics import Metrics
from edgedistill.serve.proto import classifier_pb2 as pb
from edgedistill.serve.proto import classifier_pb2_grpc, kserve_pb2, kserve_pb2_grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from onnx import numpy_helper
from prometheus_client import generate_latest
from tokenizers import Tokenizer

from tests.common.test_cascade import checks_counted
from tests.conftest import wait_until
from tests.serve.conftest import (
    VOCAB,
    RunningServer,
    settings_for,
    tiny_model,
    write_bundle,
    write_cascade,
    write_engine,
)
from tests.serve.test_operations import ADMIN, ADMIN_TOKEN, corrupt, metric

STUDENT, TEACHER = "student", "teacher"
THRESHOLD = 0.9
SURE = ["great good love fun", "awful boring worst", "dull"]  # the student's confidence is above THRESHOLD
UNSURE = ["a great movie", "the movie", "a film", "it was not very good"]  # below: escalated to the teacher
TEXTS = [SURE[0], UNSURE[0], SURE[1], UNSURE[1], UNSURE[2], SURE[2], UNSURE[3]]
ANSWERED_BY = [STUDENT, TEACHER, STUDENT, TEACHER, TEACHER, STUDENT, TEACHER]
SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


def make_cascade(folder, **spec_changes):
    """The tiny model as the student, the same model leaning towards "negative" as the teacher, so their answers
    differ; the student keeps texts it is at least THRESHOLD sure of."""
    student = write_bundle(folder / "student", **spec_changes)
    teacher = write_bundle(folder / "teacher", bias=0.5, **spec_changes)
    return write_cascade(folder / "bundle-cascade", {STUDENT: student, TEACHER: teacher}, [THRESHOLD])


@pytest.fixture(scope="module")
def cascade(tmp_path_factory):
    return make_cascade(tmp_path_factory.mktemp("cascade"))


OVERFLOWING = "this"  # in no probe text nor the warm-up text, so the cascade warms up as any other


@pytest.fixture(scope="module")
def overflowing_cascade(tmp_path_factory):
    """make_cascade's, but the student gives logits (-inf, +inf) for OVERFLOWING (its embedding overflows float32
    in the projection), whose confidence is NaN."""
    model = tiny_model()
    table = next(tensor for tensor in model.graph.initializer if tensor.name == "table")
    values = numpy_helper.to_array(table).copy()
    values[VOCAB.index(OVERFLOWING), 0] = 3e38
    table.CopyFrom(numpy_helper.from_array(values, "table"))
    folder = tmp_path_factory.mktemp("overflowing")
    student = write_bundle(folder / "student", model=model.SerializeToString())
    teacher = write_bundle(folder / "teacher", bias=0.5)
    return write_cascade(folder / "bundle-cascade", {STUDENT: student, TEACHER: teacher}, [THRESHOLD])


@pytest.fixture(scope="module")
def served_cascade(cascade):
    server = RunningServer(settings_for(cascade, max_texts=8))
    yield server
    server.close()


@pytest.fixture(scope="module")
def stub(served_cascade):
    channel = served_cascade.channel()
    yield classifier_pb2_grpc.ClassifierStub(channel)
    channel.close()


@pytest.fixture(scope="module")
def kserve(served_cascade):
    channel = served_cascade.channel()
    yield kserve_pb2_grpc.GRPCInferenceServiceStub(channel)
    channel.close()


def logits_by_hand(bundle, texts: list[str]) -> np.ndarray:
    """A member's logits with ONNX Runtime and its tokenizer.json, one text at a time (no padding)."""
    tokenizer = Tokenizer.from_file(str(bundle / "tokenizer.json"))
    tokenizer.no_padding()
    session = ort.InferenceSession(str(bundle / "model.onnx"), providers=["CPUExecutionProvider"])
    rows = []
    for text in texts:
        encoding = tokenizer.encode(text)
        feed = {
            "input_ids": np.array([encoding.ids], dtype=np.int64),
            "attention_mask": np.array([encoding.attention_mask], dtype=np.int64),
        }
        rows.append(session.run(["logits"], feed)[0][0])
    return np.stack(rows)


def infer_request(
    texts: list[str], outputs: tuple[str, ...] = (), raw: bool = False, model: str = "tiny-cascade"
) -> kserve_pb2.ModelInferRequest:
    request = kserve_pb2.ModelInferRequest(model_name=model)
    tensor = request.inputs.add(name="text", datatype="BYTES", shape=[len(texts)])
    encoded = [text.encode() for text in texts]
    if raw:
        request.raw_input_contents.append(tensors.serialize_bytes(encoded))
    else:
        tensor.contents.bytes_contents.extend(encoded)
    for name in outputs:
        request.outputs.add(name=name)
    return request


def decoded(reply: kserve_pb2.ModelInferResponse) -> dict[str, np.ndarray]:
    raw = list(reply.raw_output_contents)
    return {
        out.name: tensors.decode(out.name, out.datatype, list(out.shape), out.contents, raw[i] if raw else None)
        for i, out in enumerate(reply.outputs)
    }


def scrape(server) -> str:
    return urllib.request.urlopen(server.metrics_url, timeout=5).read().decode()


# --- routing ----------------------------------------------------------------------------------------------


def test_classify_keeps_sure_texts_at_the_student_and_escalates_the_rest_to_the_teacher(stub):
    reply = stub.Classify(pb.ClassifyRequest(texts=TEXTS), timeout=10)
    assert [p.answered_by for p in reply.predictions] == ANSWERED_BY


def test_classify_answers_under_the_cascades_name(stub):
    reply = stub.Classify(pb.ClassifyRequest(texts=TEXTS[:2]), timeout=10)
    assert reply.model_name == "tiny-cascade"
    assert reply.model_version == "1"


def test_classify_flags_no_refused_escalation_without_overload(stub):
    reply = stub.Classify(pb.ClassifyRequest(texts=TEXTS), timeout=10)
    assert not any(p.escalation_refused for p in reply.predictions)


def test_served_answers_equal_route_of_the_members_logits_run_by_hand(stub, cascade):
    spec = load_cascade(cascade).spec
    members = [logits_by_hand(cascade / MEMBERS / member.bundle, TEXTS) for member in spec.members]
    expected, answered_by = route(members, spec)
    reply = stub.Classify(pb.ClassifyRequest(texts=TEXTS), timeout=10)
    assert [p.answered_by for p in reply.predictions] == [spec.members[i].bundle for i in answered_by]
    np.testing.assert_allclose([p.logits for p in reply.predictions], expected, atol=1e-5)


def test_the_teacher_answers_differently_from_the_student_on_the_escalated_texts(cascade):
    """The fixture's members differ, so the routing checks above tell them apart."""
    student = logits_by_hand(cascade / MEMBERS / STUDENT, UNSURE)
    teacher = logits_by_hand(cascade / MEMBERS / TEACHER, UNSURE)
    assert np.abs(student - teacher).min() > 0.1


def test_the_overflowing_student_gives_a_nan_confidence(overflowing_cascade):
    logits = logits_by_hand(overflowing_cascade / MEMBERS / STUDENT, [OVERFLOWING])
    assert np.isnan(confidence(logits, "max_prob")).all()


def test_a_text_of_undefined_confidence_at_the_student_is_answered_by_the_teacher(start_server, overflowing_cascade):
    with start_server(settings_for(overflowing_cascade)).channel() as channel:
        reply = classifier_pb2_grpc.ClassifierStub(channel).Classify(
            pb.ClassifyRequest(texts=[SURE[0], OVERFLOWING]), timeout=10
        )
    assert [p.answered_by for p in reply.predictions] == [STUDENT, TEACHER]


def test_a_stream_names_the_member_per_text(stub):
    requests = [pb.ClassifyRequest(texts=[text]) for text in TEXTS]
    replies = list(stub.ClassifyStream(iter(requests), timeout=10))
    assert [reply.predictions[0].answered_by for reply in replies] == ANSWERED_BY


@pytest.mark.parametrize("raw", [False, True])
def test_model_infer_returns_answered_by_and_escalation_refused_by_default(kserve, raw):
    outputs = decoded(kserve.ModelInfer(infer_request(TEXTS, raw=raw), timeout=10))
    assert list(outputs) == ["logits", "probabilities", "answered_by", "escalation_refused"]
    assert [member.decode() for member in outputs["answered_by"].reshape(-1)] == ANSWERED_BY
    assert outputs["escalation_refused"].reshape(-1).tolist() == [False] * len(TEXTS)


def test_model_infer_returns_answered_by_alone_when_asked_for_by_name(kserve):
    reply = kserve.ModelInfer(infer_request(TEXTS, outputs=("answered_by",)), timeout=10)
    assert [(out.name, out.datatype, list(out.shape)) for out in reply.outputs] == [
        ("answered_by", "BYTES", [len(TEXTS), 1])
    ]
    assert [member.decode() for member in decoded(reply)["answered_by"].reshape(-1)] == ANSWERED_BY


def test_model_infer_answers_equal_classify(kserve, stub):
    outputs = decoded(kserve.ModelInfer(infer_request(TEXTS), timeout=10))
    reply = stub.Classify(pb.ClassifyRequest(texts=TEXTS), timeout=10)
    np.testing.assert_allclose(outputs["probabilities"], [p.probabilities for p in reply.predictions], atol=1e-6)


def test_classification_of_answered_by_is_invalid(kserve):
    request = infer_request(TEXTS[:1], outputs=("answered_by",))
    request.outputs[0].parameters["classification"].int64_param = 1
    with pytest.raises(grpc.RpcError) as caught:
        kserve.ModelInfer(request, timeout=10)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "applies only to logits and probabilities" in caught.value.details()


def test_token_ids_are_refused_for_a_cascade(kserve):
    request = kserve_pb2.ModelInferRequest(model_name="tiny-cascade")
    for name in ("input_ids", "attention_mask"):
        request.inputs.add(name=name, datatype="INT64", shape=[1, 3]).contents.int64_contents.extend([2, 4, 3])
    with pytest.raises(grpc.RpcError) as caught:
        kserve.ModelInfer(request, timeout=10)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "confidence cascade" in caught.value.details()


def test_a_request_without_an_input_to_a_cascade_is_told_to_send_texts_alone(kserve):
    with pytest.raises(grpc.RpcError) as caught:
        kserve.ModelInfer(kserve_pb2.ModelInferRequest(model_name="tiny-cascade"), timeout=10)
    assert caught.value.details() == "missing input: send BYTES 'text' [batch]"


def test_token_ids_longer_than_max_length_are_refused_for_a_cascade_as_token_ids(kserve):
    request = kserve_pb2.ModelInferRequest(model_name="tiny-cascade")
    request.inputs.add(name="input_ids", datatype="INT64", shape=[1, 100_000])
    with pytest.raises(grpc.RpcError) as caught:
        kserve.ModelInfer(request, timeout=10)
    assert "confidence cascade" in caught.value.details()


def test_model_metadata_lists_the_cascade_outputs(kserve):
    reply = kserve.ModelMetadata(kserve_pb2.ModelMetadataRequest(name="tiny-cascade"), timeout=10)
    assert [(t.name, t.datatype, list(t.shape)) for t in reply.outputs] == [
        ("logits", "FP32", [-1, 2]),
        ("probabilities", "FP32", [-1, 2]),
        ("answered_by", "BYTES", [-1, 1]),
        ("escalation_refused", "BOOL", [-1, 1]),
    ]


def test_model_infer_returns_each_output_in_the_shape_model_metadata_gives(kserve):
    meta = kserve.ModelMetadata(kserve_pb2.ModelMetadataRequest(name="tiny-cascade"), timeout=10)
    reply = kserve.ModelInfer(infer_request(TEXTS), timeout=10)
    described = {t.name: [len(TEXTS) if dim == -1 else dim for dim in t.shape] for t in meta.outputs}
    assert {out.name: list(out.shape) for out in reply.outputs} == described


def test_model_metadata_gives_the_outputs_the_model_configs_dims_with_the_batch_axis(kserve):
    meta = kserve.ModelMetadata(kserve_pb2.ModelMetadataRequest(name="tiny-cascade"), timeout=10)
    config = kserve.ModelConfig(kserve_pb2.ModelConfigRequest(name="tiny-cascade"), timeout=10).config
    assert [list(t.shape) for t in meta.outputs] == [[-1, *o.dims] for o in config.output]


def test_model_metadata_platform_is_tritons_ensemble(kserve):
    reply = kserve.ModelMetadata(kserve_pb2.ModelMetadataRequest(name="tiny-cascade"), timeout=10)
    assert reply.platform == "ensemble"


def test_model_config_lists_the_cascade_outputs(kserve):
    config = kserve.ModelConfig(kserve_pb2.ModelConfigRequest(name="tiny-cascade"), timeout=10).config
    Config = kserve_pb2.ModelConfigResponse
    assert [(o.name, o.data_type, list(o.dims)) for o in config.output] == [
        ("logits", Config.TYPE_FP32, [2]),
        ("probabilities", Config.TYPE_FP32, [2]),
        ("answered_by", Config.TYPE_STRING, [1]),
        ("escalation_refused", Config.TYPE_BOOL, [1]),
    ]


def test_model_info_lists_the_members_with_their_thresholds(stub, cascade):
    info = stub.GetModelInfo(pb.GetModelInfoRequest(), timeout=10)
    members = [
        (m.model.bundle_path, m.threshold if m.HasField("threshold") else None, m.temperature)
        for m in info.cascade_members
    ]
    assert members == [
        (str(cascade / MEMBERS / STUDENT), pytest.approx(THRESHOLD), 1.0),
        (str(cascade / MEMBERS / TEACHER), None, 1.0),
    ]


def test_model_info_describes_the_cascade(stub, cascade):
    info = stub.GetModelInfo(pb.GetModelInfoRequest(), timeout=10)
    expected = ("tiny-cascade", "cascade", "max_prob", str(cascade), mf.sha256_file(cascade / mf.MANIFEST))
    assert (info.name, info.runtime, info.cascade_rule, info.bundle_path, info.bundle_sha256) == expected


def test_model_info_of_a_cascade_gives_the_servers_request_limits(stub, served_cascade):
    info = stub.GetModelInfo(pb.GetModelInfoRequest(), timeout=10)
    expected = (served_cascade.settings.max_texts, served_cascade.settings.max_message_bytes)
    assert (info.max_texts, info.max_message_bytes) == expected


@pytest.fixture(scope="module")
def lengths_apart(tmp_path_factory):
    """A cascade whose student reads 8 tokens and whose teacher reads 16, loaded."""
    folder = tmp_path_factory.mktemp("lengths")
    members = {
        STUDENT: write_bundle(folder / "student", max_length=8),
        TEACHER: write_bundle(folder / "teacher", bias=0.5, max_length=16),
    }
    cascade = write_cascade(folder / "bundle-cascade", members, [THRESHOLD])
    runtime = load_runtime(cascade, settings_for(cascade))
    yield runtime.describe()
    asyncio.run(runtime.close(0))


def test_model_info_of_a_cascade_gives_the_most_tokens_any_member_reads(lengths_apart):
    assert lengths_apart.max_length == 16


def test_model_info_of_a_cascade_gives_each_members_own_max_length(lengths_apart):
    assert [member.model.max_length for member in lengths_apart.cascade_members] == [8, 16]


def test_model_info_of_a_cascade_gives_the_most_rows_every_member_takes_in_one_call(cascade, monkeypatch):
    def capped(bundle, settings, model=None):
        runner = load_backend(bundle, settings, model)
        if bundle.folder.name == TEACHER:
            runner.max_batch_size = 16  # as a TensorRT teacher's optimisation profile caps it
        return runner

    monkeypatch.setattr(host, "load_backend", capped)
    runtime = load_runtime(cascade, settings_for(cascade, max_batch_size=64))
    try:
        assert runtime.describe().max_batch_size == 16
    finally:
        asyncio.run(runtime.close(0))


def test_the_clients_model_info_leaves_the_servers_fields_out_of_each_member(served_cascade):
    with Client(served_cascade.address, retries=0) as client:
        members = client.model_info()["cascade_members"]
    assert [sorted(set(SERVER_WIDE) & set(m["model"])) for m in members] == [[], []]


def test_the_clients_model_info_of_a_cascade_gives_the_servers_fields(served_cascade):
    with Client(served_cascade.address, retries=0) as client:
        info = client.model_info()
    settings = served_cascade.settings
    assert {name: info[name] for name in SERVER_WIDE} == {  # the server runs in this process
        "pid": os.getpid(),
        "max_texts": settings.max_texts,
        "max_message_bytes": settings.max_message_bytes,
    }


def test_a_single_bundle_names_no_member(served):
    with served.channel() as channel:
        reply = classifier_pb2_grpc.ClassifierStub(channel).Classify(pb.ClassifyRequest(texts=TEXTS), timeout=10)
        assert {(p.answered_by, p.escalation_refused) for p in reply.predictions} == {("", False)}


def test_a_single_bundle_returns_no_answered_by_output(served):
    with served.channel() as channel:
        reply = kserve_pb2_grpc.GRPCInferenceServiceStub(channel).ModelInfer(infer_request(TEXTS, model=""), timeout=10)
    assert [out.name for out in reply.outputs] == ["logits", "probabilities"]


def test_a_single_bundle_refuses_the_answered_by_output(served):
    with served.channel() as channel, pytest.raises(grpc.RpcError) as caught:
        kserve_pb2_grpc.GRPCInferenceServiceStub(channel).ModelInfer(
            infer_request(TEXTS, outputs=("answered_by",), model=""), timeout=10
        )
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT


# --- metrics and health -----------------------------------------------------------------------------------


def test_metrics_count_answered_and_escalated_texts_per_member(stub, served_cascade):
    before = scrape(served_cascade)
    stub.Classify(pb.ClassifyRequest(texts=TEXTS), timeout=10)
    after = scrape(served_cascade)

    def delta(name: str, member: str) -> float:
        return metric(after, name, member=member) - metric(before, name, member=member)

    counts = {
        (name, member): delta(f"edgedistill_cascade_{name}_texts_total", member)
        for name in ("answered", "escalated", "escalation_refused")
        for member in (STUDENT, TEACHER)
    }
    assert counts == {
        ("answered", STUDENT): len(SURE),
        ("answered", TEACHER): len(UNSURE),
        ("escalated", STUDENT): len(UNSURE),
        ("escalated", TEACHER): 0,
        ("escalation_refused", STUDENT): 0,
        ("escalation_refused", TEACHER): 0,
    }


def test_metrics_keep_apart_two_cascades_that_share_members(start_server, cascade, tmp_path):
    other = make_cascade(tmp_path)
    manifest = json.loads((other / mf.MANIFEST).read_text())
    manifest["info"]["cascade"]["name"] = "other-cascade"
    (other / mf.MANIFEST).write_text(json.dumps(manifest))
    server = start_server(settings_for(cascade, admin_token=ADMIN_TOKEN, reload_root=tmp_path))
    with server.channel() as channel:
        stub = classifier_pb2_grpc.ClassifierStub(channel)
        stub.Classify(pb.ClassifyRequest(texts=TEXTS), timeout=10)
        stub.Reload(pb.ReloadRequest(bundle_path=str(other)), metadata=ADMIN, timeout=30)
        stub.Classify(pb.ClassifyRequest(texts=SURE), timeout=10)
    text = scrape(server)
    name = "edgedistill_cascade_answered_texts_total"
    assert metric(text, name, cascade="tiny-cascade", member=STUDENT) == len(SURE)
    assert metric(text, name, cascade="other-cascade", member=STUDENT) == len(SURE)
    assert metric(text, name, cascade="other-cascade", member=TEACHER) == 0


def test_a_reload_of_a_cascade_counts_on_in_its_members_series(start_server, cascade):
    server = start_server(settings_for(cascade))
    with server.channel() as channel:
        stub = classifier_pb2_grpc.ClassifierStub(channel)
        stub.Classify(pb.ClassifyRequest(texts=TEXTS), timeout=10)
        server.call(server.server.reload())  # SIGHUP's reload of the served folder
        stub.Classify(pb.ClassifyRequest(texts=TEXTS), timeout=10)
    assert metric(scrape(server), "edgedistill_cascade_answered_texts_total", member=STUDENT) == 2 * len(SURE)


MEMBER_FAMILIES = (
    "cascade_answered",
    "cascade_escalated",
    "cascade_refused",
    "member_inference",
    "member_queue_wait",
    "member_depth",
)


def test_a_cascade_looks_up_each_members_series_once_however_many_requests(cascade, monkeypatch):
    metrics = Metrics()
    lookups = []
    for name in MEMBER_FAMILIES:
        family = getattr(metrics, name)
        monkeypatch.setattr(
            family,
            "labels",
            lambda *values, name=name, real=family.labels: lookups.append((name, values)) or real(*values),
        )
    runtime = load_runtime(cascade, settings_for(cascade), metrics)
    runtime.warm_up()

    async def serve():
        await runtime.start()
        for _ in range(3):
            await runtime.classify(TEXTS, None, None)
        await runtime.close(0)

    asyncio.run(serve())
    expected = {(name, ("tiny-cascade", member)): 1 for name in MEMBER_FAMILIES for member in (STUDENT, TEACHER)}
    assert Counter(lookups) == expected


MEMBER_SERIES = (
    "edgedistill_cascade_answered_texts_total",
    "edgedistill_cascade_escalated_texts_total",
    "edgedistill_cascade_escalation_refused_texts_total",
    "edgedistill_cascade_member_inference_seconds_count",
    "edgedistill_cascade_member_queue_wait_seconds_count",
    "edgedistill_cascade_member_queue_depth",
)


def test_every_members_series_is_scraped_at_zero_before_its_first_call(start_server, cascade):
    text = scrape(start_server(settings_for(cascade)))
    found = {
        (line.split("{")[0], member)
        for line in text.splitlines()
        for member in (STUDENT, TEACHER)
        if f'member="{member}"' in line and line.endswith(" 0.0")
    }
    assert found >= {(series, member) for series in MEMBER_SERIES for member in (STUDENT, TEACHER)}


def cascade_series(text: str, cascade: str) -> list[str]:
    """The samples of `cascade` in the scrape `text`."""
    return [line for line in text.splitlines() if f'cascade="{cascade}"' in line and not line.startswith("#")]


def test_a_load_of_a_cascade_whose_member_fails_to_open_adds_no_cascade_series(tmp_path):
    members = {
        STUDENT: write_bundle(tmp_path / "student"),
        TEACHER: write_bundle(tmp_path / "teacher", model=b"not an onnx model"),
    }
    folder = write_cascade(tmp_path / "bundle-cascade", members, [THRESHOLD], name="unopened-cascade")
    metrics = Metrics()
    with pytest.raises(BundleRejected, match="member teacher"):
        load_runtime(folder, settings_for(folder), metrics)
    assert cascade_series(generate_latest(metrics.registry).decode(), "unopened-cascade") == []


def test_a_reload_onto_a_cascade_that_fails_its_warm_up_adds_no_cascade_series(start_server, cascade, tmp_path):
    three = ["negative", "neutral", "positive"]  # the tiny model gives two logits: its warm-up refuses it
    members = {
        STUDENT: write_bundle(tmp_path / "student", labels=three),
        TEACHER: write_bundle(tmp_path / "teacher", bias=0.5, labels=three),
    }
    folder = write_cascade(tmp_path / "bundle-cascade", members, [THRESHOLD], name="cold-cascade")
    server = start_server(settings_for(cascade, admin_token=ADMIN_TOKEN, reload_root=tmp_path))
    assert "warm-up" in server.refused_reload(folder, ADMIN).details
    assert cascade_series(scrape(server), "cold-cascade") == []


def escalated_once(server, stub, sample: str, **labels) -> float:
    """How much one text that the student escalates to the teacher raises the sample `sample` of `server`."""
    before = metric(scrape(server), sample, **labels)
    stub.Classify(pb.ClassifyRequest(texts=UNSURE[:1]), timeout=10)
    return metric(scrape(server), sample, **labels) - before


def test_a_request_escalated_to_the_teacher_is_one_queue_wait_of_the_server(stub, served_cascade):
    assert escalated_once(served_cascade, stub, "edgedistill_queue_wait_seconds_count") == 1


@pytest.mark.parametrize("member", [STUDENT, TEACHER])
def test_metrics_time_each_members_queue_wait(stub, served_cascade, member):
    sample = "edgedistill_cascade_member_queue_wait_seconds_count"
    assert escalated_once(served_cascade, stub, sample, member=member) == 1


@pytest.mark.parametrize("member", [STUDENT, TEACHER])
def test_metrics_time_each_members_batches(stub, served_cascade, member):
    before = metric(scrape(served_cascade), "edgedistill_cascade_member_inference_seconds_count", member=member)
    stub.Classify(pb.ClassifyRequest(texts=TEXTS), timeout=10)
    after = metric(scrape(served_cascade), "edgedistill_cascade_member_inference_seconds_count", member=member)
    assert after - before >= 1  # the module's server has timed other tests' batches


def test_a_fault_of_the_last_member_turns_health_off(start_server, cascade):
    server = start_server(settings_for(cascade, inline_infer_ms=0, max_queue_delay_ms=50))
    batcher = server.server.host.current.members[-1].batcher
    fast = batcher.infer
    batcher.infer = lambda inputs: {name: value[:0] for name, value in fast(inputs).items()}  # no rows
    with server.channel() as channel:
        stub = classifier_pb2_grpc.ClassifierStub(channel)
        assert stub.Classify(pb.ClassifyRequest(texts=SURE), timeout=10).predictions[0].answered_by == STUDENT
        with pytest.raises(grpc.RpcError) as caught:
            stub.Classify(pb.ClassifyRequest(texts=UNSURE), timeout=10)
        assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
        status = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5).status
        assert status == NOT_SERVING


# --- overload, deadlines, drain, reload ---------------------------------------------------------------------

# Batches wait up to 2 s to fill 4 rows, so escalated texts stay queued at the teacher while calls of 4 texts
# run at once at the student; the queues hold 4 rows.
SLOW = {"max_queue_delay_ms": 2000, "inline_infer_ms": 0, "max_batch_size": 4, "max_queued": 4, "max_texts": 4}
WAITING = [SURE[0], *UNSURE[:3]]  # the student's batch is full at once; 3 texts wait for the teacher


def teacher_queue(server) -> int:
    return server.server.host.current.members[-1].queued_rows


def hold_the_teacher(server, stub):
    """A call whose 3 escalated texts wait in the teacher's queue, leaving it room for 1 more."""
    waiting = stub.Classify.future(pb.ClassifyRequest(texts=WAITING), timeout=10)
    wait_until(lambda: teacher_queue(server) == 3, "the escalated texts never waited for the teacher")
    return waiting


@pytest.fixture
def overloaded(start_server, cascade):
    """`overloaded(mode, **changes) -> (server, stub)`: a cascade server with SLOW queues (but for the settings
    `changes`) and CASCADE_OVERLOAD=mode."""
    channels = []

    def start(mode: str, **changes):
        server = start_server(settings_for(cascade, cascade_overload=mode, **SLOW | changes))
        channels.append(server.channel())
        return server, classifier_pb2_grpc.ClassifierStub(channels[-1])

    yield start
    for channel in channels:
        channel.close()


def escalating_pair(cascade) -> tuple[str, str]:
    """Two texts below the student's threshold: (less sure, surer)."""
    texts = UNSURE[2:]
    scores = confidence(logits_by_hand(cascade / MEMBERS / STUDENT, texts), "max_prob")
    assert (scores < THRESHOLD).all()
    assert scores[0] != scores[1]
    return tuple(texts) if scores[0] < scores[1] else tuple(reversed(texts))


def test_overload_answer_sends_on_what_fits_and_flags_the_rest_in_classify(overloaded, cascade):
    server, stub = overloaded("answer")
    less_sure, surer = escalating_pair(cascade)
    waiting = hold_the_teacher(server, stub)
    reply = stub.Classify(pb.ClassifyRequest(texts=[*SURE[:2], less_sure, surer]), timeout=10)
    assert [(p.answered_by, p.escalation_refused) for p in reply.predictions] == [
        (STUDENT, False),
        (STUDENT, False),
        (TEACHER, False),
        (STUDENT, True),
    ]
    assert [p.answered_by for p in waiting.result().predictions] == [STUDENT, TEACHER, TEACHER, TEACHER]


def test_overload_answer_sends_on_a_text_of_undefined_confidence_before_a_less_sure_one(
    start_server, overflowing_cascade
):
    server = start_server(settings_for(overflowing_cascade, cascade_overload="answer", **SLOW))
    with server.channel() as channel:
        stub = classifier_pb2_grpc.ClassifierStub(channel)
        waiting = hold_the_teacher(server, stub)
        reply = stub.Classify(pb.ClassifyRequest(texts=[*SURE[:2], UNSURE[2], OVERFLOWING]), timeout=10)
        waiting.result()
    assert [p.answered_by for p in reply.predictions[2:]] == [STUDENT, TEACHER]


def test_overload_answer_flags_escalation_refused_in_model_infer(overloaded, cascade):
    server, stub = overloaded("answer")
    less_sure, surer = escalating_pair(cascade)
    waiting = hold_the_teacher(server, stub)
    with server.channel() as channel:
        reply = kserve_pb2_grpc.GRPCInferenceServiceStub(channel).ModelInfer(
            infer_request([*SURE[:2], less_sure, surer]), timeout=10
        )
    outputs = decoded(reply)
    assert [member.decode() for member in outputs["answered_by"].reshape(-1)] == [STUDENT, STUDENT, TEACHER, STUDENT]
    assert outputs["escalation_refused"].reshape(-1).tolist() == [False, False, False, True]
    waiting.result()


def test_overload_answer_counts_the_refused_escalations(overloaded, cascade):
    server, stub = overloaded("answer")
    less_sure, surer = escalating_pair(cascade)
    waiting = hold_the_teacher(server, stub)
    stub.Classify(pb.ClassifyRequest(texts=[*SURE[:2], less_sure, surer]), timeout=10)
    waiting.result()
    text = scrape(server)
    assert metric(text, "edgedistill_cascade_escalation_refused_texts_total", member=STUDENT) == 1


def test_overload_refuse_fails_the_request_with_resource_exhausted(overloaded, cascade):
    server, stub = overloaded("refuse")
    less_sure, surer = escalating_pair(cascade)
    waiting = hold_the_teacher(server, stub)
    with pytest.raises(grpc.RpcError) as caught:
        stub.Classify(pb.ClassifyRequest(texts=[*SURE[:2], less_sure, surer]), timeout=10)
    assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "CASCADE_OVERLOAD=refuse" in caught.value.details()
    assert [p.answered_by for p in waiting.result().predictions] == [STUDENT, TEACHER, TEACHER, TEACHER]


def test_overload_refuse_counts_none_of_the_failed_requests_texts_as_refused_escalations(overloaded, cascade):
    server, stub = overloaded("refuse")
    less_sure, surer = escalating_pair(cascade)
    waiting = hold_the_teacher(server, stub)
    with pytest.raises(grpc.RpcError):
        stub.Classify(pb.ClassifyRequest(texts=[*SURE[:2], less_sure, surer]), timeout=10)
    waiting.result()
    assert metric(scrape(server), "edgedistill_cascade_escalation_refused_texts_total", member=STUDENT) == 0


def test_overload_refuse_keeps_requests_that_fit(overloaded):
    server, stub = overloaded("refuse")
    waiting = hold_the_teacher(server, stub)
    reply = stub.Classify(pb.ClassifyRequest(texts=[*SURE, UNSURE[3]]), timeout=10)  # one escalated: it fits
    assert [p.answered_by for p in reply.predictions] == [STUDENT, STUDENT, STUDENT, TEACHER]
    waiting.result()


def test_a_deadline_passing_while_escalated_texts_wait_drops_them(overloaded):
    # The teacher's batch waits 60 s to fill, so that its queue empties by the drop alone, however late the test looks:
    # given 1 s before SLOW's 2 s ran the texts, a 1 s stall of the test's process there failed it
    server, stub = overloaded("answer", max_queue_delay_ms=60_000)
    waiting = stub.Classify.future(pb.ClassifyRequest(texts=WAITING), timeout=3)
    wait_until(lambda: teacher_queue(server) == 3, "the escalated texts never reached the teacher", timeout=2.5)
    assert waiting.exception(timeout=10).code() == grpc.StatusCode.DEADLINE_EXCEEDED
    wait_until(lambda: teacher_queue(server) == 0, "the escalated texts stayed queued")


def test_drain_lets_escalated_texts_finish_at_the_teacher(overloaded):
    server, stub = overloaded("answer")
    waiting = hold_the_teacher(server, stub)
    server.call(server.server.stop(grace=10))
    assert [p.answered_by for p in waiting.result().predictions] == [STUDENT, TEACHER, TEACHER, TEACHER]


def test_a_reload_lets_escalated_texts_finish_on_the_old_cascade(overloaded):
    server, stub = overloaded("answer")
    waiting = hold_the_teacher(server, stub)
    reloaded, previous = server.call(server.server.reload())  # SIGHUP's reload of the served folder
    assert previous is not None
    assert reloaded is server.server.host.current
    assert [p.answered_by for p in waiting.result().predictions] == [STUDENT, TEACHER, TEACHER, TEACHER]


RENAMED_TEACHER = "big-teacher"


@pytest.fixture(scope="module")
def reloaded_past_a_hung_teacher(cascade, tmp_path_factory):
    """A scrape after a reload of a server of `cascade`, whose teacher hangs in a call with 2 rows queued behind it,
    onto a cascade of the same name whose members are `student` and `big-teacher`: once the replaced cascade was
    closed at SHUTDOWN_GRACE_S, and its request, failed there, was answered by the new one."""
    other = write_cascade(
        tmp_path_factory.mktemp("renamed") / "bundle-cascade",
        {STUDENT: cascade / MEMBERS / STUDENT, RENAMED_TEACHER: cascade / MEMBERS / TEACHER},
        [THRESHOLD],
    )
    server = RunningServer(settings_for(cascade, inline_infer_ms=0, max_batch_size=1, shutdown_grace_s=0.5))
    teacher = server.server.host.current.members[-1]
    gate = threading.Event()
    teacher.batcher.infer = lambda inputs: gate.wait(30)  # hangs until the fixture ends
    try:
        with server.channel() as channel:
            waiting = classifier_pb2_grpc.ClassifierStub(channel).Classify.future(
                pb.ClassifyRequest(texts=WAITING), timeout=30
            )
            wait_until(lambda: teacher.queued_rows == 2, "the escalated texts never queued behind the hung call")
            server.call(server.server.reload(other))
            waiting.result()
        yield scrape(server)
    finally:
        gate.set()
        server.close()


def test_a_replaced_cascades_member_that_could_not_finish_its_queue_reads_a_queue_depth_of_zero(
    reloaded_past_a_hung_teacher,
):
    depth = metric(
        reloaded_past_a_hung_teacher, "edgedistill_cascade_member_queue_depth", cascade="tiny-cascade", member=TEACHER
    )
    assert depth == 0


def test_the_queue_depth_after_a_reload_past_a_hung_member_leaves_out_the_replaced_members_queue(
    reloaded_past_a_hung_teacher,
):
    assert metric(reloaded_past_a_hung_teacher, "edgedistill_queue_depth") == 0


# --- loading --------------------------------------------------------------------------------------------------


def corrupt_member(cascade, member: str = TEACHER):
    corrupt(cascade / MEMBERS / member)
    return cascade


def test_a_cascade_with_a_corrupt_member_is_refused_at_load(tmp_path):
    folder = corrupt_member(make_cascade(tmp_path))
    with pytest.raises(BundleRejected, match=r"member teacher: .*members/teacher: model.onnx does not match"):
        asyncio.run(start_and_stop(settings_for(folder)))


async def start_and_stop(settings):
    from edgedistill.serve.app import create_server

    server, _ = create_server(settings)
    await server.stop(0)


def test_a_server_on_a_cascade_with_a_corrupt_member_exits_with_the_reason(spawn, tmp_path):
    folder = corrupt_member(make_cascade(tmp_path))
    process = spawn(folder)
    assert process.proc.wait(60) == 2
    failed = process.wait_for("start_failed")
    assert "members/teacher: model.onnx does not match its sha256" in failed["msg"]


def test_a_reload_onto_a_corrupt_cascade_keeps_the_old_one(start_server, tmp_path):
    good = make_cascade(tmp_path / "good")
    bad = corrupt_member(make_cascade(tmp_path / "bad"))
    server = start_server(settings_for(good, admin_token=ADMIN_TOKEN, reload_root=tmp_path))
    refusal = server.refused_reload(bad, ADMIN)
    assert refusal.code == grpc.StatusCode.FAILED_PRECONDITION
    assert "members/teacher: model.onnx does not match" in refusal.details
    with server.channel() as channel:
        reply = classifier_pb2_grpc.ClassifierStub(channel).Classify(pb.ClassifyRequest(texts=TEXTS), timeout=10)
    assert [p.answered_by for p in reply.predictions] == ANSWERED_BY


def test_loading_a_cascade_hashes_each_members_model_file_once(cascade, monkeypatch):
    checked = checks_counted(monkeypatch)
    runtime = load_runtime(cascade, settings_for(cascade))
    asyncio.run(runtime.close(0))
    assert [checked[(cascade / MEMBERS / m / "model.onnx").resolve()] for m in (STUDENT, TEACHER)] == [1, 1]


def test_a_member_changed_since_the_cascade_was_built_is_refused(tmp_path):
    folder = make_cascade(tmp_path)
    other = write_bundle(tmp_path / "other", bias=2.0)
    shutil.rmtree(folder / MEMBERS / TEACHER)
    shutil.copytree(other, folder / MEMBERS / TEACHER)
    with pytest.raises(BundleRejected, match="cascade refused"):
        asyncio.run(start_and_stop(settings_for(folder)))


def test_a_reload_swaps_a_single_bundle_for_a_cascade(start_server, bundle, cascade):
    server = start_server(settings_for(bundle, admin_token=ADMIN_TOKEN, reload_root=cascade.parent))
    with server.channel() as channel:
        stub = classifier_pb2_grpc.ClassifierStub(channel)
        reply = stub.Reload(pb.ReloadRequest(bundle_path=str(cascade)), metadata=ADMIN, timeout=30)
        assert [m.model.bundle_path for m in reply.model.cascade_members] == [
            str(cascade / MEMBERS / STUDENT),
            str(cascade / MEMBERS / TEACHER),
        ]
        assert [p.answered_by for p in stub.Classify(pb.ClassifyRequest(texts=TEXTS), timeout=10).predictions] == (
            ANSWERED_BY
        )


def test_cascade_overload_for_a_single_bundle_is_refused_naming_it(bundle):
    refusal = (
        r"is a single bundle, not a confidence cascade: EDGEDISTILL_CASCADE_OVERLOAD \(--cascade-overload\) refuse"
    )
    with pytest.raises(BundleRejected, match=refusal):
        asyncio.run(start_and_stop(settings_for(bundle, cascade_overload="refuse")))


def test_cascade_overload_for_a_folder_that_is_no_bundle_is_refused_for_what_it_lacks(tmp_path):
    with pytest.raises(BundleRejected, match="manifest.json is missing"):
        asyncio.run(start_and_stop(settings_for(tmp_path / "nothing", cascade_overload="refuse")))


def test_a_reload_of_a_cascade_server_given_cascade_overload_onto_a_single_bundle_keeps_the_cascade(
    start_server, bundle, cascade
):
    settings = settings_for(cascade, cascade_overload="refuse", admin_token=ADMIN_TOKEN, reload_root=bundle.parent)
    refusal = start_server(settings).refused_reload(bundle, ADMIN)
    assert refusal.code == grpc.StatusCode.FAILED_PRECONDITION
    assert "EDGEDISTILL_CASCADE_OVERLOAD (--cascade-overload) refuse would do nothing" in refusal.details
    assert refusal.serving.bundle_path == str(cascade)


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    return write_engine(tmp_path_factory.mktemp("engine") / "bundle-engine")


@pytest.fixture(scope="module")
def engines(tmp_path_factory, engine):
    """A cascade of two TensorRT engines."""
    folder = tmp_path_factory.mktemp("engines")
    return write_cascade(folder / "bundle-cascade", {STUDENT: engine, TEACHER: engine}, [THRESHOLD])


@pytest.fixture(scope="module")
def mixed(tmp_path_factory, engine):
    """A cascade of an ONNX student and a TensorRT engine as its teacher."""
    folder = tmp_path_factory.mktemp("mixed")
    return write_cascade(folder / "bundle-cascade", {STUDENT: write_bundle(folder / "student"), TEACHER: engine}, [0.9])


def test_threads_for_a_tensorrt_engine_are_refused_naming_the_setting(engine):
    refusal = (
        r"it is a TensorRT engine \(runtime 'tensorrt'\), .*: EDGEDISTILL_THREADS \(--threads\) 2 would do nothing"
    )
    with pytest.raises(BundleRejected, match=refusal):
        load_runtime(engine, settings_for(engine, threads=2))


def test_spin_for_a_tensorrt_engine_is_refused_naming_the_setting(engine):
    with pytest.raises(BundleRejected, match=r"EDGEDISTILL_SPIN \(--spin\) true would do nothing"):
        load_runtime(engine, settings_for(engine, threads=0, spin=True))


def test_providers_for_a_tensorrt_engine_are_refused_naming_the_setting(engine):
    refusal = r"it is a TensorRT engine .*: EDGEDISTILL_PROVIDERS \(--providers\) CPUExecutionProvider would do nothing"
    with pytest.raises(BundleRejected, match=refusal):
        load_runtime(engine, settings_for(engine, threads=0, providers=["cpu"]))


def test_cpu_fallback_for_a_tensorrt_engine_is_refused_naming_the_setting(engine):
    refusal = (
        r"it is a TensorRT engine .*: EDGEDISTILL_ALLOW_CPU_FALLBACK \(--allow-cpu-fallback\) true would do nothing"
    )
    with pytest.raises(BundleRejected, match=refusal):
        load_runtime(engine, settings_for(engine, threads=0, allow_cpu_fallback=True))


def test_threads_for_a_cascade_of_tensorrt_engines_alone_are_refused(engines):
    with pytest.raises(BundleRejected, match="every member of the cascade is a TensorRT engine"):
        load_runtime(engines, settings_for(engines, threads=2))


def test_threads_for_a_cascade_with_an_onnx_member_are_used(mixed):
    assert refuse_unused_by(mixed, settings_for(mixed, threads=2, spin=True), cascade=True) is None


def test_providers_for_a_cascade_with_an_onnx_member_are_used(mixed):
    with pytest.raises(BundleRejected) as caught:  # the placeholder engine cannot be opened
        load_runtime(mixed, settings_for(mixed, threads=0, providers=["cpu"]))
    assert "EDGEDISTILL_PROVIDERS" not in str(caught.value)


def test_the_default_threads_and_spin_for_a_tensorrt_engine_are_accepted(engine):
    assert refuse_unused_by(engine, settings_for(engine, threads=0), cascade=False) is None


def test_a_reload_onto_a_tensorrt_engine_given_threads_keeps_the_old_bundle(start_server, bundle, engine):
    settings = settings_for(bundle, threads=1, admin_token=ADMIN_TOKEN, reload_root=engine.parent)
    refusal = start_server(settings).refused_reload(engine, ADMIN)
    assert "EDGEDISTILL_THREADS (--threads) 1 would do nothing" in refusal.details
    assert refusal.serving.bundle_path == str(bundle)


def test_a_pair_cascade_takes_pairs(start_server, tmp_path):
    from tests.serve.conftest import pair_spec

    server = start_server(settings_for(make_cascade(tmp_path, **pair_spec())))
    with server.channel() as channel:
        stub = classifier_pb2_grpc.ClassifierStub(channel)
        reply = stub.Classify(pb.ClassifyRequest(texts=["the movie"] * 2, text_pairs=SURE[:1] + UNSURE[:1]), timeout=10)
        assert [p.answered_by for p in reply.predictions] == [STUDENT, TEACHER]
        with pytest.raises(grpc.RpcError) as caught:
            stub.Classify(pb.ClassifyRequest(texts=["the movie"]), timeout=10)
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_worker_memory_counts_every_members_model_file(cascade):
    members = [cascade / MEMBERS / member / "model.onnx" for member in (STUDENT, TEACHER)]
    assert ServedModels.read(cascade).model_bytes == sum(path.stat().st_size for path in members)


def with_text_threshold(cascade, tmp_path):
    """A copy of `cascade` whose first member's threshold is text."""
    folder = shutil.copytree(cascade, tmp_path / "cascade")
    manifest = json.loads((folder / mf.MANIFEST).read_text())
    manifest["info"]["cascade"]["members"][0]["threshold"] = "high"
    (folder / mf.MANIFEST).write_text(json.dumps(manifest))
    return folder


def test_an_invalid_cascade_spec_is_refused_naming_the_key_and_its_problem(cascade, tmp_path):
    with pytest.raises(mf.ArtifactError, match="invalid cascade spec: members.0.threshold: Input should be a valid"):
        load_cascade(with_text_threshold(cascade, tmp_path))


def test_worker_memory_refuses_an_invalid_cascade_spec_naming_the_key(cascade, tmp_path):
    refused = ServedModels.read(with_text_threshold(cascade, tmp_path)).refused
    assert "members.0.threshold: Input should be a valid number" in str(refused)


def test_two_workers_serve_a_cascade(spawn, cascade):
    process = spawn(cascade, EDGEDISTILL_WORKERS="2")
    serving = process.wait_for("workers_serving", timeout=90)
    assert sum(line.get("event") == "cascade_checked" for line in process.lines) == 2
    with grpc.insecure_channel(f"127.0.0.1:{serving['port']}") as channel:
        stub = classifier_pb2_grpc.ClassifierStub(channel)
        reply = stub.Classify(pb.ClassifyRequest(texts=TEXTS), timeout=10, wait_for_ready=True)
    assert [p.answered_by for p in reply.predictions] == ANSWERED_BY


@pytest.fixture(scope="module")
def mixed_styles(tmp_path_factory):
    """A cascade served whose teacher writes texts in the `ptb_lower` style, which removes HTML markup, and whose
    student keeps them raw: a markup-only text is escalated by the student and read as nothing by the teacher."""
    folder = tmp_path_factory.mktemp("styles")
    student = write_bundle(folder / "student")
    teacher = write_bundle(folder / "teacher", bias=0.5, text_style="ptb_lower")
    server = RunningServer(settings_for(write_cascade(folder / "c", {STUDENT: student, TEACHER: teacher}, [THRESHOLD])))
    yield server
    server.close()


def test_a_text_a_later_member_reads_as_nothing_is_named_by_its_place_in_the_request(mixed_styles):
    with mixed_styles.channel() as channel, pytest.raises(grpc.RpcError) as refused:
        classifier_pb2_grpc.ClassifierStub(channel).Classify(pb.ClassifyRequest(texts=[*SURE[:2], "<br />"]))
    assert "text 2 holds nothing cascade member teacher's tokenizer keeps" in refused.value.details()


def test_a_text_a_later_member_reads_as_nothing_is_an_invalid_argument(mixed_styles):
    with mixed_styles.channel() as channel, pytest.raises(grpc.RpcError) as refused:
        classifier_pb2_grpc.ClassifierStub(channel).Classify(pb.ClassifyRequest(texts=[*SURE[:2], "<br />"]))
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
