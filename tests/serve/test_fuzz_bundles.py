"""Property-based fuzzing of the bundle loader: a bundle whose manifest or files are corrupted (fields of any type or
value, file entries renamed or wrong, files cut or replaced, with or without hashes that match) is served after its
warm-up, or refused with `BundleRejected`, which names the problem; no other error escapes from deep inside."""

import hashlib
import json
import shutil
from pathlib import Path

import pytest
from edgedistill.serve.cascade import load_runtime
from edgedistill.serve.errors import BundleRejected
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.serve.conftest import settings_for, write_bundle
from tests.serve.test_fuzz import FUZZ, mostly

FILE_NAMES = ["model.onnx", "tokenizer.json", "", ".", "..", "../model.onnx", "/etc/hostname", "a\x00b", "x" * 300]
VALUES = (
    st.none()
    | st.booleans()
    | st.sampled_from([-1, 0, 1, 2, 2**31, 2**64])
    | st.floats()
    | st.text(max_size=6)
    | st.sampled_from([*FILE_NAMES, "input_ids", "token_type_ids", "logits", "int32", "tensorrt", "int8", []])
    | st.lists(st.sampled_from(["text", "text_pair", "a", "", "CPUExecutionProvider", "cuda"]), max_size=3)
    | st.dictionaries(st.text(max_size=4), st.integers(), max_size=2)
)

PLAUSIBLE = {  # values a spec field could hold, for corruptions that load and reach the warm-up
    "name": st.text(max_size=8),
    "version": st.text(max_size=3),
    "labels": st.lists(st.text(max_size=4), max_size=4),
    "text_inputs": st.sampled_from([["text"], ["text", "text_pair"], ["text_pair"], ["text", "text"], []]),
    "max_length": st.integers(1, 40),
    "pad_token_id": st.integers(0, 40),
    "precision": st.sampled_from(["fp32", "fp16", "int8"]),
    "providers": st.sampled_from([["CPUExecutionProvider"], ["cpu"], ["CUDAExecutionProvider"], ["Nope"]]),
    "opset": st.integers(0, 30),
    "fused_operators": st.dictionaries(st.text(max_size=4), st.integers(0, 3), max_size=2),
    "disabled_optimizers": st.lists(st.sampled_from(["ConstantFolding", "MatMulAddFusion", "Nope", ""]), max_size=2),
}


def rehash(manifest: dict, files: dict[str, bytes]) -> None:
    """Make the manifest's entries match the files, so the corruption reaches the parsers."""
    manifest["files"] = {
        name: {"sha256": hashlib.sha256(data).hexdigest(), "size_bytes": len(data)} for name, data in files.items()
    }


