#!/usr/bin/env bash
# Containers for the SWE and terminal tasks: rootful podman with runc, configured for this machine kind, and the
# project's base images built from Debian's mirror (nothing is pulled from a registry). Idempotent: a second run
# only checks (~1 s). About a minute on a fresh machine.
#
# Podman rather than docker: no daemon to start, keep alive and stop around every run (CI's machine may be new),
# and both harnesses drive it as they are (mini-swe-agent as `executable: podman`, harbor through podman-compose).
# Networking: task containers have none by default (netns = "none"); image builds use the host's network
# (--network=host); no bridge is created and no port is published.
set -euo pipefail
CONF=/etc/containers/containers.conf
MARK="# fullasync containers/setup.sh"
BASE=localhost/fullasync/debian:bookworm
PYTHON_IMAGE=localhost/fullasync/python:3.11
TERMINAL_IMAGE=localhost/fullasync/terminal:bookworm
here="$(cd "$(dirname "$0")" && pwd)"

say() { echo "[containers] $*"; }

need_root() {
  if [ "$(id -u)" != 0 ]; then
    say "$1 needs root: run 'sudo $0'"
    exit 1
  fi
}

install_podman() {
  command -v podman >/dev/null && command -v runc >/dev/null && command -v debootstrap >/dev/null && return
  need_root "installing podman, runc and debootstrap"
  say "installing podman, runc and debootstrap (apt, ~15 s)"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q podman runc debootstrap >/dev/null
}

# podman's default rlimits exceed what this VM lets a process raise (no CAP_SYS_RESOURCE), so containers get the
# hard limits this shell has; crun refuses the VM's hybrid cgroup layout, so runc. A containers.conf that is not
# ours is left alone, with what it needs printed.
configure() {
  local nofile nproc
  nofile=$(ulimit -Hn); nproc=$(ulimit -Hu)
  { [ "$nproc" = unlimited ] || [ "$nproc" -gt 32768 ]; } && nproc=32768
  local want
  want=$(cat <<CONF
$MARK (rewritten when run again)
[containers]
default_ulimits = ["nofile=$nofile:$nofile", "nproc=$nproc:$nproc"]
netns = "none"

[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
CONF
)
  if [ -f "$CONF" ] && ! head -n1 "$CONF" | grep -qF "$MARK"; then
    say "$CONF exists and is not ours; make sure it holds:"
    echo "$want" | tail -n +2
    return
  fi
  [ -f "$CONF" ] && [ "$(cat "$CONF")" = "$want" ] && return
  need_root "writing $CONF"
  mkdir -p "$(dirname "$CONF")"
  echo "$want" > "$CONF.tmp" && mv "$CONF.tmp" "$CONF"
  say "wrote $CONF"
}

mirror() {
  sed -n 's/^URIs: *//p' /etc/apt/sources.list.d/debian.sources 2>/dev/null | head -n1 | grep . \
    || sed -n 's/^deb \(http[^ ]*\) .*/\1/p' /etc/apt/sources.list 2>/dev/null | head -n1 | grep . \
    || echo http://deb.debian.org/debian
}

build_base() {
  podman image exists "$BASE" && return
  local root
  root=$(mktemp -d /var/tmp/fullasync-debootstrap.XXXXXX)
  say "building $BASE from $(mirror) with debootstrap (~30 s)"
  debootstrap --variant=minbase bookworm "$root" "$(mirror)" >/dev/null
  rm -rf "$root"/var/cache/apt/*.bin "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/*
  tar -C "$root" -c . | podman import --change CMD=/bin/bash - "$BASE" >/dev/null
  rm -rf "$root"
}

# An image built from a Containerfile here, again only when the Containerfile or the image below it changed (the
# label fullasync.recipe holds their hash).
build_layer() {
  local tag=$1 file=$2 parent=$3 what=$4 key have
  key=$( { cat "$here/$file"; podman image inspect --format '{{.Id}}' "$parent"; } | sha256sum | cut -c1-16)
  have=$(podman image inspect --format '{{index .Labels "fullasync.recipe"}}' "$tag" 2>/dev/null || true)
  [ "$have" = "$key" ] && return
  say "building $tag ($what)"
  podman build --network=host --label "fullasync.recipe=$key" --tag "$tag" --file "$here/$file" "$here" >/dev/null
}

install_podman
configure
build_base
build_layer "$PYTHON_IMAGE" python.Containerfile "$BASE" "python3, git, patch; ~15 s"
build_layer "$TERMINAL_IMAGE" terminal.Containerfile "$PYTHON_IMAGE" "tmux for Terminus-2; ~10 s"
podman run --rm "$PYTHON_IMAGE" python3 -c "print('[containers] ready: podman', end=' ')" && podman --version
