"""Scenarios against the edgedistill server; the plan ($EDGEDISTILL_LOADTEST_PLAN) sets their weights, pacing and shape.

- single: `Classify` with one text;
- batch: `Classify` with `batch_size` texts;
- stream: one `ClassifyStream` call of `stream_messages` one-text requests;
- kserve: KServe v2 `ModelInfer` with a BYTES `text` input of one text.

Texts are drawn at random from the plan's texts file (the recipe's dev split unless overridden); for a
pair model each comes with its pair (`text_pairs`, or a BYTES `text_pair` input).
Run it through `python -m loadtests RECIPE --profile NAME`, which writes the plan and starts the server.
"""

import random
import sys

from edgedistill.common.text import read_texts
from edgedistill.loadtests import plan
from edgedistill.loadtests.grpc_user import GrpcUser
from edgedistill.loadtests.pacing import PacedUser
from edgedistill.loadtests.recorder import Recorder
from edgedistill.loadtests.shapes import SHAPES
from edgedistill.serve import tensors
from edgedistill.serve.call import environ_token
from edgedistill.serve.client import bearer
from edgedistill.serve.proto import classifier_pb2, classifier_pb2_grpc, kserve_pb2, kserve_pb2_grpc
from edgedistill.serve.textfiles import UsageError
from locust import events

PLAN = plan.current()
TEXTS = read_texts(PLAN.texts)
PAIRS = None if PLAN.pairs is None else read_texts(PLAN.pairs)
Shape = SHAPES[PLAN.profile]  # the one shape class locust finds in this module
try:  # the server's TOKEN, from the variable it reads; one set but blank is refused before any load, as they refuse it
    TOKEN = environ_token(reload=False)
except UsageError as err:
    sys.exit(f"locustfile: {err}")


@events.init.add_listener
def record(environment, **_kwargs):
    Recorder(PLAN.samples).attach(environment.events)


def classify_request(count: int) -> classifier_pb2.ClassifyRequest:
    """`count` texts drawn at random, with their pairs for a pair model."""
    drawn = random.choices(range(len(TEXTS)), k=count)
    pairs = [] if PAIRS is None else [PAIRS[i] for i in drawn]
    return classifier_pb2.ClassifyRequest(texts=[TEXTS[i] for i in drawn], text_pairs=pairs)


def single(user: "ClassifierUser") -> None:
    user.call(user.classifier.Classify, classify_request(1), "Classify")


def batch(user: "ClassifierUser") -> None:
    size = PLAN.loadtest.batch_size
    user.call(user.classifier.Classify, classify_request(size), f"Classify x{size}")


def stream(user: "ClassifierUser") -> None:
    count = PLAN.loadtest.stream_messages
    requests = [classify_request(1) for _ in range(count)]
    user.stream(user.classifier.ClassifyStream, requests, f"ClassifyStream x{count}")


def kserve(user: "ClassifierUser") -> None:
    drawn = classify_request(1)
    request = kserve_pb2.ModelInferRequest(model_name=PLAN.model)
    for name, values in (("text", drawn.texts), ("text_pair", drawn.text_pairs)):
        if values:
            request.inputs.add(name=name, datatype="BYTES", shape=[1])
            request.raw_input_contents.append(tensors.serialize_bytes([values[0].encode("utf-8")]))
    user.call(user.kserve.ModelInfer, request, "ModelInfer")


SCENARIOS = {"single": single, "batch": batch, "stream": stream, "kserve": kserve}


class ClassifierUser(PacedUser, GrpcUser):
    """Runs the plan's scenarios by weight, each user paced at the profile's calls/s per user from its first call to
    the end of the plan's schedule."""

    tasks = {SCENARIOS[name]: weight for name, weight in PLAN.scenarios.items() if weight}
    user_rate = PLAN.settings.user_rate
    schedule_s = PLAN.duration_s
    timeout = PLAN.loadtest.timeout_s
    metadata = bearer(TOKEN)

    def on_start(self):
        self.classifier = classifier_pb2_grpc.ClassifierStub(self.channel)
        self.kserve = kserve_pb2_grpc.GRPCInferenceServiceStub(self.channel)
        super().on_start()
