"""Run tritonclient against a server, in its own process, and print what it saw as JSON.

tritonclient's generated `inference.*` messages and the server's own KServe proto cannot share a
process (protobuf refuses a second definition of the same symbols), hence the separate process.

    python triton_probe.py descriptors              # field tables of tritonclient's messages
    python triton_probe.py client '<json request>'  # calls against a running server
"""

import json
import sys

import numpy as np

MESSAGES = (
    "ServerLiveRequest",
    "ServerLiveResponse",
    "ServerReadyRequest",
    "ServerReadyResponse",
    "ModelReadyRequest",
    "ModelReadyResponse",
    "ServerMetadataRequest",
    "ServerMetadataResponse",
    "ModelMetadataRequest",
    "ModelMetadataResponse",
    "InferParameter",
    "InferTensorContents",
    "ModelInferRequest",
    "ModelInferResponse",
    "ModelConfigRequest",
    "ModelConfigResponse",
)
# Triton's model_config.proto messages, of which the server's proto holds a subset of the fields.
CONFIG_MESSAGES = ("ModelConfig", "ModelInput", "ModelOutput", "ModelParameter")


def field_table(descriptor) -> dict:
    table = {}
    for field in descriptor.fields:
        table[field.name] = {
            "number": field.number,
            "type": field.type,
            "repeated": field.is_repeated,
            "message": field.message_type.full_name if field.message_type else None,
            "oneof": field.containing_oneof.name if field.containing_oneof else None,
        }
    for nested in descriptor.nested_types:
        table[nested.name] = field_table(nested)
    return table


def descriptors() -> dict:
    import tritonclient.grpc as client

    file = client.service_pb2.DESCRIPTOR
    service = file.services_by_name["GRPCInferenceService"]
    return {
        "package": file.package,
        "service": service.full_name,
        "methods": {
            m.name: [m.input_type.full_name, m.output_type.full_name, m.client_streaming, m.server_streaming]
            for m in service.methods
        },
        "messages": {name: field_table(file.message_types_by_name[name]) for name in MESSAGES},
        "config_messages": {
            name: field_table(client.model_config_pb2.DESCRIPTOR.message_types_by_name[name])
            for name in CONFIG_MESSAGES
        },
        "data_types": {
            v.name: v.number for v in client.model_config_pb2.DESCRIPTOR.enum_types_by_name["DataType"].values
        },
    }


def error_of(call) -> str | None:
    try:
        call()
    except Exception as err:
        return str(err.status()) if hasattr(err, "status") else repr(err)
    return None


def run_client(args: dict) -> dict:
    import tritonclient.grpc as client_module

    client = client_module.InferenceServerClient(url=args["address"])
    headers = {"authorization": f"Bearer {args['token']}"} if args.get("token") else None
    model = args["model"]
    texts = args["texts"]
    seen = {
        "live": client.is_server_live(headers=headers),
        "ready": client.is_server_ready(headers=headers),
        "model_ready": client.is_model_ready(model, headers=headers),
        "unknown_model_ready": client.is_model_ready("no-such-model", headers=headers),
        "server_metadata": client.get_server_metadata(headers=headers, as_json=True),
        "model_metadata": client.get_model_metadata(model, headers=headers, as_json=True),
        "model_config": client.get_model_config(model, headers=headers, as_json=True),
    }
    text = client_module.InferInput("text", [len(texts)], "BYTES")
    text.set_data_from_numpy(np.array([t.encode("utf-8") for t in texts], dtype=np.object_))
    outputs = [client_module.InferRequestedOutput("logits"), client_module.InferRequestedOutput("probabilities")]
    result = client.infer(model, [text], outputs=outputs, request_id="probe-1", headers=headers, client_timeout=10)
    seen["text"] = {
        "id": result.get_response().id,
        "model_name": result.get_response().model_name,
        "logits": result.as_numpy("logits").tolist(),
        "probabilities": result.as_numpy("probabilities").tolist(),
    }
    ids = np.array(args["input_ids"], dtype=np.int64)
    mask = np.array(args["attention_mask"], dtype=np.int64)
    tokens = []
    for name, value in (("input_ids", ids), ("attention_mask", mask)):
        tensor = client_module.InferInput(name, list(value.shape), "INT64")
        tensor.set_data_from_numpy(value)
        tokens.append(tensor)
    result = client.infer(model, tokens, headers=headers, client_timeout=10)
    seen["tokens"] = {"probabilities": result.as_numpy("probabilities").tolist()}
    top = client_module.InferRequestedOutput("probabilities", class_count=args["class_count"])
    result = client.infer(model, [text], outputs=[top], headers=headers, client_timeout=10)
    seen["classification"] = [[element.decode() for element in row] for row in result.as_numpy("probabilities")]
    seen["unknown_model_error"] = error_of(lambda: client.infer("no-such-model", [text], headers=headers))
    bad = client_module.InferInput("text", [1], "BYTES")
    bad.set_data_from_numpy(np.array([b"\xff\xfe broken"], dtype=np.object_))
    seen["invalid_utf8_error"] = error_of(lambda: client.infer(model, [bad], headers=headers))
    seen["no_token_error"] = error_of(lambda: client.is_server_ready()) if headers else None
    client.close()
    return seen


if __name__ == "__main__":
    mode = sys.argv[1]
    print(json.dumps(descriptors() if mode == "descriptors" else run_client(json.loads(sys.argv[2]))))