@st.composite
def corruptions(draw, good: dict) -> tuple[dict | bytes, dict[str, bytes]]:
    """The good bundle's manifest (parsed) and files, changed in one to three places; or manifest bytes that are not
    JSON of a manifest."""
    manifest, files = json.loads(json.dumps(good["manifest"])), dict(good["files"])
    spec = manifest["info"]["bundle"]
    for _ in range(draw(st.integers(1, 3))):
        kind = draw(st.sampled_from(["spec"] * 4 + ["tensor"] * 2 + ["entry", "file", "file", "manifest"]))
        if kind == "spec":
            key = draw(st.sampled_from(sorted(spec)))
            spec[key] = draw(mostly(PLAUSIBLE.get(key, VALUES), VALUES, tenths=6))
        elif kind == "tensor" and isinstance(spec.get("outputs"), list) and isinstance(spec.get("inputs"), list):
            tensors = [t for t in spec["inputs"] + spec["outputs"] if isinstance(t, dict)]
            if tensors:
                draw(st.sampled_from(tensors))[draw(st.sampled_from(["name", "dtype", "shape"]))] = draw(VALUES)
        elif kind == "entry" and isinstance(manifest.get("files"), dict):
            entry = manifest["files"].pop(draw(st.sampled_from(sorted(good["files"]))), None)
            if draw(st.booleans()) and isinstance(entry, dict):
                entry[draw(st.sampled_from(["sha256", "size_bytes"]))] = draw(VALUES)
            manifest["files"][draw(st.sampled_from(FILE_NAMES))] = entry
        elif kind == "file":
            name = draw(st.sampled_from(sorted(good["files"])))
            data = files[name]
            files[name] = draw(
                st.sampled_from([data[: len(data) // 2], data[1:], b"", b"{}", b"\xff\xfe"]) | st.binary(max_size=64)
            )
            if draw(st.booleans()):
                rehash(manifest, files)
        elif kind == "manifest":
            manifest[draw(st.sampled_from(sorted(good["manifest"])))] = draw(VALUES)
    if draw(st.integers(0, 9)) == 0:
        text = json.dumps(manifest).encode()
        return draw(st.sampled_from([text[: len(text) // 2], b"[]", b"null", b"\xff"]) | st.binary(max_size=20)), files
    return manifest, files


@pytest.fixture(scope="module")
def good(tmp_path_factory) -> dict:
    folder = write_bundle(tmp_path_factory.mktemp("good") / "bundle")
    files = {name: (folder / name).read_bytes() for name in ("model.onnx", "tokenizer.json")}
    return {"manifest": json.loads((folder / "manifest.json").read_text()), "files": files}


def write_folder(folder: Path, manifest: dict | bytes, files: dict[str, bytes]) -> Path:
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir()
    for name, data in files.items():
        (folder / name).write_bytes(data)
    (folder / "manifest.json").write_bytes(manifest if isinstance(manifest, bytes) else json.dumps(manifest).encode())
    return folder


def served_or_rejected(folder: Path) -> None:
    """Load and warm up the bundle in `folder`; `BundleRejected` is the one error allowed."""
    try:
        runtime = load_runtime(folder, settings_for(folder, max_batch_size=2))
    except BundleRejected as err:
        assert str(err)
        return
    try:
        runtime.warm_up()
    except BundleRejected as err:
        assert str(err)
    finally:
        runtime.release()


@settings(FUZZ, max_examples=150)
@given(data=st.data())
def test_a_corrupted_bundle_is_served_or_rejected_with_a_reason(good, tmp_path_factory, data):
    manifest, files = data.draw(corruptions(good))
    served_or_rejected(write_folder(tmp_path_factory.getbasetemp() / "corrupted", manifest, files))


def listed_twice(manifest: dict, name: str) -> None:
    manifest["files"][name] = manifest["files"]["model.onnx"]


REJECTED = {  # cases the fuzzing found, each once an error from deep inside: (change, what the message names)
    "a file listed with a NUL in its name": (lambda m: listed_twice(m, "model\x00.onnx"), "NUL character"),
    "a negative max_length": (lambda m: m["info"]["bundle"].update(max_length=-1), "max_length"),
    "a max_length over 2**64": (lambda m: m["info"]["bundle"].update(max_length=2**64), "max_length"),
    "a max_length of 2**31": (lambda m: m["info"]["bundle"].update(max_length=2**31), "max_length"),
    "no providers": (lambda m: m["info"]["bundle"].update(providers=[]), "providers"),
    "a provider ONNX Runtime has in no build": (lambda m: m["info"]["bundle"].update(providers=["Nope"]), "'Nope'"),
}


@pytest.mark.parametrize("case", REJECTED, ids=list(REJECTED))
def test_a_corrupted_bundle_is_rejected_at_load_naming_the_problem(good, tmp_path, case):
    change, problem = REJECTED[case]
    manifest = json.loads(json.dumps(good["manifest"]))
    change(manifest)
    folder = write_folder(tmp_path / "bundle", manifest, good["files"])
    with pytest.raises(BundleRejected, match=problem):
        load_runtime(folder, settings_for(folder))
