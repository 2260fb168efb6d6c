#!/bin/sh
# `mha viz`: exit codes, files written, SVG well-formed with one cell per
# weight and the tokens, PNG signature and size.  Prints "cli-viz: N passed,
# N failed".  MHA_BUILD names the build directory (default build).
B=${MHA_BUILD:-build}
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
MHA="$ROOT/$B/mha"
FIX="$ROOT/tests/fixtures/cli"
T=$(mktemp -d "${TMPDIR:-/tmp}/mha-viz.XXXXXX") || exit 1
trap 'rm -rf "$T"' EXIT INT TERM
pass=0; fail=0
ok() { pass=$((pass + 1)); echo "ok $1"; }
no() { fail=$((fail + 1)); echo "FAIL $1"; }
check() { name=$1; shift; if "$@"; then ok "$name"; else no "$name"; fi; }

# run DIR ARGS...: runs mha viz in DIR; sets rc, out, err
run() {
    d=$1; shift
    (cd "$d" && "$MHA" viz "$@" >"$T/out" 2>"$T/err"); rc=$?
    out=$(cat "$T/out"); err=$(cat "$T/err")
}
cells() { grep -o '<rect class="cell"' "$1" | wc -l | tr -d ' '; }
well_formed() {
    if command -v xmllint >/dev/null 2>&1; then xmllint --noout "$1" 2>/dev/null
    else grep -q '</svg>' "$1"; fi
}
is_png() { [ "$(od -An -c -N4 "$1" | tr -d ' ')" = '211PNG' ]; }
# PNG width and height from the IHDR chunk (bytes 16..23, big-endian)
png_size() { od -An -tu1 -j16 -N8 "$1" | awk '{printf "%d %d", $1*16777216+$2*65536+$3*256+$4, $5*16777216+$6*65536+$7*256+$8}'; }
has_png=1

# 1. no arguments: the seed example, both files in the current directory
mkdir "$T/a"
run "$T/a"
check "no args: exit 0" [ "$rc" -eq 0 ]
check "no args: SVG written" [ -s "$T/a/mha-viz.svg" ]
if [ -s "$T/a/mha-viz.png" ]; then
    check "no args: PNG written and says where" sh -c 'printf "%s" "$1" | grep -q "wrote mha-viz.png"' _ "$out"
    check "no args: PNG signature" is_png "$T/a/mha-viz.png"
    sz=$(png_size "$T/a/mha-viz.png")
    check "no args: PNG size plausible ($sz)" sh -c 'set -- $1; [ "$1" -ge 300 ] && [ "$2" -ge 200 ] && [ "$1" -le 4000 ]' _ "$sz"
else
    has_png=0
    check "no args without libpng: note on stderr" sh -c 'printf "%s" "$1" | grep -q libpng' _ "$err"
    echo "cli-viz: PNG checks skipped (built without libpng)"
fi
check "no args: SVG well-formed" well_formed "$T/a/mha-viz.svg"
check "no args: 2 heads + average x 7 x 7 cells" [ "$(cells "$T/a/mha-viz.svg")" -eq 147 ]
check "no args: tokens on the axes" sh -c 'for t in 远 方 有 颗 苹 果 树; do grep -q ">$t<" "$1" || exit 1; done' _ "$T/a/mha-viz.svg"
check "no args: panel titles" sh -c 'grep -q ">head 0<" "$1" && grep -q ">head 1<" "$1" && grep -q ">average<" "$1"' _ "$T/a/mha-viz.svg"

# 2. --help
run "$T/a" --help
check "--help: exit 0" [ "$rc" -eq 0 ]
check "--help: documents --tokens and --png" sh -c 'printf "%s" "$1" | grep -q -- --tokens && printf "%s" "$1" | grep -q -- --png' _ "$out"

# 3. token counts that do not fit: exit 2 with a message
run "$T/a" --tokens "a b c" --svg x.svg
check "--tokens 3 of 7: exit 2" [ "$rc" -eq 2 ]
check "--tokens 3 of 7: says L" sh -c 'printf "%s" "$1" | grep -q "L = 7"' _ "$err"
check "--tokens 3 of 7: nothing written" [ ! -e "$T/a/x.svg" ]
run "$T/a" --key-tokens "a b" --svg x.svg
check "--key-tokens 2 of 7: exit 2" [ "$rc" -eq 2 ]

