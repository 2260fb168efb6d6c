# common.sh - what the CLI test scripts share; each sources it from the repo root
# (`. tests/cli/lib/common.sh`) and prints its own "name: N passed, N failed" line.
#   B       the build folder (MHA_BUILD, default build)
#   MHA     the mha under test
#   T       a temporary directory of the script's own, removed on exit
#   ok, ko  count a passed / failed check (ko prints its message)
#   expect CODE NEEDLE CMD...   CMD exits CODE with NEEDLE in its stderr
#                               (stdin from nothing; stdout, stderr in $T)
B=${MHA_BUILD:-build}
MHA=$PWD/$B/mha
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
pass=0 fail=0
ok() { pass=$((pass + 1)); }
ko() { fail=$((fail + 1)); echo "FAIL: $*"; }
expect() {
    code=$1 needle=$2
    shift 2
    "$@" >"$T/stdout" 2>"$T/stderr" </dev/null
    rc=$?
    if [ "$rc" -eq "$code" ] && grep -qF -- "$needle" "$T/stderr"; then ok
    else ko "$* -> exit $rc, stderr: $(head -c 300 "$T/stderr") (want $code, '$needle')"; fi
}
