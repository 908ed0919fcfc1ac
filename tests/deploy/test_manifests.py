"""The container and deployment files: schema-valid Kubernetes manifests, probes on the gRPC health
service, a non-root server, tokens from a Secret, a NetworkPolicy, images that install the `serve` extra, and
serving pins equal to pyproject.toml's extras. Pure file checks (no podman).
"""

import ast
import itertools
import json
import re
import shlex
import sys
import tomllib
from importlib import metadata
from pathlib import Path

import kubernetes_validate
import pytest
import yaml
from edgedistill.common.cascade import ServedModels
from edgedistill.serve import workers
from edgedistill.serve.settings import Settings, load_settings
from edgedistill.serve.workers import STOP_MARGIN_S, worker_bytes
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[2]
K8S_FILES = sorted((ROOT / "deploy" / "k8s").glob("*.yaml"))
K8S_VERSION = "1.30"  # the oldest Kubernetes the manifests target; native gRPC probes are GA since 1.27
DOCKERFILES = ["Dockerfile", "Dockerfile.gpu"]
DEPLOY_DOC = ROOT / "docs" / "deploy.md"
# Each image: its ONNX Runtime extra and its pins.
IMAGES = {"Dockerfile": ("cpu", "requirements-serve.txt"), "Dockerfile.gpu": ("gpu", "requirements-serve-gpu.txt")}
RUNTIMES = {"onnxruntime", "onnxruntime-gpu"}  # the `cpu` and `gpu` extras; no other group may carry one
GRPC_PORT, METRICS_PORT, HEALTH_PORT = 50051, 8002, 50052
# the model file of the default recipe's deployed bundle, cnn-small-folded with its fp16 table (docs/benchmarks.md)
DEPLOYED_MODEL_BYTES = 131 << 20
MEMORY_UNITS = {"Gi": 1 << 30, "Mi": 1 << 20, "g": 1 << 30, "m": 1 << 20}
BUNDLE_MOUNT = "/models/bundle"
HEALTHCHECK = ["/opt/venv/bin/python", "-m", "edgedistill.serve.healthcheck"]  # serve/healthcheck.py, in the image
# how long a supervisor waits for a worker to serve before it kills it (the default, which the images keep)
START_TIMEOUT_S = Settings.model_fields["start_timeout_s"].default
FORBIDDEN = {"torch", "transformers"}  # the serving image carries neither
# Imported by the server only for TensorRT engine bundles, which the GPU image serves.
GPU_ONLY = {"tensorrt", "cuda"}


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


# --- Kubernetes -------------------------------------------------------------------------------


def k8s_documents() -> list[tuple[str, dict]]:
    docs = []
    for path in K8S_FILES:
        for doc in yaml.safe_load_all(path.read_text()):
            if doc is not None:
                docs.append((path.name, doc))
    return docs


def only(kind: str) -> dict:
    found = [doc for _, doc in k8s_documents() if doc["kind"] == kind]
    assert len(found) == 1, f"expected one {kind} in deploy/k8s, found {len(found)}"
    return found[0]


def serve_container(deployment: dict) -> dict:
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    return container


@pytest.mark.parametrize(("name", "doc"), k8s_documents(), ids=lambda v: v if isinstance(v, str) else v["kind"])
def test_k8s_manifest_is_schema_valid(name, doc):
    kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


def container_settings(container: dict):
    """The settings of the container's literal `value`s (those from a Secret left out)."""
    return load_settings([], environ={item["name"]: item["value"] for item in container["env"] if "value" in item})


@pytest.mark.parametrize("probe", ["startupProbe", "readinessProbe", "livenessProbe"])
def test_probes_use_the_grpc_health_service(probe):
    spec = serve_container(only("Deployment"))[probe]
    assert spec["grpc"].get("service", "") == "", "the server reports its overall health under the empty name"
    assert not {"httpGet", "tcpSocket", "exec"} & spec.keys()


@pytest.mark.parametrize("probe", ["startupProbe", "readinessProbe", "livenessProbe"])
def test_probes_ask_the_health_port_not_the_call_limited_grpc_port(probe):
    container = serve_container(only("Deployment"))
    assert container[probe]["grpc"]["port"] == container_settings(container).health_port == HEALTH_PORT