# 4. --tokens, --svg only, escaping; --tokens-file with a PNG only
mkdir "$T/b"
run "$T/b" --tokens 'the <cat> & "dog" sat on it' --svg m.svg
check "--tokens --svg: exit 0" [ "$rc" -eq 0 ]
check "--svg only: no PNG" [ ! -e "$T/b/mha-viz.png" ] 
check "--tokens: escaped labels" sh -c 'grep -q "&lt;cat&gt;" "$1" && grep -q ">&amp;<" "$1" && grep -q "&quot;dog&quot;" "$1"' _ "$T/b/m.svg"
check "--tokens: well-formed" well_formed "$T/b/m.svg"
printf '远 方\n有 颗\t苹 果 树\n' > "$T/b/tokens.txt"
if [ "$has_png" -eq 1 ]; then
    run "$T/b" --tokens-file tokens.txt --png m.png
    check "--tokens-file --png: exit 0" [ "$rc" -eq 0 ]
    check "--png only: PNG, no SVG" sh -c '[ -s "$1/m.png" ] && [ ! -e "$1/mha-viz.svg" ]' _ "$T/b"
else
    run "$T/b" --png m.png
    check "--png without libpng: exit 1" [ "$rc" -eq 1 ]
    check "--png without libpng: says libpng" sh -c 'printf "%s" "$1" | grep -q libpng' _ "$err"
fi
run "$T/b" --tokens-file missing.txt --svg y.svg
check "--tokens-file missing: exit 2" [ "$rc" -eq 2 ]

# 5. bad options and unwritable outputs
run "$T/b" --frobnicate
check "unknown option: exit 2" [ "$rc" -eq 2 ]
run "$T/b" --batch 1 --svg z.svg
check "--batch 1 on the seed example: exit 2" [ "$rc" -eq 2 ]
run "$T/b" --batch -1 --svg z.svg
check "--batch -1: exit 2" [ "$rc" -eq 2 ]
run "$T/b" --svg "$T/no/such/dir/x.svg"
check "unwritable --svg: exit 1" [ "$rc" -eq 1 ]
check "unwritable --svg: names the file" sh -c 'printf "%s" "$1" | grep -q "no/such/dir"' _ "$err"

# 6. a weights file and inputs (the `mha forward` options), batched, causal
F="$FIX/fwd_self_prefix_causal_perhead"
if [ -d "$F" ]; then
    mkdir "$T/c"
    run "$F" --weights w.safetensors --heads 3 --query q.npy --prefix self_attn. --causal \
        --batch 1 --tokens "w0 w1 w2 w3 w4" --svg "$T/c/f.svg"
    check "inputs: exit 0" [ "$rc" -eq 0 ]
    check "inputs: 3 heads + average x 5 x 5 cells" [ "$(cells "$T/c/f.svg")" -eq 100 ]
    check "inputs: causal: query 0 gives key 1 weight 0" grep -q 'data-p="0" data-i="0" data-j="1" data-w="0"' "$T/c/f.svg"
    check "inputs: causal: query 0 gives key 0 weight 1" grep -q 'data-p="2" data-i="0" data-j="0" data-w="1"' "$T/c/f.svg"
    check "inputs: self-attention keys get the tokens" grep -q '>w4 → w3: ' "$T/c/f.svg"
    run "$F" --weights w.safetensors --heads 3 --query q.npy --prefix self_attn. --batch 7 --svg "$T/c/g.svg"
    check "inputs: --batch past B: exit 2" [ "$rc" -eq 2 ]
    run "$F" --weights w.safetensors --heads 3 --query q.npy --prefix self_attn. --tokens "a b" --svg "$T/c/g.svg"
    check "inputs: --tokens 2 of L=5: exit 2" [ "$rc" -eq 2 ]
fi
F="$FIX/fwd_kvdim_bkv_zattn_amf3"
if [ -d "$F" ]; then
    run "$F" --weights w.safetensors --heads 5 --query q.npy --key k.npy --value v.npy \
        --attn-mask am.npy --add-zero-attn --key-tokens "cat sat on mat" --svg "$T/c/k.svg"
    check "cross: exit 0" [ "$rc" -eq 0 ]
    check "cross: key tokens + bias_k + zero columns" sh -c 'grep -q ">mat<" "$1" && grep -q ">bias_k<" "$1" && grep -q ">zero<" "$1"' _ "$T/c/k.svg"
    run "$F" --weights w.safetensors --heads 5 --query q.npy --key k.npy --value v.npy \
        --attn-mask am.npy --add-zero-attn --key-tokens "a b c" --svg "$T/c/k2.svg"
    check "cross: --key-tokens 3 of S=4: exit 2" [ "$rc" -eq 2 ]
fi

echo "cli-viz: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
