#!/usr/bin/env bash
# Build a local Debian bookworm base image for podman: `deploy/base-image.sh [IMAGE]`.
#
# Where no registry can be reached, or no Docker engine runs, the serving image is built FROM this
# base instead of debian:bookworm-slim (`--build-arg BASE=localhost/edgedistill-base:bookworm`).
# It is a `debootstrap --variant=minbase` tree from the mirror apt already uses, imported with
# `podman import`. Skipped when the image exists, as any user; making it needs root (debootstrap), and
# installs debootstrap, podman and runc with apt-get when they are missing. A rootless podman sees its own
# image store alone, so under sudo (`sudo make base-image`) the image then goes to the store of the user
# who ran sudo (SUDO_USER), where their `make image` looks for it.
set -euo pipefail

IMAGE=${1:-localhost/edgedistill-base:bookworm}
SUITE=bookworm
OWNER=  # the user whose store takes the image, where not root's
if [ "$(id -u)" = 0 ] && [ -n "${SUDO_USER:-}" ] && [ "$SUDO_USER" != root ]; then
  OWNER=$SUDO_USER
fi

log() { printf 'base-image: %s\n' "$*" >&2; }
owners_podman() {
  if [ -n "$OWNER" ]; then sudo -u "$OWNER" -H podman "$@"; else podman "$@"; fi
}

if command -v podman >/dev/null && owners_podman image exists "$IMAGE"; then
  log "$IMAGE exists, skipped"
  exit 0
fi
if [ "$(id -u)" != 0 ]; then
  log "$IMAGE is not in your podman's image store, and making it needs root (debootstrap): run sudo make base-image, which puts it there, or set BASE_IMAGE to an image your podman has"
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

# The Debian mirror apt is configured with (deb822 .sources or one-line sources.list), so the
# base comes from where this machine already gets its packages; DEBIAN_MIRROR overrides it.
mirror_from_apt() {
  local file uri
  for file in /etc/apt/sources.list.d/*.sources; do
    [ -f "$file" ] || continue
    uri=$(awk -v suite="$SUITE" '
      /^[[:space:]]*$/ { if (uri != "" && hit) exit; uri = ""; hit = 0; next }
      tolower($1) == "uris:" { uri = $2 }
      tolower($1) == "suites:" { for (i = 2; i <= NF; i++) if ($i == suite) hit = 1 }
      END { if (uri != "" && hit) print uri }
    ' "$file")
    if [ -n "$uri" ]; then echo "$uri"; return; fi
  done
  for file in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
    [ -f "$file" ] || continue
    uri=$(awk -v suite="$SUITE" '{ line = $0; gsub(/\[[^]]*\]/, "", line); split(line, f) }
      f[1] == "deb" && f[3] == suite { print f[2]; exit }' "$file")
    if [ -n "$uri" ]; then echo "$uri"; return; fi
  done
}

if podman image exists "$IMAGE"; then  # in root's store, from an earlier run
  log "$IMAGE exists in root's image store"
else
  MIRROR=${DEBIAN_MIRROR:-$(mirror_from_apt)}
  MIRROR=${MIRROR:-http://deb.debian.org/debian}

  ROOTFS=$(mktemp -d /var/tmp/edgedistill-base.XXXXXX)
  trap 'rm -rf -- "$ROOTFS"' EXIT

  log "debootstrap --variant=minbase $SUITE from $MIRROR"
  debootstrap --variant=minbase "$SUITE" "$ROOTFS" "$MIRROR" >/dev/null
  rm -rf "$ROOTFS"/var/lib/apt/lists/* "$ROOTFS"/var/cache/apt/*.bin "$ROOTFS"/var/cache/apt/archives/*.deb

  tar -C "$ROOTFS" -c . | podman import --quiet --change 'CMD ["/bin/bash"]' - "$IMAGE" >/dev/null
  log "imported $IMAGE ($(podman image inspect --format '{{.Size}}' "$IMAGE") bytes)"
fi
if [ -n "$OWNER" ]; then
  log "loading $IMAGE into $OWNER's image store"
  podman save "$IMAGE" | owners_podman load --quiet >/dev/null
fi
