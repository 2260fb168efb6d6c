#!/bin/sh
# forward_layer.sh - `mha forward --layer`: random PyTorch encoder/decoder
# layers and stacks generated now (not stored in the repository) must agree
# to 1e-5 relative; plus argument errors.  Skips the PyTorch part when
# /usr/bin/python3 has no torch.
B=${MHA_BUILD:-build}
MHA=$B/mha
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
pass=0 fail=0
ok() { pass=$((pass + 1)); }
ko() { fail=$((fail + 1)); echo "FAIL: $*"; }

"$MHA" forward --layer encoder --weights /nonexistent --heads 2 --query /nonexistent --out "$T/y.npy" 2>"$T/err"
[ $? -ne 0 ] && grep -q "nonexistent" "$T/err" && ok || ko "missing files must fail, naming the file"
"$MHA" forward --layer sideways --heads 2 2>"$T/err"
[ $? -eq 2 ] && grep -q "encoder or decoder" "$T/err" && ok || ko "bad --layer"
"$MHA" forward --layer encoder --help >"$T/out" && grep -q -- "--num-layers" "$T/out" && ok || ko "--help"

if /usr/bin/python3 -c "import torch, numpy" 2>/dev/null; then
    /usr/bin/python3 tests/cli/layer_pytorch.py "$T" "${MHA_LAYER_SEED:-$$}" >"$T/cases" || ko "generator"
    while read -r dir args; do
        # shellcheck disable=SC2086
        if "$MHA" forward $args 2>"$T/err"; then
            /usr/bin/python3 -c "
import numpy as np, sys
y, r = np.load('$dir/y.npy'), np.load('$dir/ref.npy')
e = np.abs(y - r).max() / max(1.0, np.abs(r).max())
sys.exit(0 if y.shape == r.shape and e <= 1e-5 else print('err', e) or 1)" && ok || ko "$dir: $args"
        else
            ko "$dir: exit $? $(cat "$T/err")"
        fi
    done <"$T/cases"
else
    echo "skip: no torch in /usr/bin/python3"
fi
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