def test_deployment_runs_as_non_root_and_locked_down():
    pod = only("Deployment")["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] != 0
    container = serve_container(only("Deployment"))["securityContext"]
    assert container["allowPrivilegeEscalation"] is False
    assert container["readOnlyRootFilesystem"] is True
    assert container["capabilities"]["drop"] == ["ALL"]


def test_deployment_user_matches_the_image():
    pod = only("Deployment")["spec"]["template"]["spec"]
    for dockerfile in DOCKERFILES:
        user = last(instructions(dockerfile), "USER").split(":")[0]
        assert int(user) == pod["securityContext"]["runAsUser"], dockerfile


def test_deployment_ports_resources_and_settings():
    deployment = only("Deployment")
    pod = deployment["spec"]["template"]["spec"]
    container = serve_container(deployment)
    ports = {port["name"]: port["containerPort"] for port in container["ports"]}
    assert ports == {"grpc": GRPC_PORT, "metrics": METRICS_PORT, "health": HEALTH_PORT}
    for kind in ("requests", "limits"):
        assert {"cpu", "memory"} <= container["resources"][kind].keys(), kind
    # a Service named after a setting (edgedistill) would set its variable by its service link, which the server refuses
    assert pod["enableServiceLinks"] is False
    settings = container_settings(container)
    assert settings.threads >= 1, "set EDGEDISTILL_THREADS: ONNX Runtime would size its pool by the node's cores"
    assert settings.metrics_host == "[::]", "set EDGEDISTILL_METRICS_HOST: Prometheus scrapes the pod's address"
    assert "replicas" not in deployment["spec"], "the HorizontalPodAutoscaler owns the replica count"


def memory_bytes(quantity: str) -> int:
    """A Kubernetes (`2Gi`) or compose (`2g`) memory quantity in bytes."""
    number, unit = re.fullmatch(r"(\d+)([A-Za-z]+)", quantity).groups()
    return int(number) * MEMORY_UNITS[unit]


def worst_case_bytes(settings) -> int:
    """What the workers can hold with the deployed bundle: what the server counts per worker (`worker_bytes`: its
    models and the calls clients can stall mid-message, docs/serving.md, slow clients)."""
    return settings.workers * worker_bytes(DEPLOYED_MODEL_BYTES, settings)


def test_the_deployments_memory_limit_holds_its_workers_and_their_stalled_calls():
    container = serve_container(only("Deployment"))
    limit = memory_bytes(container["resources"]["limits"]["memory"])
    assert limit >= worst_case_bytes(container_settings(container))


def test_termination_grace_covers_the_drain():
    pod = only("Deployment")["spec"]["template"]["spec"]
    container = serve_container(only("Deployment"))
    drain = container_settings(container).shutdown_grace_s
    command = container["lifecycle"]["preStop"]["exec"]["command"]
    assert command[0] == "sleep"
    assert pod["terminationGracePeriodSeconds"] > float(command[1]) + drain + STOP_MARGIN_S


def test_the_pods_spread_over_the_nodes():
    deployment = only("Deployment")
    (spread,) = deployment["spec"]["template"]["spec"]["topologySpreadConstraints"]
    assert spread["topologyKey"] == "kubernetes.io/hostname"
    assert spread["maxSkew"] == 1
    assert spread["whenUnsatisfiable"] == "ScheduleAnyway", "a soft rule: a cluster of one node still runs every pod"
    assert spread["labelSelector"] == {"matchLabels": deployment["spec"]["selector"]["matchLabels"]}
    assert (
        spread["labelSelector"]["matchLabels"].items() <= deployment["spec"]["template"]["metadata"]["labels"].items()
    )


def uncommented(text: str) -> str:
    """`text` with its commented-out YAML list items (`# - name: ...` and the `#   key: ...` lines below them, at the
    same indentation) made live, as a reader uncommenting them would."""
    lines, indent = [], None
    for line in text.splitlines():
        item = re.fullmatch(r"(\s*)# (- .*)", line)
        if item:
            indent = item[1]
            lines.append(indent + item[2])
        elif indent is not None and re.fullmatch(rf"{indent}#   \s*\S.*", line):
            lines.append(indent + line[len(indent) + 2 :])
        else:
            indent = None
            lines.append(line)
    return "\n".join(lines) + "\n"


def tls_deployment() -> dict:
    """deploy/k8s/deployment.yaml with its commented-out TLS stanza turned on."""
    (deployment,) = [
        doc for doc in yaml.safe_load_all(uncommented((ROOT / "deploy/k8s/deployment.yaml").read_text())) if doc
    ]
    return deployment


def test_the_deployments_tls_stanza_is_schema_valid():
    kubernetes_validate.validate(tls_deployment(), K8S_VERSION, strict=True)


def test_the_deployments_tls_stanza_reads_its_certificate_and_key_from_a_secret_mounted_read_only():
    deployment = tls_deployment()
    container = serve_container(deployment)
    settings = container_settings(container)
    assert settings.tls_cert is not None and settings.tls_key is not None, "EDGEDISTILL_TLS_CERT and _TLS_KEY"
    volumes = {volume["name"]: volume for volume in deployment["spec"]["template"]["spec"]["volumes"]}
    for path, key in ((settings.tls_cert, "tls.crt"), (settings.tls_key, "tls.key")):  # a `kubernetes.io/tls` Secret's
        (mount,) = [m for m in container["volumeMounts"] if path.parent == Path(m["mountPath"])]
        assert mount["readOnly"] is True
        assert "secretName" in volumes[mount["name"]]["secret"]
        assert path.name == key


def grpc_app_protocols() -> set[str]:
    """The appProtocol of the Services' grpc ports: the protocol a gateway or mesh that reads it speaks to the pods."""
    services = [doc for _, doc in k8s_documents() if doc["kind"] == "Service"]
    return {
        port["appProtocol"]
        for s in services
        for port in s["spec"]["ports"]
        if port["name"] == "grpc" and "appProtocol" in port
    }


def deployment_tls_comment() -> str:
    """The Deployment's comment on turning TLS on (the lines above its commented-out EDGEDISTILL_TLS_CERT), one line."""
    lines = (ROOT / "deploy/k8s/deployment.yaml").read_text().splitlines()
    end = next(i for i, line in enumerate(lines) if line.strip() == "# - name: EDGEDISTILL_TLS_CERT")
    start = end
    while lines[start - 1].lstrip().startswith("#"):
        start -= 1
    return " ".join(line.strip().removeprefix("#").strip() for line in lines[start:end])


def docs_tls_paragraph() -> str:
    """docs/deploy.md's paragraph on turning the manifests' TLS on, one line."""
    (paragraph,) = [p for p in DEPLOY_DOC.read_text().split("\n\n") if "edgedistill-serve-tls" in p]
    return " ".join(paragraph.split())


@pytest.mark.parametrize(
    "instructions", [deployment_tls_comment, docs_tls_paragraph], ids=["deployment.yaml", "docs/deploy.md"]
)
def test_the_tls_instructions_name_the_services_app_protocol_to_change(instructions):
    text = instructions()
    assert [protocol for protocol in grpc_app_protocols() if f"appProtocol: {protocol}" not in text] == []


def test_a_workers_start_timeout_is_the_startup_probes_budget():
    container = serve_container(only("Deployment"))
    probe = container["startupProbe"]
    assert container_settings(container).start_timeout_s == probe["periodSeconds"] * probe["failureThreshold"]


def test_services_expose_grpc_and_metrics():
    deployment = only("Deployment")
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    container_ports = {port["name"] for port in serve_container(deployment)["ports"]}
    services = [doc for _, doc in k8s_documents() if doc["kind"] == "Service"]
    assert services
    for service in services:
        assert service["spec"]["selector"].items() <= pod_labels.items(), service["metadata"]["name"]
        for port in service["spec"]["ports"]:
            assert port["targetPort"] in container_ports
    main = next(s for s in services if s["metadata"]["name"] == deployment["metadata"]["name"])
    assert {(p["name"], p["port"]) for p in main["spec"]["ports"]} == {("grpc", GRPC_PORT), ("metrics", METRICS_PORT)}


@pytest.mark.parametrize(
    ("variable", "key"), [("EDGEDISTILL_TOKEN", "token"), ("EDGEDISTILL_ADMIN_TOKEN", "admin-token")]
)
def test_tokens_come_from_a_secret(variable, key):
    (item,) = [item for item in serve_container(only("Deployment"))["env"] if item["name"] == variable]
    assert item["valueFrom"]["secretKeyRef"]["key"] == key


def test_network_policy_selects_the_servers_pods():
    pod_labels = only("Deployment")["spec"]["template"]["metadata"]["labels"]
    assert only("NetworkPolicy")["spec"]["podSelector"]["matchLabels"].items() <= pod_labels.items()


def test_network_policy_lets_the_server_open_no_connection():
    spec = only("NetworkPolicy")["spec"]
    assert "Egress" in spec["policyTypes"]
    assert not spec.get("egress"), "no destination admitted"


def test_network_policy_admits_grpc_from_anywhere_and_metrics_from_monitoring_only():
    rules = only("NetworkPolicy")["spec"]["ingress"]
    admitted = {port["port"]: rule.get("from") for rule in rules for port in rule["ports"]}
    monitoring = [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}]
    assert admitted == {"grpc": None, "metrics": monitoring}, "the health port: the node's kubelet only"


