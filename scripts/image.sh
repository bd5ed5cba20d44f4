#!/usr/bin/env bash
# Builds the image deploy/appease-daemonset.yaml runs without a registry: a root filesystem
# made of the host's installed Debian packages that the binary links (libc6, libelf, zlib,
# libgcc), each whole with its copyright file, and the release binary; imported into the
# Docker engine DOCKER_HOST names (the local one by default). deploy/Dockerfile is the
# other way, from debian:trixie-slim through a registry.
#
#   scripts/image.sh [TAG]            import as TAG (default appease:latest)
#   scripts/image.sh TAG FILE.tar     and save it for containerd:
#                                     ctr -n k8s.io images import FILE.tar
#
# APPEASE_BIN names another binary (default target/release/appease, from `make build`).
set -euo pipefail

TAG=${1:-appease:latest}
SAVE=${2:-}
BIN=${APPEASE_BIN:-target/release/appease}

die() { echo "image: $*" >&2; exit 1; }
[ -x "$BIN" ] || die "$BIN is missing: run make build first (or set APPEASE_BIN)"
for program in docker dpkg-query ldd strip tar; do
  command -v "$program" >/dev/null || die "$program is missing"
done

root=$(mktemp -d)
trap 'rm -rf --one-file-system "$root"' EXIT
mkdir -p "$root"/usr/{bin,sbin,lib,lib64} "$root"/{etc,proc,sys,dev,run,tmp} "$root/usr/local/bin"
chmod 1777 "$root/tmp"
# Debian's merged /usr: the loader's path (/lib64/…) and the libraries' resolve through these.
for d in bin sbin lib lib64; do ln -s "usr/$d" "$root/$d"; done

# The package that owns a library, by the path ldd gives or the file it resolves to
# (dpkg records each under the one it was unpacked as).
owner() {
  local path=$1 p found
  for p in "$path" "$(realpath "$path")" "/usr$path" "${path#/usr}"; do
    found=$(dpkg-query -S "$p" 2>/dev/null) || continue
    # "libc6:amd64: /usr/lib/x86_64-linux-gnu/libc.so.6"
    echo "${found%%: *}"
    return 0
  done
  die "no installed package owns $path"
}

libs=$(ldd "$BIN" | grep -o '/[^ ]*' | sort -u)
[ -n "$libs" ] || die "ldd names no library of $BIN"
packages=$(for l in $libs; do owner "$l"; done | sort -u)
for pkg in $packages; do
  # Each file and link of the package, at its merged-/usr path; directories come with them.
  dpkg-query -L "$pkg" | while IFS= read -r f; do
    [ -d "$f" ] && [ ! -L "$f" ] && continue
    [ -e "$f" ] || [ -L "$f" ] || continue
    dir=$(realpath "$(dirname "$f")")
    mkdir -p "$root$dir"
    cp -a "$f" "$root$dir/"
  done
done
# Without its debug information (most of the release binary), symbols kept for backtraces.
install -m 0755 "$BIN" "$root/usr/local/bin/appease"
strip --strip-debug "$root/usr/local/bin/appease"
# The image's own account database: the daemon resolves no names, ps and logs print them.
printf 'root:x:0:0:root:/root:/usr/sbin/nologin\n' > "$root/etc/passwd"
printf 'root:x:0:\n' > "$root/etc/group"

echo "image: $(echo $packages | tr ' ' ',') and appease, $(du -sh "$root" | cut -f1)" >&2
tar --numeric-owner -C "$root" -c . \
  | docker import \
      --change 'ENTRYPOINT ["/usr/local/bin/appease"]' \
      --change 'CMD ["daemon"]' \
      --message "appease $("$BIN" --version | cut -d' ' -f2) from the host's Debian packages" \
      - "$TAG" > /dev/null
echo "image: imported as $TAG" >&2
if [ -n "$SAVE" ]; then
  docker save -o "$SAVE" "$TAG"
  echo "image: saved to $SAVE (ctr -n k8s.io images import $SAVE)" >&2
fi
