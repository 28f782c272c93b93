#!/usr/bin/env bash
# deploy/image/build.sh - builds kiln's container image from Debian packages and PyPI wheels only: no
# base image is pulled from a container registry.
#
# Usage: deploy/image/build.sh [cpu|gpu]      (default cpu)
#   cpu  tags kiln:<version> and kiln:latest; libonnxruntime.so from the onnxruntime wheel
#        (`.ci/setup.sh runtime`: .kiln/onnxruntime/)
#   gpu  tags kiln:<version>-gpu and kiln:latest-gpu; onnxruntime-gpu with the NVIDIA CUDA 13
#        wheels' libraries (`.ci/setup.sh gpu`: .kiln/onnxruntime-gpu/), for a kiln built with
#        `--features cuda`; the NVIDIA driver (libcuda.so.1) comes from the host, as with any
#        CUDA container (the NVIDIA container toolkit or Kubernetes' device plugin mounts it)
#
# Steps: mmdebstrap unpacks libc6, libgcc-s1 and libstdc++6 (Debian bookworm, with its security
# updates) and base-hook.sh adds the CA bundle; the user kiln (1000:1000) and /models are added;
# the base and the application (binary + ONNX Runtime) become two tar archives sorted by name,
# owned by root, every mtime SOURCE_DATE_EPOCH; `podman build --timestamp` makes the image from
# them (Containerfile, FROM scratch); `podman save` writes the OCI archive
# target/image/kiln-<version>[-gpu].oci.tar. The same inputs (binary, libraries, Debian packages,
# SOURCE_DATE_EPOCH) give the same image digest.
#
# Env:
#   KILN_BINARY               the kiln executable (default target/release/kiln; `cargo build
#                             --release --locked --bin kiln`, with `--features cuda` for gpu)
#   KILN_ONNXRUNTIME_DIR      cpu: folder holding libonnxruntime.so.<version> (default .kiln/onnxruntime)
#   KILN_ONNXRUNTIME_GPU_DIR  gpu: the folder `.ci/setup.sh gpu` fills (default .kiln/onnxruntime-gpu)
#   SOURCE_DATE_EPOCH         every timestamp in the image (default: the commit time of HEAD)
#   KILN_IMAGE_SOURCE         the org.opencontainers.image.source label (default: git's origin URL)
#   DEBIAN_MIRROR             mmdebstrap's mirror (default: Debian's, bookworm + updates + security)
#   KILN_IMAGE_OUT            output folder (default target/image)
#   CONTAINERS_CONF           podman's configuration (default deploy/image/containers.conf: runc,
#                             no default ulimits)
# Needs root (mmdebstrap's root mode, podman's store), podman, runc and mmdebstrap:
# `.ci/setup.sh image` installs them.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
VARIANT=${1:-cpu}
SUITE=bookworm
PACKAGES=libc6,libgcc-s1,libstdc++6
USER_ID=1000

log() { echo "image: $*"; }
die() { echo "image: ERROR: $*" >&2; exit 1; }

case $VARIANT in
  cpu) SUFFIX=""; ORT_LIBRARY=/usr/local/lib/libonnxruntime.so;;
  gpu) SUFFIX="-gpu"; ORT_LIBRARY=/opt/onnxruntime-gpu/onnxruntime/capi/libonnxruntime.so;;
  *) die "unknown variant '$VARIANT' (cpu | gpu)";;
esac
for tool in podman mmdebstrap runc; do
  command -v "$tool" >/dev/null 2>&1 || die "$tool not found: run .ci/setup.sh image (apt-get install podman runc mmdebstrap)"
done
[ "$(id -u)" = 0 ] || die "run as root (mmdebstrap's root mode and podman's system store)"

export CONTAINERS_CONF=${CONTAINERS_CONF:-$HERE/containers.conf}
BINARY=${KILN_BINARY:-$ROOT/target/release/kiln}
[ -x "$BINARY" ] || die "no kiln executable at $BINARY: cargo build --release --locked --bin kiln, or set KILN_BINARY"
VERSION=$(sed -n 's/^version = "\(.*\)"$/\1/p' "$ROOT/Cargo.toml" | head -1)
REVISION=$(git -C "$ROOT" rev-parse HEAD)
export SOURCE_DATE_EPOCH=${SOURCE_DATE_EPOCH:-$(git -C "$ROOT" log -1 --format=%ct)}
SOURCE=${KILN_IMAGE_SOURCE:-$(git -C "$ROOT" remote get-url origin 2>/dev/null || echo "file://$ROOT")}
CREATED=$(date -u -d "@$SOURCE_DATE_EPOCH" +%Y-%m-%dT%H:%M:%SZ)
OUT=${KILN_IMAGE_OUT:-$ROOT/target/image}
WORK=$OUT/work$SUFFIX