def test_hpa_scales_the_deployment_on_cpu():
    hpa = only("HorizontalPodAutoscaler")
    deployment = only("Deployment")
    assert hpa["apiVersion"] == "autoscaling/v2"
    assert hpa["spec"]["scaleTargetRef"] == {
        "apiVersion": deployment["apiVersion"],
        "kind": "Deployment",
        "name": deployment["metadata"]["name"],
    }
    assert 1 <= hpa["spec"]["minReplicas"] <= hpa["spec"]["maxReplicas"]
    (metric,) = hpa["spec"]["metrics"]
    assert metric["type"] == "Resource"
    assert metric["resource"]["name"] == "cpu"
    assert metric["resource"]["target"]["type"] == "Utilization"


# --- docker compose ---------------------------------------------------------------------------


COMPOSE_VARIABLE = re.compile(r"\$\{(\w+)(?::-([^}]*))?\}")  # ${NAME} and ${NAME:-default}, as compose reads them


def compose_text() -> str:
    return (ROOT / "docker-compose.yml").read_text()


def compose_service(shell: dict[str, str] | None = None) -> dict:
    """The `serve` service as compose runs it from a shell with the variables `shell` (none by default): `${NAME:-x}`
    is the shell's NAME where set and not empty, else x."""
    text = COMPOSE_VARIABLE.sub(lambda m: (shell or {}).get(m[1]) or m[2] or "", compose_text())
    return yaml.safe_load(text)["services"]["serve"]


