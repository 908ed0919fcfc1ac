#!/usr/bin/env bash
# Build the serving image and check it end to end with podman: `deploy/container-test.sh BUNDLE_DIR`.
#
# The bundle folder is mounted read-only at run time (not baked in). From the host, on loopback
# ports only: wait for gRPC health SERVING, classify a text (with its pair, for a pair model) with
# `deploy/classify_once.py`, read /metrics; inside: the image's HEALTHCHECK passes and the process
# is not root. Then SIGTERM (`podman stop`) must drain and exit 0. Prints one result line; exits non-zero on any failure
# and always removes the container.
#
# Settings (environment): IMAGE (tag to build), BASE (base image; deploy/base-image.sh makes the
# default), PY (the project's Python, for the client), READY_TIMEOUT (seconds to SERVING),
# PIP_CERT (a CA bundle file passed to the build as the pip-cert secret, when set; one that names no file fails).
set -euo pipefail

if [ $# -ne 1 ]; then
  echo "usage: $0 BUNDLE_DIR" >&2
  exit 2
fi

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
IMAGE=${IMAGE:-localhost/edgedistill-serve:test}
BASE=${BASE:-localhost/edgedistill-base:bookworm}
PY=${PY:-$ROOT/.venv/bin/python}
READY_TIMEOUT=${READY_TIMEOUT:-180}
NAME=edgedistill-container-test-$$
# What podman needs on this kind of host: runc, and explicit limits instead of inherited ones.
RUN_FLAGS=(--runtime runc --ulimit nofile=20000:20000 --ulimit nproc=4096:4096)

say() { printf 'container-test: %s\n' "$*" >&2; }
fail() {
  say "FAIL: $*"
  exit 1
}
# podman's own complaints (e.g. no systemd for health-check timers) are kept out of the way
# and shown only when a podman command fails.
podman_failed() {
  tail -n 20 "$WORK/podman.log" >&2
  fail "$1"
}
seconds_since() { awk -v start="$1" -v end="$EPOCHREALTIME" 'BEGIN { printf "%.1f", end - start }'; }

BUNDLE_DIR=$(realpath -e -- "$1") || fail "no bundle folder $1"
[ -f "$BUNDLE_DIR/manifest.json" ] || fail "$BUNDLE_DIR has no manifest.json: not a bundle"
[ -z "${PIP_CERT:-}" ] || [ -f "$PIP_CERT" ] || fail "PIP_CERT=$PIP_CERT is not a file: name a CA bundle file, or unset it"
command -v podman >/dev/null || fail "podman is not installed (deploy/base-image.sh installs it)"
podman image exists "$BASE" || fail "no base image $BASE: run deploy/base-image.sh"
[ -x "$PY" ] || fail "no Python at $PY: run make setup"

WORK=$(mktemp -d)
cleanup() {
  local status=$?
  if podman container exists "$NAME" 2>/dev/null; then
    if [ $status -ne 0 ]; then
      say "container logs (last 40 lines):"
      podman logs --tail 40 "$NAME" >&2 || true
    fi
    podman rm --force --time 0 "$NAME" >/dev/null 2>&1 || true
  fi
  rm -rf -- "$WORK"
  exit $status
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# --- build (podman; HEALTHCHECK is kept only in the docker image format) ---
build_args=(--isolation chroot --format docker --build-arg "BASE=$BASE" --tag "$IMAGE")
if [ -n "${PIP_CERT:-}" ]; then
  build_args+=(--secret "id=pip-cert,src=$PIP_CERT")
fi
say "building $IMAGE from $BASE"
started=$EPOCHREALTIME
if ! podman build "${build_args[@]}" "$ROOT" >"$WORK/build.log" 2>&1; then
  tail -n 30 "$WORK/build.log" >&2
  fail "image build"
fi
build_s=$(seconds_since "$started")
size_mb=$(podman image inspect --format '{{.Size}}' "$IMAGE" | awk '{ printf "%d", $1 / 1e6 }')

# --- run, on two free loopback ports ---
read -r GRPC_PORT METRICS_PORT < <("$PY" -c '
import socket
socks = [socket.socket() for _ in range(2)]
for s in socks:
    s.bind(("127.0.0.1", 0))
print(*(s.getsockname()[1] for s in socks))
')
[ -n "${METRICS_PORT:-}" ] || fail "no free loopback ports"
say "running on 127.0.0.1:$GRPC_PORT (metrics :$METRICS_PORT), bundle $BUNDLE_DIR"
started=$EPOCHREALTIME
podman run --detach --name "$NAME" "${RUN_FLAGS[@]}" \
  --read-only --tmpfs /tmp --cap-drop ALL --security-opt no-new-privileges \
  --publish "127.0.0.1:$GRPC_PORT:50051" --publish "127.0.0.1:$METRICS_PORT:8002" \
  --volume "$BUNDLE_DIR:/models/bundle:ro" \
  --env EDGEDISTILL_THREADS=1 --env EDGEDISTILL_METRICS_HOST=0.0.0.0 \
  "$IMAGE" >/dev/null 2>>"$WORK/podman.log" || podman_failed "podman run"

# --- wait for SERVING, checking between polls that the container still runs ---
serving_within() {
  "$PY" "$ROOT/deploy/wait_serving.py" "127.0.0.1:$GRPC_PORT" "$1"
}
deadline=$((SECONDS + READY_TIMEOUT))
until serving_within 5; do
  state=$(podman inspect --format '{{.State.Status}}' "$NAME")
  [ "$state" = running ] || fail "container is $state before reporting SERVING"
  [ $SECONDS -lt $deadline ] || fail "not SERVING after ${READY_TIMEOUT}s"
done
ready_s=$(seconds_since "$started")

# --- the image's own HEALTHCHECK, run once by hand ---
podman healthcheck run "$NAME" >/dev/null 2>>"$WORK/podman.log" || podman_failed "the image's HEALTHCHECK does not pass on a SERVING server"

# --- classify from the host ---
started=$EPOCHREALTIME
label=$("$PY" "$ROOT/deploy/classify_once.py" "127.0.0.1:$GRPC_PORT") || fail "Classify from the host"
classify_s=$(seconds_since "$started")

# --- metrics from the host: the call above is counted ---
"$PY" - "http://127.0.0.1:$METRICS_PORT/metrics" <<'EOF' || fail "/metrics does not count the Classify call"
import sys
import urllib.request

direct = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # this machine: past an http_proxy
text = direct.open(sys.argv[1], timeout=10).read().decode()
sys.exit(not any(line.startswith("edgedistill_requests_total{") and "Classify" in line for line in text.splitlines()))
EOF

# --- not root ---
uid=$(podman exec "$NAME" id -u 2>>"$WORK/podman.log") || podman_failed "podman exec id -u"
[ "$uid" != 0 ] || fail "the server runs as root"

# --- SIGTERM drains and exits 0, within SHUTDOWN_GRACE_S (10 s) and the supervisor's STOP_MARGIN_S (10 s) ---
started=$EPOCHREALTIME
podman stop --time 25 "$NAME" >/dev/null 2>>"$WORK/podman.log" || podman_failed "podman stop"
stop_s=$(seconds_since "$started")
code=$(podman inspect --format '{{.State.ExitCode}}' "$NAME")
[ "$code" = 0 ] || fail "exit code $code after SIGTERM (0 expected: a graceful drain)"
podman rm "$NAME" >/dev/null 2>>"$WORK/podman.log" || podman_failed "podman rm"

echo "container-test: ok image=$IMAGE (${size_mb} MB) bundle=$(basename "$BUNDLE_DIR") label=$label uid=$uid" \
  "build=${build_s}s ready=${ready_s}s classify=${classify_s}s stop=${stop_s}s exit=$code"
