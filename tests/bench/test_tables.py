from edgedistill.bench import slo
from edgedistill.bench.stats import Spread
from edgedistill.bench.tables import h2load_failures_line, record_line, spread_cell, target_rows, threads_phrase


def test_record_line_names_texts_per_s_where_the_record_has_it():
    record = {"requests_per_s": 10, "texts_per_s": 80, "p99_ms": 1.5, "failures": 0, "client_cpu": 5}
    assert "80 texts/s" in record_line(record)


def test_record_line_names_server_cpu_where_the_record_has_it():
    record = {"requests_per_s": 10, "p99_ms": 1.5, "failures": 0, "client_cpu": 5, "server_cpu": 90}
    assert record_line(record).endswith("server CPU 90 %")


def h2load_runs(failures: list[int]) -> dict[str, list[dict]]:
    """The saturated and paced runs of one server over two repeats, the saturated one's failures as given."""
    return {
        "edgedistill capacity": [{"requests": 1000, "failures": f} for f in failures],
        "edgedistill paced": [{"requests": 400, "failures": 0}] * 2,
    }


def test_h2load_failures_line_counts_a_runs_failed_calls_over_its_repeats():
    assert "edgedistill saturated 7 of 2000" in h2load_failures_line(h2load_runs([3, 4]), 200)


def test_h2load_failures_line_leaves_out_runs_without_failed_calls():
    assert "paced" not in h2load_failures_line(h2load_runs([3, 4]), 200)


def test_h2load_failures_line_says_the_percentiles_include_the_failed_calls():
    assert "percentiles include the failed calls" in h2load_failures_line(h2load_runs([1, 0]), 200)


def test_h2load_runs_without_failed_calls_have_no_failures_line():
    assert h2load_failures_line(h2load_runs([0, 0]), 200) is None


def test_a_tensorrt_engines_threads_phrase_names_no_intra_op_threads():
    assert threads_phrase({"runtime": "tensorrt"}, 2, " per worker") == "no intra-op threads (a TensorRT engine)"


def test_an_onnx_bundles_threads_phrase_gives_its_threads_per_worker():
    assert threads_phrase({"runtime": "onnxruntime"}, 2, " per worker") == "2 intra-op threads per worker"


def test_an_onnx_bundles_threads_phrase_gives_one_thread_in_the_singular():
    assert threads_phrase({"runtime": "onnxruntime"}, 1) == "1 intra-op thread"


def test_an_onnx_bundles_threads_phrase_names_the_runtimes_default_for_zero():
    assert threads_phrase({"runtime": "onnxruntime"}, 0) == "ONNX Runtime's default intra-op threads"


def test_a_missed_target_does_not_show_its_limits_number_as_measured():
    assert target_rows([slo.verdict("p99_ms", 3.00004, "<= 3", False)]) == [["p99_ms", "3.00004", "<= 3", "MISS"]]


def test_a_median_of_counts_between_two_repeats_keeps_its_half():
    assert spread_cell(Spread.of([0, 1]), 0) == "0.5 (0-1)"


def test_a_median_of_rates_is_written_to_the_digits_asked():
    assert spread_cell(Spread.of([1500.4, 1501.2]), 0) == "1501 (1500-1501)"
