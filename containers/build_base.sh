#!/usr/bin/env bash
# Offline base image: debootstrap a Debian bookworm rootfs (only Debian packages are reachable)
# and `docker import` it. No registry needed. Then: docker build --build-arg BASE=<tag> ...
#
#   containers/build_base.sh [TAG] [MIRROR]      (as root; needs debootstrap and a docker engine)
#   DOCKER_HOST=unix:///path/docker.sock containers/build_base.sh relax-base:bookworm
set -euo pipefail
TAG="${1:-relax-base:bookworm}"
MIRROR="${2:-http://deb.debian.org/debian}"
command -v debootstrap >/dev/null || apt-get install -y debootstrap
ROOTFS="$(mktemp -d /tmp/relax-rootfs.XXXXXX)"
trap 'rm -rf "$ROOTFS"' EXIT
debootstrap --variant=minbase --include=python3,python3-venv,python3-pip,ca-certificates,procps \
  bookworm "$ROOTFS" "$MIRROR"
chroot "$ROOTFS" apt-get clean
rm -rf "$ROOTFS"/var/lib/apt/lists/*
tar -C "$ROOTFS" -c . | docker import \
  --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
  --change 'CMD ["/bin/bash"]' - "$TAG"
echo "imported $TAG"
