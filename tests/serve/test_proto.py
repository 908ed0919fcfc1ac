"""The committed generated code matches the protos; the KServe proto matches Triton's wire format."""

import json
import subprocess
import sys
from importlib import resources
from pathlib import Path

import pytest
from edgedistill.serve.proto import generate, kserve_pb2
from google.protobuf import descriptor_pb2

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


# Paths into a FileDescriptorProto, as its SourceCodeInfo locations name them (descriptor.proto's field numbers).
FILE_MESSAGES, FILE_SERVICES, MESSAGE_FIELDS, MESSAGE_NESTED, SERVICE_METHODS = 4, 6, 2, 3, 2


def with_source_info(proto: str, tmp_path: Path) -> descriptor_pb2.FileDescriptorProto:
    """The descriptor of `proto` beside `generate`, with its comments, as protoc reads the file."""
    from grpc_tools import protoc

    out = tmp_path / "descriptors.pb"
    well_known = resources.files("grpc_tools") / "_proto"
    args = ["protoc", f"--proto_path={generate.HERE}", f"--proto_path={well_known}", "--include_source_info"]
    assert protoc.main([*args, f"--descriptor_set_out={out}", proto]) == 0
    return descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes()).file[0]


def commented(file: descriptor_pb2.FileDescriptorProto) -> set[tuple[int, ...]]:
    return {tuple(loc.path) for loc in file.source_code_info.location if loc.leading_comments.strip()}


def message_paths(messages, prefix: tuple[int, ...]):
    """(name, path) of every message and field in `messages`, nested ones included; map entries left out."""
    for i, message in enumerate(messages):
        if message.options.map_entry:
            continue
        path = (*prefix, i)
        yield message.name, path
        for j, field in enumerate(message.field):
            yield f"{message.name}.{field.name}", (*path, MESSAGE_FIELDS, j)
        yield from message_paths(message.nested_type, (*path, MESSAGE_NESTED))


def service_paths(file: descriptor_pb2.FileDescriptorProto):
    """(name, path) of every service and RPC of `file`."""
    for i, service in enumerate(file.service):
        yield service.name, (FILE_SERVICES, i)
        for j, method in enumerate(service.method):
            yield f"{service.name}.{method.name}", (FILE_SERVICES, i, SERVICE_METHODS, j)


def test_every_classifier_message_field_service_and_rpc_has_a_comment(tmp_path):
    file = with_source_info("classifier.proto", tmp_path)
    paths = [*message_paths(file.message_type, (FILE_MESSAGES,)), *service_paths(file)]
    assert [name for name, path in paths if path not in commented(file)] == []


def test_every_kserve_rpc_has_a_comment(tmp_path):
    file = with_source_info("kserve.proto", tmp_path)
    assert [name for name, path in service_paths(file) if path not in commented(file)] == []


@pytest.mark.parametrize("proto", generate.PROTOS)
def test_proto_names_its_go_package(proto, tmp_path):
    """protoc-gen-go refuses a file without a Go import path."""
    assert with_source_info(proto, tmp_path).options.go_package


def test_classifier_proto_generates_java_classes_of_their_own(tmp_path):
    assert with_source_info("classifier.proto", tmp_path).options.java_multiple_files


def test_an_output_folder_a_file_stands_in_is_refused_as_the_argument_is_read(tmp_path):
    (tmp_path / "file").write_text("")
    with pytest.raises(SystemExit) as refused:
        generate.main(["--out", str(tmp_path / "file" / "proto")])
    assert refused.value.code == 2
