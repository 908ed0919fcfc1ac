#!/usr/bin/env bash
# Build a local Debian bookworm base image for podman: `deploy/base-image.sh [IMAGE]`.
#
# Where no registry can be reached, or no Docker engine runs, the serving image is built FROM this
# base instead of debian:bookworm-slim (`--build-arg BASE=localhost/edgedistill-base:bookworm`).
# It is a `debootstrap --variant=minbase` tree from the mirror apt already uses, imported with
# `podman import`, whose apt sources name the suite's updates and security suites beside it. Skipped when
# the image exists, as any user, unless REFRESH=1 (`sudo make base-image REFRESH=1`), which makes it again
# with the suite's packages of the day; making it needs root (debootstrap), and installs debootstrap, podman
# and runc with apt-get when they are missing. A rootless podman sees its own image store alone, so under sudo
# (`sudo make base-image`) the image then goes to the store of the user who ran sudo (SUDO_USER), where their
# `make image` looks for it.
set -euo pipefail

IMAGE=${1:-localhost/edgedistill-base:bookworm}
SUITE=bookworm
REFRESH=${REFRESH:-}
OWNER=  # the user whose store takes the image, where not root's
if [ "$(id -u)" = 0 ] && [ -n "${SUDO_USER:-}" ] && [ "$SUDO_USER" != root ]; then
  OWNER=$SUDO_USER
fi

log() { printf 'base-image: %s\n' "$*" >&2; }
owners_podman() {
  if [ -n "$OWNER" ]; then sudo -u "$OWNER" -H podman "$@"; else podman "$@"; fi
}

if [ "$REFRESH" != 1 ] && command -v podman >/dev/null && owners_podman image exists "$IMAGE"; then
  log "$IMAGE exists, skipped (REFRESH=1 makes it again)"
  exit 0
fi
if [ "$(id -u)" != 0 ]; then
  if ! command -v podman >/dev/null; then
    log "podman is not installed: run sudo make base-image, which installs it (apt-get) and makes $IMAGE, or start Docker, which make image builds with when it answers"
  elif [ "$REFRESH" = 1 ]; then
    log "REFRESH=1: making $IMAGE again needs root (debootstrap): run sudo make base-image REFRESH=1"
  else
    log "$IMAGE is not in your podman's image store, and making it needs root (debootstrap): run sudo make base-image, which puts it there, or set BASE_IMAGE to an image your podman has"
  fi
  exit 1
fi

missing=()
command -v debootstrap >/dev/null || missing+=(debootstrap)
command -v podman >/dev/null || missing+=(podman)
command -v runc >/dev/null || missing+=(runc)
if [ ${#missing[@]} -gt 0 ]; then
  log "installing ${missing[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# The Debian mirror apt is configured with for suite $1 (deb822 .sources or one-line sources.list), so the
# base comes from where this machine already gets its packages; DEBIAN_MIRROR (and DEBIAN_SECURITY_MIRROR, for
# the security suite) override it.
mirror_from_apt() {
  local suite=$1 file uri
  for file in /etc/apt/sources.list.d/*.sources; do
    [ -f "$file" ] || continue
    uri=$(awk -v suite="$suite" '
      /^[[:space:]]*$/ { if (uri != "" && hit) exit; uri = ""; hit = 0; next }
      tolower($1) == "uris:" { uri = $2 }
      tolower($1) == "suites:" { for (i = 2; i <= NF; i++) if ($i == suite) hit = 1 }
      END { if (uri != "" && hit) print uri }
    ' "$file")
    if [ -n "$uri" ]; then echo "$uri"; return; fi
  done
  for file in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
    [ -f "$file" ] || continue
    uri=$(awk -v suite="$suite" '{ line = $0; gsub(/\[[^]]*\]/, "", line); split(line, f) }
      f[1] == "deb" && f[3] == suite { print f[2]; exit }' "$file")
    if [ -n "$uri" ]; then echo "$uri"; return; fi
  done
}

if [ "$REFRESH" != 1 ] && podman image exists "$IMAGE"; then  # in root's store, from an earlier run
  log "$IMAGE exists in root's image store"
else
  MIRROR=${DEBIAN_MIRROR:-$(mirror_from_apt "$SUITE")}
  MIRROR=${MIRROR:-http://deb.debian.org/debian}
  SECURITY_MIRROR=${DEBIAN_SECURITY_MIRROR:-$(mirror_from_apt "$SUITE-security")}
  SECURITY_MIRROR=${SECURITY_MIRROR:-http://deb.debian.org/debian-security}

  ROOTFS=$(mktemp -d /var/tmp/edgedistill-base.XXXXXX)
  trap 'rm -rf -- "$ROOTFS"' EXIT

  log "debootstrap --variant=minbase $SUITE from $MIRROR"
  debootstrap --variant=minbase "$SUITE" "$ROOTFS" "$MIRROR" >/dev/null
  # debootstrap names the suite alone; the updates and security suites let the images built on this base install
  # their packages with the fixes released since, as debian:bookworm-slim's sources do.
  printf 'deb %s %s main\n' "$MIRROR" "$SUITE" "$MIRROR" "$SUITE-updates" "$SECURITY_MIRROR" "$SUITE-security" \
    >"$ROOTFS/etc/apt/sources.list"
  rm -rf "$ROOTFS"/var/lib/apt/lists/* "$ROOTFS"/var/cache/apt/*.bin "$ROOTFS"/var/cache/apt/archives/*.deb

  tar -C "$ROOTFS" -c . | podman import --quiet --change 'CMD ["/bin/bash"]' - "$IMAGE" >/dev/null
  log "imported $IMAGE ($(podman image inspect --format '{{.Size}}' "$IMAGE") bytes)"
fi
if [ -n "$OWNER" ]; then
  log "loading $IMAGE into $OWNER's image store"
  podman save "$IMAGE" | owners_podman load --quiet >/dev/null
fi
