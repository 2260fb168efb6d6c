#!/bin/sh
# Installs the optional libraries mha uses (Debian/Ubuntu), once.
# Without root or apt-get it only reports: the build then uses its fallbacks.
pkgs="libopenblas-dev libcjson-dev libpng-dev libutf8proc-dev"
pkgs="$pkgs libopenmpi-dev openmpi-bin"  # MPI: libmha_mpi.a, `mha ring` (issue 18)
pkgs="$pkgs libsimde-dev"  # tests only: the AVX-512 kernels emulated on CPUs without AVX-512
missing=""
for p in $pkgs; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing="$missing $p"
done
[ -z "$missing" ] && exit 0
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "deps: installing$missing"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $missing >/dev/null \
        || { echo "deps: apt-get failed" >&2; exit 1; }
else
    echo "deps: missing$missing (not root: building with fallbacks)" >&2
fi