# base ROOTFS: the Debian libraries and CA bundle, then what the image needs and nothing that only
# a package manager or a booted system uses.
make_base() {
  local rootfs=$1 mirror=()
  [ -n "${DEBIAN_MIRROR:-}" ] && mirror=("$DEBIAN_MIRROR")
  log "base: mmdebstrap --variant=extract --include=$PACKAGES $SUITE"
  mmdebstrap --quiet --mode=root --variant=extract --include="$PACKAGES" \
    --extract-hook="$HERE/base-hook.sh \"\$1\"" "$SUITE" "$rootfs" "${mirror[@]}"
  # /dev, /proc and /sys come from the runtime; apt's and dpkg's state, the host's resolv.conf and
  # hostname (copied by mmdebstrap) and glibc's iconv modules (8 MB; nothing converts charsets) go.
  (cd "$rootfs" && rm -rf dev etc/apt etc/dpkg etc/fstab etc/hostname etc/resolv.conf var/cache var/log \
    var/lib/apt var/lib/dpkg/arch var/lib/dpkg/alternatives var/lib/dpkg/info var/lib/dpkg/status \
    var/lib/dpkg/triggers var/lib/dpkg/updates usr/lib/x86_64-linux-gnu/gconv usr/share/gcc usr/share/gdb \
    usr/share/lintian usr/share/doc)
  printf 'root:x:0:0:root:/root:/usr/sbin/nologin\nkiln:x:%s:%s:kiln:/nonexistent:/usr/sbin/nologin\n' \
    "$USER_ID" "$USER_ID" > "$rootfs/etc/passwd"
  printf 'root:x:0:\nkiln:x:%s:\n' "$USER_ID" > "$rootfs/etc/group"
  printf 'passwd: files\ngroup: files\nhosts: files dns\n' > "$rootfs/etc/nsswitch.conf"
  mkdir -p "$rootfs/models" "$rootfs/tmp" "$rootfs/root"
  chmod 0755 "$rootfs/models"
  chmod 0700 "$rootfs/root"
  chmod 1777 "$rootfs/tmp"
}

# app DIR: the executable and ONNX Runtime at the paths the Containerfile names.
make_app() {
  local app=$1
  install -D -m 0755 "$BINARY" "$app/usr/local/bin/kiln"
  if [ "$VARIANT" = cpu ]; then
    local ort=${KILN_ONNXRUNTIME_DIR:-$ROOT/.kiln/onnxruntime} real
    [ -e "$ort/libonnxruntime.so" ] || die "no libonnxruntime.so in $ort: run .ci/setup.sh runtime"
    real=$(basename "$(readlink -f "$ort/libonnxruntime.so")")
    install -D -m 0755 "$ort/$real" "$app/usr/local/lib/$real"
    install -m 0755 "$ort/libonnxruntime_providers_shared.so" "$app/usr/local/lib/"
    ln -s "$real" "$app/usr/local/lib/libonnxruntime.so"
    ln -s "$real" "$app/usr/local/lib/libonnxruntime.so.1"
  else
    local gpu=${KILN_ONNXRUNTIME_GPU_DIR:-$ROOT/.kiln/onnxruntime-gpu} dir
    [ -e "$gpu/onnxruntime/capi/libonnxruntime.so" ] || die "no ONNX Runtime GPU build in $gpu: run .ci/setup.sh gpu"
    # The shared libraries only, at their places in the wheels (kiln and ONNX Runtime look for
    # them there); the Python modules, headers and static libraries stay behind.
    for dir in onnxruntime/capi nvidia/cu13/lib nvidia/cudnn/lib; do
      mkdir -p "$app/opt/onnxruntime-gpu/$dir"
      (cd "$gpu/$dir" && find . -maxdepth 1 -name '*.so*' ! -name '*.py' \( -type f -o -type l \) -print0 \
        | xargs -0 cp -a -t "$app/opt/onnxruntime-gpu/$dir")
    done
    rm -f "$app"/opt/onnxruntime-gpu/onnxruntime/capi/onnxruntime_pybind11_state*.so
  fi
}

# layer DIR TAR: a tar of DIR that depends on its contents only: sorted names, numeric root
# ownership, one mtime, GNU format (no pax headers carrying access or change times).
layer() {
  tar --create --file "$2" --directory "$1" --sort=name --format=gnu --numeric-owner --owner=0 --group=0 \
    --mtime="@$SOURCE_DATE_EPOCH" .
}

main() {
  local t0=$SECONDS name="kiln:$VERSION$SUFFIX" latest="kiln:latest$SUFFIX"
  local archive="$OUT/kiln-$VERSION$SUFFIX.oci.tar"
  local previous
  previous=$(podman image inspect --format '{{.Id}}' "$name" 2>/dev/null || true)
  rm -rf "$WORK"
  mkdir -p "$WORK/context"
  make_base "$WORK/rootfs"
  make_app "$WORK/app"
  layer "$WORK/rootfs" "$WORK/context/base.tar"
  layer "$WORK/app" "$WORK/context/app.tar"
  log "podman build $name ($VARIANT, revision $REVISION, SOURCE_DATE_EPOCH=$SOURCE_DATE_EPOCH)"
  podman build --quiet --pull=never --no-cache --timestamp "$SOURCE_DATE_EPOCH" --identity-label=false \
    --file "$HERE/Containerfile" --tag "$name" --tag "$latest" \
    --build-arg VERSION="$VERSION" --build-arg REVISION="$REVISION" --build-arg SOURCE="$SOURCE" \
    --build-arg CREATED="$CREATED" --build-arg VARIANT="$VARIANT" --build-arg ORT_LIBRARY="$ORT_LIBRARY" \
    "$WORK/context" >/dev/null
  # podman save's own archive holds the time it was written: the OCI layout it writes is archived
  # here the way the layers are, so that the archive too depends on the image only.
  podman save --quiet --format oci-dir --output "$WORK/oci" "$name"
  layer "$WORK/oci" "$archive"
  rm -rf "$WORK"
  local id size
  id=$(podman image inspect --format '{{.Id}}' "$name")
  size=$(podman image inspect --format '{{.Size}}' "$name")
  # The image this build's tags moved away from, if no other tag holds it (with the build steps
  # below it, which only it used).
  if [ -n "$previous" ] && [ "$previous" != "$id" ] \
     && [ "$(podman image inspect --format '{{len .RepoTags}}' "$previous")" = 0 ]; then
    podman rmi "$previous" >/dev/null
  fi
  log "done in $((SECONDS - t0)) s: $name and $latest, image id sha256:$id, $((size / 1000000)) MB ($size bytes) uncompressed"
  log "OCI archive: $archive ($(du -m "$archive" | cut -f1) MiB)"
}

main