def compose_settings(service: dict):
    # a key without a value passes the shell's variable, and none where the shell has none
    return load_settings([], environ={k: str(v) for k, v in service["environment"].items() if v is not None})


def small_box_shell() -> dict[str, str]:
    """The shell variables docs/deploy.md's small edge boxes give `docker compose up`."""
    (command,) = re.findall(r"`((?:[A-Z_]+=\S+ )+)docker compose up`", DEPLOY_DOC.read_text())
    return dict(word.split("=", 1) for word in command.split())


def compose_workers(service: dict, monkeypatch) -> int:
    """The workers the compose service's server runs in its container's limits, with the deployed bundle: whole CPUs of
    the quota (at least one), as many as its memory holds (`serve/workers.py` worker_count)."""
    limits = service["deploy"]["resources"]["limits"]
    monkeypatch.setattr(workers, "usable_cores", lambda: max(1, int(float(limits["cpus"]))))
    monkeypatch.setattr(workers, "usable_memory", lambda: memory_bytes(limits["memory"]))
    return workers.worker_count(compose_settings(service), ServedModels(DEPLOYED_MODEL_BYTES))


@pytest.mark.parametrize(
    "shell",
    [{}, small_box_shell(), {"SERVE_CPUS": "2", "SERVE_MEMORY": "1g"}],
    ids=["defaults", "small box", "2 cpus 1g"],
)
def test_the_compose_memory_limit_holds_its_workers_and_their_stalled_calls(shell, monkeypatch):
    service = compose_service(shell)
    settings = compose_settings(service).model_copy(update={"workers": compose_workers(service, monkeypatch)})
    limit = memory_bytes(service["deploy"]["resources"]["limits"]["memory"])
    assert limit >= worst_case_bytes(settings)


def test_the_compose_limits_are_two_cpus_and_2_gib_unless_the_shell_says_otherwise():
    assert compose_service()["deploy"]["resources"]["limits"] == {"cpus": "2", "memory": "2g"}
    small = small_box_shell()
    limits = compose_service(small)["deploy"]["resources"]["limits"]
    assert limits == {"cpus": small["SERVE_CPUS"], "memory": small["SERVE_MEMORY"]}, "docs/deploy.md's small box"


def test_the_compose_workers_follow_its_cpu_limit(monkeypatch):
    assert compose_settings(compose_service()).workers == 0, "0: as many as the container's limits hold"
    assert compose_workers(compose_service(), monkeypatch) == 2
    assert compose_workers(compose_service({"SERVE_CPUS": "1"}), monkeypatch) == 1, "a worker per CPU of the limit"


@pytest.mark.parametrize(
    "shell", [{}, {"SERVE_CPUS": "2", "SERVE_MEMORY": "1g"}, {"SERVE_CPUS": "4", "SERVE_MEMORY": "2g"}]
)
def test_the_compose_workers_threads_use_every_cpu_of_its_limit(shell, monkeypatch):
    service = compose_service(shell)
    count = compose_workers(service, monkeypatch)
    monkeypatch.setattr(workers, "affinity_cores", lambda: 64)  # the host's cores, above the container's quota
    threads = workers.intra_op_threads(compose_settings(service).threads, count)
    assert count * threads == int(float(service["deploy"]["resources"]["limits"]["cpus"]))


