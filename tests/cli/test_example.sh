#!/bin/sh
# Compiles and runs the README's C example against the built library, both
# statically and through the shared library, and checks `make install`.
B=${MHA_BUILD:-build}
CC=${CC:-cc}
pass=0; fail=0
ok() { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "  FAIL: $1"; }
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
# the README shows examples/self_attention.c verbatim
if awk '/^```c$/{f=1;next} /^```$/{f=0} f' README.md | cmp -s - examples/self_attention.c; then ok
else bad "README's C example differs from examples/self_attention.c"; fi
SAN=""; case "$B" in *san*) SAN="-fsanitize=address,undefined";; esac
[ "${MHA_COVERAGE:-0}" = 1 ] && SAN="--coverage" # the coverage build's objects call libgcov
EXTRA="-lm"
for l in -fopenmp -lopenblas -lcjson -lpng; do
    printf 'int main(void){return 0;}\n' | $CC -x c - -o /dev/null $l 2>/dev/null && EXTRA="$EXTRA $l"
done
if $CC -std=c11 -Wall -Wextra -Werror -Iinclude $SAN examples/self_attention.c "$B/libmha.a" $EXTRA -o "$tmp/ex_static" 2>"$tmp/err"; then ok
else bad "static build of the example: $(cat "$tmp/err")"; fi
out=$("$tmp/ex_static" 2>&1); rc=$?
if [ $rc -eq 0 ] && printf '%s' "$out" | grep -q "y\[0\]\[0..3\]" && printf '%s' "$out" | grep -q "num_heads"; then ok
else bad "example run (rc $rc): $out"; fi
if [ -z "$SAN" ]; then
    if $CC -Iinclude examples/self_attention.c -L"$B" -lmha -o "$tmp/ex_shared" 2>"$tmp/err" \
       && LD_LIBRARY_PATH="$B" "$tmp/ex_shared" >/dev/null; then ok
    else bad "shared build of the example: $(cat "$tmp/err")"; fi
    # soname and hidden internals
    if readelf -d "$B/libmha.so" | grep -q "SONAME.*libmha.so.0"; then ok; else bad "soname"; fi
    if nm -D --defined-only "$B/libmha.so" | grep -q " mha_attn_run$"; then bad "internal symbol exported"; else ok; fi
    if grep -q '^#ifdef __cplusplus' include/mha.h && printf '#include "mha.h"\nint main(){return 0;}\n' | c++ -x c++ -Iinclude - -o /dev/null 2>/dev/null; then ok
    else bad "header does not compile as C++"; fi
    # make install + pkg-config
    if make -s install PREFIX="$tmp/prefix" >/dev/null 2>&1 && [ -x "$tmp/prefix/bin/mha" ] \
       && PKG_CONFIG_PATH="$tmp/prefix/lib/pkgconfig" pkg-config --cflags --libs mha >/dev/null 2>&1 \
       && $CC examples/self_attention.c $(PKG_CONFIG_PATH="$tmp/prefix/lib/pkgconfig" pkg-config --cflags --libs mha) -o "$tmp/ex_pc" \
       && LD_LIBRARY_PATH="$tmp/prefix/lib" "$tmp/ex_pc" >/dev/null; then ok
    else bad "make install / pkg-config mha"; fi
    # mha.pc names only what libmha needs (libpng is the CLI's; MPI is libmha_mpi's)
    if grep -E '^Libs' "$tmp/prefix/lib/pkgconfig/mha.pc" | grep -Eq -- '-lpng|-lmpi'; then
        bad "mha.pc names a library libmha does not use: $(grep '^Libs' "$tmp/prefix/lib/pkgconfig/mha.pc")"
    else ok; fi
    v=$("$tmp/prefix/bin/mha" --version 2>&1)
    case "$v" in "mha "[0-9]*) ok;; *) bad "mha --version: $v";; esac
else
    echo "  skipped: shared-library, install and pkg-config checks ($B is a sanitizer or coverage build)"
fi
echo "example: $pass passed, $fail failed"
[ $fail -eq 0 ]
