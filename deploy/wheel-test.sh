#!/usr/bin/env bash
# Build the project's wheel and serve a bundle from a clean install of it: `deploy/wheel-test.sh BUNDLE_DIR`.
#
# `python -m build` makes the sdist and, from it, the wheel in a temporary folder; a fresh virtual
# environment installs the wheel with the `serve` and `cpu` extras from the package index. From a
# folder outside the checkout (so nothing can import from it): `python -m edgedistill.serve` on a
# free loopback port (its metrics on any free port), wait for gRPC health SERVING, classify a text
# (with its pair, for a pair model) with `deploy/classify_once.py`, then SIGTERM must drain and
# exit 0. Prints one result line; exits non-zero on any failure and always stops the server and
# removes its files.
#
# Settings (environment): PY (the project's Python, which has `build`), PYTHON (the interpreter of
# the clean environment, default python3), READY_TIMEOUT (seconds to SERVING).
set -euo pipefail

if [ $# -ne 1 ]; then
  echo "usage: $0 BUNDLE_DIR" >&2
  exit 2
fi

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PY=${PY:-$ROOT/.venv/bin/python}
PYTHON=${PYTHON:-python3}
READY_TIMEOUT=${READY_TIMEOUT:-60}
# Every Python here imports only what its environment installed: a PYTHONPATH (at a checkout, say) would put its
# edgedistill/ before the wheel's.
unset PYTHONPATH
# The server takes the settings given below alone: a shell's EDGEDISTILL_TOKEN (or TLS files) would refuse the test's
# plaintext call without a token, and its HEALTH_PORT could name a port in use.
unset "${!EDGEDISTILL_@}"

say() { printf 'wheel-test: %s\n' "$*" >&2; }
fail() {
  say "FAIL: $*"
  exit 1
}
seconds_since() { awk -v start="$1" -v end="$EPOCHREALTIME" 'BEGIN { printf "%.1f", end - start }'; }

BUNDLE_DIR=$(realpath -e -- "$1") || fail "no bundle folder $1"
[ -f "$BUNDLE_DIR/manifest.json" ] || fail "$BUNDLE_DIR has no manifest.json: not a bundle"
[ -x "$PY" ] || fail "no Python at $PY: run make setup"

WORK=$(mktemp -d)
SERVER=
cleanup() {
  local status=$?
  if [ -n "$SERVER" ] && kill -0 "$SERVER" 2>/dev/null; then
    kill -KILL "$SERVER" 2>/dev/null || true
  fi
  if [ $status -ne 0 ] && [ -f "$WORK/server.log" ]; then
    say "server log (last 30 lines):"
    tail -n 30 "$WORK/server.log" >&2
  fi
  rm -rf -- "$WORK"
  exit $status
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# --- build: the sdist, and the wheel from it ---
started=$EPOCHREALTIME
"$PY" -m build --outdir "$WORK/dist" "$ROOT" >"$WORK/build.log" 2>&1 || {
  tail -n 30 "$WORK/build.log" >&2
  fail "python -m build"
}
wheels=("$WORK"/dist/edgedistill-*.whl)
[ ${#wheels[@]} = 1 ] && [ -f "${wheels[0]}" ] || fail "expected one wheel in $WORK/dist"
WHEEL=${wheels[0]}
build_s=$(seconds_since "$started")

# --- a clean environment with the serve extra ---
started=$EPOCHREALTIME
"$PYTHON" -m venv "$WORK/venv" || fail "$PYTHON -m venv (on Debian: apt-get install python3-venv)"
VPY=$WORK/venv/bin/python
"$VPY" -m pip install --quiet --disable-pip-version-check "$WHEEL[serve,cpu]" >"$WORK/install.log" 2>&1 || {
  tail -n 30 "$WORK/install.log" >&2
  fail "pip install '$(basename "$WHEEL")[serve,cpu]'"
}
install_s=$(seconds_since "$started")
torch=$("$VPY" -c 'import importlib.util; print(importlib.util.find_spec("torch") is not None)')
[ "$torch" = False ] || fail "the serve extra installed torch"

# --- serve from outside the checkout ---
mkdir "$WORK/cwd"
cd "$WORK/cwd"
PORT=$("$VPY" -c '
import socket
s = socket.socket()
s.bind(("127.0.0.1", 0))
print(s.getsockname()[1])
')
started=$EPOCHREALTIME
EDGEDISTILL_WORKERS=1 EDGEDISTILL_THREADS=1 \
  "$VPY" -m edgedistill.serve --bundle "$BUNDLE_DIR" --host 127.0.0.1 --port "$PORT" --metrics-port 0 \
  >"$WORK/server.log" 2>&1 &
SERVER=$!
"$VPY" "$ROOT/deploy/wait_serving.py" "127.0.0.1:$PORT" "$READY_TIMEOUT" "$SERVER" ||
  fail "not SERVING after ${READY_TIMEOUT}s"
ready_s=$(seconds_since "$started")
location=$("$VPY" -c 'import edgedistill, pathlib; print(pathlib.Path(edgedistill.__file__).parent)')
[[ "$location" == "$WORK/venv/"* ]] || fail "edgedistill imports from $location, not from the installed wheel"

label=$("$VPY" "$ROOT/deploy/classify_once.py" "127.0.0.1:$PORT") || fail "Classify"

# --- SIGTERM drains and exits 0 ---
kill -TERM "$SERVER"
code=0
wait "$SERVER" || code=$?
SERVER=
[ "$code" = 0 ] || fail "exit code $code after SIGTERM (0 expected: a graceful drain)"

echo "wheel-test: ok wheel=$(basename "$WHEEL") extras=serve,cpu bundle=$(basename "$BUNDLE_DIR") label=$label" \
  "build=${build_s}s install=${install_s}s ready=${ready_s}s exit=$code"