def test_the_compose_files_shell_variables_are_none_of_the_servers():
    """An EDGEDISTILL_* variable that is no setting stops the server (and the pipeline) where that shell runs them."""
    known = {f"EDGEDISTILL_{name.upper()}" for name in Settings.model_fields}
    for name, _ in COMPOSE_VARIABLE.findall(compose_text()):
        assert not name.startswith("EDGEDISTILL_") or name in known, name


def test_compose_ports_on_loopback():
    published = {}
    for entry in compose_service()["ports"]:
        host_ip, host_port, container_port = entry.split(":")
        assert host_ip == "127.0.0.1", entry
        published[int(container_port)] = int(host_port)
    assert published.keys() == {GRPC_PORT, METRICS_PORT}


def test_compose_environment_and_bundle_volume():
    service = compose_service()
    # a key without a value passes the shell's variable, and none where the shell has none
    settings = load_settings([], environ={k: v for k, v in service["environment"].items() if v is not None})
    assert str(settings.bundle) == BUNDLE_MOUNT
    assert settings.metrics_host == "[::]", "the published metrics port reaches the container's interface"
    assert settings.health_port == HEALTH_PORT, "the healthcheck's port, which the call limit cannot refuse"
    (volume,) = service["volumes"]
    assert volume["target"] == BUNDLE_MOUNT
    assert volume["read_only"] is True
    grace = re.fullmatch(r"(\d+)s", service["stop_grace_period"])
    assert grace, service["stop_grace_period"]
    assert int(grace[1]) > settings.shutdown_grace_s + STOP_MARGIN_S, "SIGKILL would cut the drain short"


@pytest.mark.parametrize("variable", ["EDGEDISTILL_TOKEN", "EDGEDISTILL_ADMIN_TOKEN"])
def test_compose_passes_tokens_from_the_shell_and_leaves_them_unset_without_one(variable):
    assert (variable, None) in compose_service()["environment"].items(), (
        "a key without a value: the shell's variable, or unset"
    )


def test_compose_healthcheck_runs_the_servers_health_check():
    assert compose_service()["healthcheck"]["test"] == ["CMD", *HEALTHCHECK]


def test_compose_health_check_waits_as_long_as_the_supervisor_for_a_worker_to_serve():
    period = re.fullmatch(r"(\d+)s", compose_service()["healthcheck"]["start_period"])
    assert int(period[1]) >= START_TIMEOUT_S, "unhealthy before the supervisor gives up on a slow start"


def test_compose_bounds_the_logs_the_engine_keeps():
    options = compose_service()["logging"]["options"]
    assert options["max-size"] == "10m"
    assert options["max-file"] == "3"


# --- Dockerfiles ------------------------------------------------------------------------------


def instructions(dockerfile: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) in order, continuation lines joined, comments dropped."""
    joined, current = [], ""
    for line in (ROOT / dockerfile).read_text().splitlines():
        if not current and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if line.rstrip().endswith("\\"):
            current += line.rstrip()[:-1] + " "
            continue
        joined.append(current + line)
        current = ""
    result = []
    for line in joined:
        keyword, _, rest = line.strip().partition(" ")
        result.append((keyword.upper(), rest.strip()))
    return result


def health_command(dockerfile: str) -> list[str]:
    """The command of the Dockerfile's HEALTHCHECK, in its exec form."""
    health = last(instructions(dockerfile), "HEALTHCHECK")
    return json.loads(health[health.index("CMD ") + len("CMD ") :])


def image_env(dockerfile: str) -> dict[str, str]:
    """The variables the Dockerfile's ENV instructions set."""
    return dict(
        pair.split("=", 1) for word, rest in instructions(dockerfile) if word == "ENV" for pair in shlex.split(rest)
    )


def last(items: list[tuple[str, str]], keyword: str) -> str:
    values = [rest for word, rest in items if word == keyword]
    assert values, f"no {keyword}"
    return values[-1]


@pytest.mark.parametrize("dockerfile", DOCKERFILES)
def test_dockerfile_base_is_a_build_argument(dockerfile):
    items = instructions(dockerfile)
    assert items[0][0] == "ARG", "the first line must be ARG BASE=..."
    assert items[0][1].startswith("BASE="), "the first line must be ARG BASE=..."
    froms = [rest.split()[0] for word, rest in items if word == "FROM"]
    assert froms[0] == "${BASE}"
    assert "${BASE}" in froms[1:], "the final stages must start from BASE too"


