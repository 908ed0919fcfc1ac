"""The committed generated code matches the protos; the KServe proto matches Triton's wire format."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
from edgedistill.serve.proto import generate, kserve_pb2

from tests.serve.triton_probe import CONFIG_MESSAGES, MESSAGES, field_table

PROBE = Path(__file__).with_name("triton_probe.py")
CONFIG_SCOPE = kserve_pb2.ModelConfigResponse.DESCRIPTOR  # the model-config messages are nested in it


def as_tritons(table: dict) -> dict:
    """A field table with the model-config messages named as Triton names them (top level, not nested here)."""
    out = {}
    for name, entry in table.items():
        if name in CONFIG_MESSAGES:
            continue
        if "number" in entry:
            message = entry["message"]
            entry = entry | {"message": message and message.replace("inference.ModelConfigResponse.", "inference.")}
        else:  # a nested message's own table
            entry = as_tritons(entry)
        out[name] = entry
    return out


def test_committed_generated_code_matches_the_protos(tmp_path):
    written = generate.generate(tmp_path)
    assert sorted(p.name for p in written) == sorted(
        n for proto in generate.PROTOS for n in generate.generated_names(proto)
    )
    for path in written:
        committed = generate.HERE / path.name
        assert committed.is_file(), f"{committed.name} is not committed: run python -m serve.proto.generate"
        assert committed.read_text() == path.read_text(), (
            f"{committed.name} is stale: run python -m serve.proto.generate"
        )
    for proto in generate.PROTOS:
        stub = (tmp_path / generate.generated_names(proto)[1]).read_text()
        assert f"from . import {proto.removesuffix('.proto')}_pb2 as" in stub
        assert f"\nimport {proto.removesuffix('.proto')}_pb2" not in stub


@pytest.fixture(scope="module")
def triton() -> dict:
    """tritonclient's descriptors, read in a process of their own."""
    result = subprocess.run(
        [sys.executable, str(PROBE), "descriptors"], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def test_kserve_proto_has_tritons_names_and_field_numbers(triton):
    ours = kserve_pb2.DESCRIPTOR
    assert ours.package == triton["package"] == "inference"
    service = ours.services_by_name["GRPCInferenceService"]
    assert service.full_name == triton["service"]
    for method in service.methods:
        assert [
            method.input_type.full_name,
            method.output_type.full_name,
            method.client_streaming,
            method.server_streaming,
        ] == triton["methods"][method.name], method.name
    for name in MESSAGES:
        assert as_tritons(field_table(ours.message_types_by_name[name])) == triton["messages"][name], name


@pytest.mark.parametrize("name", CONFIG_MESSAGES)
def test_model_config_messages_are_a_subset_of_tritons(triton, name):
    ours = as_tritons(field_table(CONFIG_SCOPE.nested_types_by_name[name]))
    theirs = triton["config_messages"][name]
    assert {field: theirs.get(field) for field in ours} == ours


def test_data_types_have_tritons_numbers(triton):
    ours = {v.name: v.number for v in CONFIG_SCOPE.enum_types_by_name["DataType"].values}
    assert ours == triton["data_types"]
