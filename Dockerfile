# The serving image (CPU): edgedistill installed with its `serve` and `cpu` extras (ONNX Runtime), no torch.
#
#   docker build -t edgedistill-serve .                      # the bundle is mounted at /models/bundle
#   docker run --stop-timeout 25 -p 50051:50051 -v "$PWD/runs/sst2/bundle-cnn-small-folded:/models/bundle:ro" edgedistill-serve
#   docker build --target baked --build-arg BUNDLE=runs/sst2/bundle-cnn-small-folded \
#       -t edgedistill-serve:bundle-cnn-small-folded-VERSION .    # baked in; VERSION: its content version
#
# Without a registry, build FROM the local base that deploy/base-image.sh makes:
#   podman build --isolation chroot --format docker --build-arg BASE=localhost/edgedistill-base:bookworm .
# Debian bookworm's python3 is 3.11, which the code needs (datetime.UTC).
ARG BASE=debian:bookworm-slim

FROM ${BASE} AS builder
RUN apt-get update \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends python3 python3-venv \
    && apt-get clean \
    && rm -rf /var/lib/apt/lists/*
# The project's sources as pyproject.toml lays them out: pip builds its wheel and installs it with the
# `serve,cpu` extras, under the serving pins of requirements-serve.txt (equal to those extras).
COPY pyproject.toml README.md LICENSE /src/
COPY edgedistill/ /src/edgedistill/
COPY common/ /src/common/
COPY distill/ /src/distill/
COPY export/ /src/export/
COPY serve/ /src/serve/
COPY bench/ /src/bench/
COPY loadtests/ /src/loadtests/
COPY report/ /src/report/
COPY recipes/ /src/recipes/
COPY docs/ /src/docs/
COPY requirements-serve.txt /tmp/requirements-serve.txt
# Behind a TLS-intercepting proxy, pass its CA bundle as a build secret (never stored in a layer):
#   --secret id=pip-cert,src=/etc/ssl/certs/ca-certificates.crt
RUN --mount=type=secret,id=pip-cert \
    python3 -m venv /opt/venv \
    && if [ -s /run/secrets/pip-cert ]; then export PIP_CERT=/run/secrets/pip-cert; fi \
    && /opt/venv/bin/pip install --no-cache-dir --disable-pip-version-check \
        --constraint /tmp/requirements-serve.txt '/src[serve,cpu]' \
    && /opt/venv/bin/python -m pip uninstall --quiet --yes pip setuptools

FROM ${BASE} AS runtime
RUN apt-get update \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends python3 \
    && apt-get clean \
    && rm -rf /var/lib/apt/lists/* \
    && groupadd --system --gid 10001 edgedistill \
    && useradd --system --uid 10001 --gid 10001 --no-create-home --home-dir /nonexistent \
        --shell /usr/sbin/nologin edgedistill
COPY --from=builder /opt/venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    EDGEDISTILL_BUNDLE=/models/bundle \
    EDGEDISTILL_HEALTH_PORT=50052
# Numeric, so that Kubernetes' runAsNonRoot can verify it without a passwd lookup.
USER 10001:10001
EXPOSE 50051 50052 8002
# SERVING only after warm-up (with several workers, nothing listens before); NOT_SERVING while draining.
# It asks EDGEDISTILL_HEALTH_PORT (above: a plaintext port with only the health check), which neither TLS nor the
# call limit of the gRPC port (MAX_CONCURRENT_RPCS) can refuse; unset, off or 0, the gRPC port (serve/healthcheck.py).
# The start period is as long as the supervisor waits for a worker to serve (EDGEDISTILL_START_TIMEOUT_S, 120 s), so
# a slow start is not called unhealthy before the server itself gives up on it.
HEALTHCHECK --interval=10s --timeout=5s --start-period=120s --retries=3 \
    CMD ["/opt/venv/bin/python", "-m", "edgedistill.serve.healthcheck"]
ENTRYPOINT ["/opt/venv/bin/python", "-m", "edgedistill.serve"]

# The bundle of `baked`, readable by the image's user whatever umask wrote it (under 077 its files are its owner's
# alone, and the owner is not uid 10001), and writable by no one but root. A stage of its own, so that the image's
# layer holds each file once.
FROM ${BASE} AS bundle
ARG BUNDLE
COPY ${BUNDLE} /models/bundle
RUN chmod -R a+rX,go-w /models/bundle

# A self-contained image with one bundle, for registries and Kubernetes: `--target baked
# --build-arg BUNDLE=<bundle folder inside the build context>`.
FROM runtime AS baked
COPY --from=bundle /models/bundle /models/bundle

# The default target: the bundle comes from a volume at /models/bundle.
FROM runtime
