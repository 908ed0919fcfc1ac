"""`python deploy/classify_once.py ADDRESS`: classify one text with the server at ADDRESS (a text and its pair where the
served model takes pairs, as its GetModelInfo says) and print the predicted label; exit 1 when the call fails or
the reply has no label. The container and wheel tests' call, so that they pass on a bundle of either kind."""

import sys

import grpc
from edgedistill.serve.client import Client, LabelsUnavailable

TEXT, PAIR = "a gripping , beautifully acted film", "the acting is superb"

with Client(sys.argv[1], timeout=30) as client:
    try:
        pairs = [PAIR] if "text_pair" in client.model_info()["text_inputs"] else None
        reply = client.classify([TEXT], pairs)
    except grpc.RpcError as err:
        sys.exit(f"Classify failed: {err.code().name}: {err.details()}")
    except LabelsUnavailable as err:
        sys.exit(f"Classify answered, but its labels cannot be read: {err}")
label = reply["predictions"][0]["label"]
if not (isinstance(label, str) and label):
    sys.exit(f"the reply has no label: {reply}")
print(label)