def stages(dockerfile: str) -> dict[str, list[tuple[str, str]]]:
    """Each named stage's instructions after its FROM."""
    named: dict[str, list[tuple[str, str]]] = {}
    current: list[tuple[str, str]] = []
    for word, rest in instructions(dockerfile):
        if word == "FROM":
            current = named.setdefault(rest.split()[-1], []) if " AS " in rest.upper() else []
        else:
            current.append((word, rest))
    return named


@pytest.mark.parametrize("dockerfile", DOCKERFILES)
def test_a_baked_bundle_is_made_readable_to_all_before_the_image_takes_it(dockerfile):
    assert ("RUN", "chmod -R a+rX,go-w /models/bundle") in stages(dockerfile)["bundle"]


@pytest.mark.parametrize("dockerfile", DOCKERFILES)
def test_the_baked_image_takes_its_bundle_from_the_stage_that_made_it_readable(dockerfile):
    assert stages(dockerfile)["baked"] == [("COPY", "--from=bundle /models/bundle /models/bundle")]


@pytest.mark.parametrize("dockerfile", DOCKERFILES)
def test_dockerfile_runs_the_server_as_non_root(dockerfile):
    user = last(instructions(dockerfile), "USER").split(":")[0]
    assert user not in ("root", "0")
    assert user.isdigit(), "a numeric USER lets runAsNonRoot verify it"


@pytest.mark.parametrize("dockerfile", DOCKERFILES)
def test_dockerfile_ports_entrypoint_health_and_bundle(dockerfile):
    items = instructions(dockerfile)
    exposed = {int(port.split("/")[0]) for port in last(items, "EXPOSE").split()}
    assert {GRPC_PORT, METRICS_PORT} <= exposed
    assert json.loads(last(items, "ENTRYPOINT")) == ["/opt/venv/bin/python", "-m", "edgedistill.serve"]
    assert health_command(dockerfile) == HEALTHCHECK
    env = image_env(dockerfile)
    settings = load_settings(
        [], environ={name: value for name, value in env.items() if name.startswith("EDGEDISTILL_")}
    )
    assert str(settings.bundle) == BUNDLE_MOUNT


@pytest.mark.parametrize("dockerfile", DOCKERFILES)
def test_dockerfile_health_check_asks_a_health_port_of_its_own(dockerfile):
    env = image_env(dockerfile)
    health_port = load_settings([], environ={"EDGEDISTILL_HEALTH_PORT": env["EDGEDISTILL_HEALTH_PORT"]}).health_port
    assert health_port == HEALTH_PORT


@pytest.mark.parametrize("dockerfile", DOCKERFILES)
def test_dockerfile_health_check_waits_as_long_as_the_supervisor_for_a_worker_to_serve(dockerfile):
    period = re.search(r"--start-period=(\d+)s\b", last(instructions(dockerfile), "HEALTHCHECK"))
    assert int(period[1]) >= START_TIMEOUT_S, "unhealthy before the supervisor gives up on a slow start"


@pytest.mark.parametrize("dockerfile", DOCKERFILES)
def test_dockerfile_exposes_the_health_port(dockerfile):
    exposed = {int(port.split("/")[0]) for port in last(instructions(dockerfile), "EXPOSE").split()}
    assert HEALTH_PORT in exposed


def test_the_gpu_image_runs_a_set_number_of_workers():
    workers = load_settings([], environ={"EDGEDISTILL_WORKERS": image_env("Dockerfile.gpu")["EDGEDISTILL_WORKERS"]})
    assert workers.workers >= 1, "WORKERS=0 counts host cores and memory, not the GPU's: a CUDA context per worker"


def paragraphs(path: str) -> list[str]:
    """A Dockerfile's comment blocks, a page's paragraphs."""
    text = (ROOT / path).read_text()
    if path.endswith(".md"):
        return text.split("\n\n")
    grouped = itertools.groupby(text.splitlines(), key=lambda line: line.startswith("#"))
    return ["\n".join(lines) for comment, lines in grouped if comment]


