#!/bin/sh
# test_cli_grad_layer.sh - `mha grad --layer encoder|decoder`: fresh random
# PyTorch layers and upstream gradients made at test time
# (tests/cli/grad_layer_pytorch.py, skipped without /usr/bin/python3 + torch),
# --help and argument errors.  Prints "cli-grad-layer: N passed, N failed".
. tests/cli/lib/common.sh
if "$MHA" grad --layer encoder --help >"$T/h" 2>&1 && grep -q "usage: mha grad --layer" "$T/h"; then ok
else ko "mha grad --layer --help"; fi
expect 2 "--layer must be encoder or decoder" "$MHA" grad --layer lstm --heads 2
expect 2 "--heads wants a positive integer" "$MHA" grad --layer encoder
expect 2 "needs --weights" "$MHA" grad --layer decoder --heads 2 --query q.npy
expect 2 "unknown or incomplete option" "$MHA" grad --layer encoder --bogus
expect 2 "--activation must be" "$MHA" grad --layer encoder --heads 2 --activation tanh \
    --weights w --query q --grad-out d --out-dir o
if /usr/bin/python3 -c "import torch, numpy" 2>/dev/null; then
    seed=${MHA_CLI_SEED:-$$}
    out=$(/usr/bin/python3 tests/cli/grad_layer_pytorch.py "$MHA" "$seed" 2>&1)
    printf '%s\n' "$out" | grep '^FAIL' | sed "s/^/[seed $seed] /"
    p=$(printf '%s\n' "$out" | sed -n 's/^grad-layer-pytorch: \([0-9]*\) passed.*/\1/p')
    f=$(printf '%s\n' "$out" | sed -n 's/^grad-layer-pytorch: .* \([0-9]*\) failed$/\1/p')
    if [ -n "$p" ]; then pass=$((pass + p)); fail=$((fail + f))
    else ko "grad_layer_pytorch.py gave no result: $(printf '%s' "$out" | tail -n 3)"; fi
else
    echo "ok skipped: /usr/bin/python3 with torch not available"
fi
echo "cli-grad-layer: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
