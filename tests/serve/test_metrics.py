"""The metrics' definitions: what their buckets can tell apart, which process figures they carry."""

import grpc
import pytest
from edgedistill.common.recipe import load_recipe
from edgedistill.serve.batching import DropReason
from edgedistill.serve.metrics import BATCH_BUCKETS, LATENCY_BUCKETS, Metrics
from edgedistill.serve.settings import Settings
from prometheus_client import generate_latest

from tests.serve.conftest import ROOT
from tests.serve.test_operations import metric


def bucket_of(seconds: float) -> float:
    return next(edge for edge in (*LATENCY_BUCKETS, float("inf")) if seconds <= edge)


def test_latency_buckets_tell_apart_edge_latencies_and_have_an_edge_at_the_default_slo():
    # a small student's backend call (about 80 us), a light call (about 300 us), calls around the SLO
    assert len({bucket_of(s) for s in (0.00008, 0.0003, 0.0015, 0.0028, 0.0035)}) == 5
    p99 = load_recipe(ROOT / "recipes" / "sst2.yaml").bench.serving.paced_slo.p99_ms / 1000
    assert p99 in LATENCY_BUCKETS  # the share of calls within the SLO is a bucket's count


def test_latency_buckets_reach_the_default_batch_timeout():
    # a call a slow backend holds up to its time limit lands in a finite bucket, not +Inf
    assert max(LATENCY_BUCKETS) >= Settings.model_fields["batch_timeout_s"].default


def test_batch_buckets_reach_the_default_max_queued():
    # MAX_QUEUED bounds a batch (MAX_BATCH_SIZE): the largest batch a default server can run lands in a finite bucket
    assert max(BATCH_BUCKETS) >= Settings.model_fields["max_queued"].default


def test_every_drop_reason_is_exposed_at_zero_before_any_drop():
    text = generate_latest(Metrics().registry).decode()
    assert all(f'edgedistill_dropped_rows_total{{reason="{reason}"}} 0.0' in text for reason in DropReason)


def test_one_server_exports_no_created_series_as_several_workers_do_not():
    metrics = Metrics()
    metrics.requests.labels("/edgedistill.v1.Classifier/Classify", "OK").inc()
    assert "_created" not in generate_latest(metrics.registry).decode()


CLASSIFY = "/edgedistill.v1.Classifier/Classify"


def observed_calls() -> str:
    """A scrape after three calls of Classify: two OK, one INVALID_ARGUMENT."""
    metrics = Metrics()
    for code in (grpc.StatusCode.OK, grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.OK):
        metrics.observe_call(CLASSIFY, code, 0.0004)
    return generate_latest(metrics.registry).decode()


def test_observed_calls_are_counted_by_method_and_code():
    assert f'edgedistill_requests_total{{code="OK",method="{CLASSIFY}"}} 2.0' in observed_calls()


def test_observed_calls_count_errors_by_code():
    assert metric(observed_calls(), "edgedistill_errors_total", code="INVALID_ARGUMENT") == 1


def errors_by_kind(code: grpc.StatusCode, clients_fault: bool = False) -> dict[str, float]:
    """Errors of each kind after one failed call of Classify with `code`."""
    metrics = Metrics()
    metrics.observe_call(CLASSIFY, code, 0.0004, clients_fault)
    text = generate_latest(metrics.registry).decode()
    return {kind: metric(text, "edgedistill_errors_total", code=code.name, kind=kind) for kind in ("client", "server")}


@pytest.mark.parametrize(
    "code",
    [grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.NOT_FOUND],
    ids=lambda code: code.name,
)
def test_a_call_refused_for_its_request_is_a_client_error(code):
    assert errors_by_kind(code) == {"client": 1, "server": 0}


@pytest.mark.parametrize(
    "code",
    [grpc.StatusCode.INTERNAL, grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.RESOURCE_EXHAUSTED],
    ids=lambda code: code.name,
)
def test_a_call_the_server_failed_is_a_server_error(code):
    assert errors_by_kind(code) == {"client": 0, "server": 1}


def test_resource_exhausted_caused_by_the_request_is_a_client_error():
    assert errors_by_kind(grpc.StatusCode.RESOURCE_EXHAUSTED, clients_fault=True) == {"client": 1, "server": 0}


def test_observed_calls_count_no_error_for_ok():
    assert 'edgedistill_errors_total{code="OK",' not in observed_calls()


def calls_the_client_ended() -> str:
    """A scrape after two calls of Classify that their client ended: one cancelled, one past its deadline."""
    metrics = Metrics()
    for code in (grpc.StatusCode.CANCELLED, grpc.StatusCode.DEADLINE_EXCEEDED):
        metrics.observe_call(CLASSIFY, code, 0.0004)
    return generate_latest(metrics.registry).decode()


def test_a_cancelled_call_counts_as_abandoned():
    assert 'edgedistill_abandoned_calls_total{code="CANCELLED"} 1.0' in calls_the_client_ended()


def test_a_call_past_its_deadline_counts_as_abandoned():
    assert 'edgedistill_abandoned_calls_total{code="DEADLINE_EXCEEDED"} 1.0' in calls_the_client_ended()


def test_calls_the_client_ended_count_no_error():
    assert "edgedistill_errors_total{" not in calls_the_client_ended()


def test_calls_the_client_ended_still_count_as_requests_by_code():
    assert f'edgedistill_requests_total{{code="CANCELLED",method="{CLASSIFY}"}} 1.0' in calls_the_client_ended()


@pytest.mark.parametrize("code", ["CANCELLED", "DEADLINE_EXCEEDED"])
def test_every_abandoned_code_is_exposed_at_zero_before_any_call(code):
    assert f'edgedistill_abandoned_calls_total{{code="{code}"}} 0.0' in generate_latest(Metrics().registry).decode()


def test_observed_calls_time_every_call_by_method():
    assert f'edgedistill_request_seconds_count{{method="{CLASSIFY}"}} 3.0' in observed_calls()


def test_observe_call_looks_up_the_labels_of_a_method_and_code_once(monkeypatch):
    metrics = Metrics()
    lookups = []
    for family in (metrics.requests, metrics.latency, metrics.errors):
        monkeypatch.setattr(
            family, "labels", lambda *values, lookup=family.labels: lookups.append(values) or lookup(*values)
        )
    for _ in range(3):
        metrics.observe_call(CLASSIFY, grpc.StatusCode.INVALID_ARGUMENT, 0.0004)
    assert len(lookups) == 3  # requests, latency and errors, at the first call only


def test_two_observers_of_one_cascade_member_count_in_one_series():
    metrics = Metrics()
    for _ in range(2):  # a cascade's member, then that of the cascade a reload put in its place
        observer = metrics.member("tiny-cascade", "student")
        observer.queue_depth(0)  # its batcher starts
        observer.routed(answered=2, escalated=1, refused=0)
    text = generate_latest(metrics.registry).decode()
    assert metric(text, "edgedistill_cascade_answered_texts_total", cascade="tiny-cascade", member="student") == 4


def test_one_server_exports_its_own_process_memory():
    assert metric(generate_latest(Metrics().registry).decode(), "process_resident_memory_bytes") > 0