@pytest.mark.parametrize("path", ["Dockerfile.gpu", "docs/deploy.md", "docs/serving.md"])
def test_more_workers_on_one_gpu_are_given_the_time_to_build_their_engines(path):
    """More workers on one GPU share one engine cache, and each builds the TensorRT engines it lacks before it serves:
    the first time, minutes, past the supervisor's START_TIMEOUT_S, which kills it, and the container starts again."""
    advice = [paragraph for paragraph in paragraphs(path) if "-e EDGEDISTILL_WORKERS=N" in paragraph]
    assert advice, f"{path} no longer says how to run more workers on one GPU"
    for paragraph in advice:
        timeout = re.search(r"-e EDGEDISTILL_START_TIMEOUT_S=(\d+)", paragraph)
        assert timeout, f"{path}: more workers with the default START_TIMEOUT_S restart while they build their engines"
        assert float(timeout[1]) > START_TIMEOUT_S
        assert load_settings([], environ={"EDGEDISTILL_WORKERS": "2", "EDGEDISTILL_START_TIMEOUT_S": timeout[1]})
        assert re.search(r"one (TensorRT )?engine cache", " ".join(paragraph.split())), "the workers share one cache"


def test_the_gpu_image_makes_its_engine_cache_owned_by_its_user():
    uid, gid = last(instructions("Dockerfile.gpu"), "USER").split(":")
    made = ["install", "-d", "--owner", uid, "--group", gid, image_env("Dockerfile.gpu")["EDGEDISTILL_TRT_CACHE"]]
    commands = [
        shlex.split(command)
        for word, rest in instructions("Dockerfile.gpu")
        if word == "RUN"
        for command in rest.split("&&")
    ]
    assert made in commands, "a new named volume at EDGEDISTILL_TRT_CACHE takes the owner of the image's folder"


def pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def build_stage(dockerfile: str) -> list[tuple[str, str]]:
    """The instructions of the `builder` stage."""
    items = instructions(dockerfile)
    start = next(i for i, (word, rest) in enumerate(items) if word == "FROM" and rest.endswith(" AS builder"))
    end = next(i for i, (word, _) in enumerate(items[start + 1 :], start + 1) if word == "FROM")
    return items[start:end]


@pytest.mark.parametrize("dockerfile", DOCKERFILES)
def test_dockerfile_copies_the_project_sources_and_pins(dockerfile):
    sources = {part for word, rest in build_stage(dockerfile) if word == "COPY" for part in rest.split()[:-1]}
    package_dirs = {folder.split("/")[0] for folder in pyproject()["tool"]["setuptools"]["package-dir"].values()}
    project_files = {"pyproject.toml", "README.md", "LICENSE", IMAGES[dockerfile][1]}  # LICENSE: the wheel's licence
    assert sources == {f"{folder}/" for folder in package_dirs} | project_files


@pytest.mark.parametrize("dockerfile", DOCKERFILES)
def test_the_build_context_lets_in_every_source_the_dockerfile_copies(dockerfile):
    allowed = {line[1:] for line in (ROOT / ".dockerignore").read_text().splitlines() if line.startswith("!")}
    sources = {part for word, rest in build_stage(dockerfile) if word == "COPY" for part in rest.split()[:-1]}
    assert sources <= allowed, f".dockerignore leaves out {sorted(sources - allowed)}"


@pytest.mark.parametrize("dockerfile", DOCKERFILES)
def test_dockerfile_installs_the_serve_extra_under_the_serving_pins(dockerfile):
    extra, requirements = IMAGES[dockerfile]
    runs = " ".join(rest for word, rest in build_stage(dockerfile) if word == "RUN")
    assert re.search(rf"pip install [^&]*--constraint /tmp/{re.escape(requirements)} '/src\[serve,{extra}\]'", runs)


@pytest.mark.parametrize("dockerfile", DOCKERFILES)
def test_dockerfile_runtime_takes_only_the_virtual_environment(dockerfile):
    items = instructions(dockerfile)
    copied = [rest for word, rest in items if word == "COPY" and rest.startswith("--from=builder")]
    assert copied == ["--from=builder /opt/venv /opt/venv"]
    env = " ".join(rest for word, rest in items if word == "ENV")
    assert "PYTHONPATH" not in env, "the server runs from the installed package, not from copied sources"


# --- requirements -----------------------------------------------------------------------------


def pins(filename: str, index_options: bool = False) -> dict[str, str]:
    """{canonical name: version} of a requirements file; every line must be an exact `==` pin
    (or, with `index_options`, an --extra-index-url)."""
    found = {}
    for line in (ROOT / filename).read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if not line or (index_options and line.startswith("--extra-index-url ")):
            continue
        match = re.fullmatch(r"([A-Za-z0-9][A-Za-z0-9._-]*)==([A-Za-z0-9.+!-]+)", line)
        assert match, f"{filename}: {line!r} is not an exact `name==version` pin"
        found[canonical(match[1])] = match[2]
    return found


