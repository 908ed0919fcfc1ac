"""The served runtime: what of the model's outputs reaches a request."""

from edgedistill.serve.proto import classifier_pb2 as pb
from edgedistill.serve.proto import classifier_pb2_grpc
from onnx import TensorProto, helper

from tests.serve.conftest import settings_for, tiny_model, write_bundle


def test_a_model_with_an_output_per_token_beside_its_logits_classifies_a_request_over_several_batches(
    start_server, tmp_path
):
    model = tiny_model()  # its attention mask as floats, [batch, sequence], an output the spec does not name
    model.graph.output.append(helper.make_tensor_value_info("mask", TensorProto.FLOAT, ["batch", "sequence"]))
    folder = write_bundle(tmp_path / "bundle-extra-output", model=model.SerializeToString())
    server = start_server(settings_for(folder, max_batch_size=1, inline_infer_ms=0))
    texts = ["a good film", "the plot was very boring and the acting was not good"]  # a batch each, padded apart
    with server.channel() as channel:
        reply = classifier_pb2_grpc.ClassifierStub(channel).Classify(pb.ClassifyRequest(texts=texts), timeout=10)
    assert [p.label for p in reply.predictions] == ["positive", "negative"]
