#!/bin/sh
# deploy/image/base-hook.sh ROOTFS - mmdebstrap's --extract-hook for kiln's base (build.sh runs it).
# The extract variant unpacks packages without running their maintainer scripts, so this does the
# little of that work the image needs, with the same package lists mmdebstrap used:
#  - /etc/ssl/certs/ca-certificates.crt: the certificates of Debian's ca-certificates, joined in
#    name order as update-ca-certificates joins them. The package itself is not unpacked: its
#    dependencies (openssl, debconf, perl) would come with it, and only the bundle is needed
#    (TLS to object stores, rustls reading the system roots).
#  - /var/lib/dpkg/status.d/<package>: each unpacked package's control fields, so that image
#    scanners can list the Debian packages and versions inside (distroless images do the same).
set -eu
root=$1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

mkdir -p "$root/var/lib/dpkg/status.d" "$root/etc/ssl/certs"
for deb in "$root"/var/cache/apt/archives/*.deb; do
  package=$(dpkg-deb --field "$deb" Package)
  { dpkg-deb --field "$deb"; echo "Status: install ok installed"; } > "$root/var/lib/dpkg/status.d/$package"
done

# As root: apt's own user (_apt) cannot write to this root-owned folder.
(cd "$tmp" && APT_CONFIG=$MMDEBSTRAP_APT_CONFIG apt-get download --quiet -o APT::Sandbox::User=root ca-certificates >/dev/null)
dpkg-deb --extract "$tmp"/ca-certificates_*.deb "$tmp/ca"
find "$tmp/ca/usr/share/ca-certificates" -name '*.crt' | LC_ALL=C sort | xargs cat \
  > "$root/etc/ssl/certs/ca-certificates.crt"
[ -s "$root/etc/ssl/certs/ca-certificates.crt" ] || { echo "base-hook: no certificates found" >&2; exit 1; }
{ dpkg-deb --field "$tmp"/ca-certificates_*.deb; echo "Status: install ok installed"; } \
  > "$root/var/lib/dpkg/status.d/ca-certificates"
