#!/bin/sh
# test_layout.sh - the architecture the layout promises: no call cycle between
# the library's source files (the dispatchers call the kernels and the
# runtime, never back), checked on the built objects with tools/call_cycles.py;
# and the checker itself finds a cycle that is there.
. tests/cli/lib/common.sh
PY=$(command -v python3 || command -v /usr/bin/python3)
if [ -z "$PY" ] || ! command -v nm >/dev/null 2>&1 || [ ! -d "$B/src" ]; then
    echo "layout: skipped (needs python3, nm and $B/src)"
    echo "layout: 0 passed, 0 failed, 1 skipped"
    exit 0
fi
objs=$(find "$B/src" -name '*.o' | sort)
n=$(printf '%s\n' "$objs" | grep -c .)
[ "$n" -ge 20 ] && ok || ko "only $n objects under $B/src"
# shellcheck disable=SC2086
if "$PY" tools/call_cycles.py $objs >"$T/out" 2>&1; then ok
else ko "src/ has call cycles: $(cat "$T/out")"; fi
# the checker sees a cycle: a.c calls b(), b.c calls a()
printf 'int b(void);\nint a(void) { return b(); }\n' >"$T/a.c"
printf 'int a(void);\nint b(void) { return a() + 1; }\n' >"$T/b.c"
printf 'int a(void);\nint c(void) { return a(); }\n' >"$T/c.c"
if ${CC:-cc} -c "$T/a.c" -o "$T/a.o" && ${CC:-cc} -c "$T/b.c" -o "$T/b.o" && ${CC:-cc} -c "$T/c.c" -o "$T/c.o"; then
    "$PY" tools/call_cycles.py "$T/a.o" "$T/b.o" "$T/c.o" >"$T/cyc" 2>&1; rc=$?
    [ $rc -eq 1 ] && grep -q "a.o <-> .*b.o" "$T/cyc" && ! grep -q "c.o" "$T/cyc" && ok ||
        ko "call_cycles.py missed the a <-> b cycle (exit $rc): $(cat "$T/cyc")"
    "$PY" tools/call_cycles.py "$T/a.o" "$T/c.o" >"$T/nocyc" 2>&1 && ok ||
        ko "call_cycles.py saw a cycle in a <- c: $(cat "$T/nocyc")"
else ko "cannot compile the checker's probe objects"; fi
echo "layout: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