def requirements(group: str) -> list[Requirement]:
    """The requirements of pyproject.toml's `group` ("" for the base dependencies), as written."""
    project = pyproject()["project"]
    return [Requirement(r) for r in (project["optional-dependencies"][group] if group else project["dependencies"])]


def installed_with(*extras: str) -> dict[str, Requirement]:
    """{canonical name: requirement} that installing the project with `extras` asks for, the project's
    own `edgedistill[...]` references expanded."""
    found, todo, seen = {}, ["", *extras], set()
    while todo:
        group = todo.pop()
        if group in seen:
            continue
        seen.add(group)
        for requirement in requirements(group):
            if canonical(requirement.name) == "edgedistill":
                todo += requirement.extras
            else:
                found[canonical(requirement.name)] = requirement
    return found


def exact(requirement: Requirement) -> str:
    (spec,) = requirement.specifier
    assert spec.operator == "==", f"pyproject.toml pins {requirement} loosely"
    return spec.version


def extras() -> list[str]:
    return list(pyproject()["project"]["optional-dependencies"])


@pytest.mark.parametrize("filename", ["requirements-serve.txt", "requirements-serve-gpu.txt"])
def test_serving_requirements_carry_no_torch(filename):
    assert not FORBIDDEN & pins(filename, index_options=filename.endswith("gpu.txt")).keys()


@pytest.mark.parametrize(("extra", "filename"), IMAGES.values())
def test_serving_requirements_are_the_serve_extra_with_its_runtime(extra, filename):
    expected = {name: exact(requirement) for name, requirement in installed_with("serve", extra).items()}
    assert pins(filename, index_options=True) == expected


def test_serve_extra_carries_no_torch():
    assert not FORBIDDEN & installed_with("serve").keys()


@pytest.mark.parametrize("extra", sorted(set(extras()) - {"cpu", "gpu"}))
def test_extra_leaves_onnx_runtime_to_cpu_or_gpu(extra):
    assert not RUNTIMES & installed_with(extra).keys(), (
        "onnxruntime and onnxruntime-gpu must never share an environment"
    )


def test_pyproject_pins_each_package_exactly_and_once():
    versions = {}
    for group in ["", *extras()]:
        for requirement in requirements(group):
            if canonical(requirement.name) != "edgedistill":
                versions.setdefault(canonical(requirement.name), set()).add(exact(requirement))
    assert {name: found for name, found in versions.items() if len(found) > 1} == {}


def module_file(name: str) -> Path | None:
    """The project file of module `name` (`edgedistill.serve.app` -> serve/app.py), None for a third-party one."""
    top, *rest = name.split(".")
    if top != "edgedistill":
        return None
    path = ROOT.joinpath(*rest) if rest else ROOT / top
    for candidate in (path.with_suffix(".py"), path / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def server_imports() -> tuple[set[str], set[str]]:
    """(project modules, top-level third-party modules) that `python -m edgedistill.serve` can import, lazily included."""
    seen, third_party, todo = set(), set(), ["edgedistill.serve.__main__"]
    while todo:
        name = todo.pop()
        path = module_file(name)
        if name in seen or path is None:
            continue
        seen.add(name)
        parts = name.split(".")
        todo += [".".join(parts[:i]) for i in range(1, len(parts))]  # parent packages run first
        package = parts if path.name == "__init__.py" else parts[:-1]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = ".".join(package[: len(package) - node.level + 1] + ([node.module] if node.module else []))
                else:
                    base = node.module
                targets = [base] + [f"{base}.{alias.name}" for alias in node.names]
            else:
                continue
            for target in targets:
                if module_file(target) is not None:
                    todo.append(target)
                elif target.split(".")[0] != "edgedistill":
                    third_party.add(target.split(".")[0])
    return seen, third_party


SERVER_CORE = ("serve.app", "serve.backend", "common.runtime", "common.bundle", "common.manifest")


def test_cpu_requirements_cover_what_the_server_imports():
    modules, imported = server_imports()
    assert {f"edgedistill.{name}" for name in SERVER_CORE} <= modules
    third_party = imported - set(sys.stdlib_module_names) - GPU_ONLY
    distributions = metadata.packages_distributions()
    pinned = pins("requirements-serve.txt").keys()
    for module in sorted(third_party):
        providers = {canonical(name) for name in distributions.get(module, [])}
        assert providers & pinned, f"the server imports {module}, which requirements-serve.txt does not install"
    assert not FORBIDDEN & imported, "the server must not import torch or transformers"
