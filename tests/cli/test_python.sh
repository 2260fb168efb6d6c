#!/bin/sh
# test_python.sh - the Python package (python/, docs/python.md): builds the
# extension mha._mha against $MHA_BUILD/libmha.a into a temporary directory
# (python/setup.py build_ext; nothing is written in the tree) and runs the
# pytest suite python/tests against it with /usr/bin/python3 (Debian's, with
# numpy and torch 1.13 from apt).  Reported as skipped, not passed, when that
# Python lacks numpy, pytest or Python.h, and for sanitizer or coverage builds
# (an extension module cannot load an ASan/gcov libmha into python3).
# Prints "python: N passed, N failed, N skipped".
B=${MHA_BUILD:-build}
PY=${MHA_PYTHON:-/usr/bin/python3}
ROOT=$PWD
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
skip() {
    echo "python: $1: skipped"
    echo "python: 0 passed, 0 failed, 1 skipped"
    exit 0
}
[ -x "$PY" ] || skip "no $PY"
"$PY" -c "import numpy, pytest" 2>/dev/null ||
    skip "$PY lacks numpy or pytest (apt-get install python3-numpy python3-pytest python3-dev)"
"$PY" -c "import os, sys, sysconfig; sys.exit(not os.path.isfile(os.path.join(
    sysconfig.get_paths()['include'], 'Python.h')))" || skip "no Python.h (apt-get install python3-dev)"
if nm "$B/libmha.a" 2>/dev/null | grep -q '__asan_\|__gcov_\|__ubsan_'; then
    skip "$B is a sanitizer or coverage build"
fi

if ! (cd python && MHA_BUILD_DIR="$ROOT/$B" "$PY" setup.py -q build_ext \
        --build-lib "$T/lib" --build-temp "$T/tmp") >"$T/build.log" 2>&1; then
    tail -n 30 "$T/build.log"
    echo "python: 0 passed, 1 failed (extension build)"
    exit 1
fi
cp python/mha/*.py python/mha/*.pyi python/mha/py.typed "$T/lib/mha/"

out=$(cd "$T" && PYTHONPATH="$T/lib" PYTHONDONTWRITEBYTECODE=1 "$PY" -m pytest -q \
    -p no:cacheprovider --rootdir "$T" "$ROOT/python/tests" 2>&1)
rc=$?
printf '%s\n' "$out" | grep -E '^(FAILED|ERROR)' | head -n 40
line=$(printf '%s\n' "$out" | grep -E '[0-9]+ (passed|failed|error)' | tail -n 1)
count() { printf '%s' "$line" | sed -n "s/.*\b\([0-9][0-9]*\) $1.*/\1/p"; }
p=$(count passed) f=$(count failed) e=$(count error) s=$(count skipped)
p=${p:-0} f=$((${f:-0} + ${e:-0})) s=${s:-0}
if [ -z "$line" ] || { [ "$rc" -ne 0 ] && [ "$f" -eq 0 ]; }; then
    printf '%s\n' "$out" | tail -n 20
    f=$((f + 1))
fi
echo "python: $p passed, $f failed, $s skipped"
[ "$f" -eq 0 ]
