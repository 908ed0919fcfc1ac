from edgedistill.bench.tables import record_line


def test_record_line_names_texts_per_s_where_the_record_has_it():
    record = {"requests_per_s": 10, "texts_per_s": 80, "p99_ms": 1.5, "failures": 0, "client_cpu": 5}
    assert "80 texts/s" in record_line(record)


def test_record_line_names_server_cpu_where_the_record_has_it():
    record = {"requests_per_s": 10, "p99_ms": 1.5, "failures": 0, "client_cpu": 5, "server_cpu": 90}
    assert record_line(record).endswith("server CPU 90 %")
