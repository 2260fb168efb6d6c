#!/bin/sh
# test_cli_grad.sh - `mha grad`: fresh random PyTorch modules and upstream
# gradients made at test time (tests/cli/grad_pytorch.py, skipped when
# /usr/bin/python3 lacks torch), --help, and argument errors (exit 2 with a
# message).  Prints "cli-grad: N passed, N failed".
. tests/cli/lib/common.sh


if "$MHA" grad --help >"$T/out" 2>&1 && grep -q "usage: mha grad" "$T/out"; then ok
else ko "mha grad --help"; fi

expect 2 "--grad-out and --out-dir are required" "$MHA" grad --heads 2
expect 2 "attention weights are not an output" "$MHA" grad --attn-weights-out x.npy
expect 2 "unknown or incomplete option" "$MHA" grad --bogus

if /usr/bin/python3 -c "import torch, numpy" 2>/dev/null; then
    seed=${MHA_CLI_SEED:-$$}
    out=$(/usr/bin/python3 tests/cli/grad_pytorch.py "$MHA" "$seed" 2>&1)
    printf '%s\n' "$out" | grep '^FAIL' | sed "s/^/[seed $seed] /"
    p=$(printf '%s\n' "$out" | sed -n 's/^grad-pytorch: \([0-9]*\) passed.*/\1/p')
    f=$(printf '%s\n' "$out" | sed -n 's/.* \([0-9]*\) failed$/\1/p')
    if [ -n "$p" ]; then pass=$((pass + p)); fail=$((fail + f))
    else ko "grad_pytorch.py gave no result: $(printf '%s' "$out" | tail -n 3)"; fi
    # bad upstream gradient shape: exit 2 naming --grad-out
    /usr/bin/python3 - "$T" <<'PY'
import sys, numpy as np, json, struct
t = sys.argv[1]
np.save(t + "/q.npy", np.zeros((2, 3, 4), np.float32))
np.save(t + "/dy.npy", np.zeros((2, 3, 5), np.float32))
ws = {"in_proj_weight": np.zeros((12, 4), np.float32), "out_proj.weight": np.zeros((4, 4), np.float32)}
h, off, blobs = {}, 0, []
for n in sorted(ws):
    raw = ws[n].tobytes(); h[n] = {"dtype": "F32", "shape": list(ws[n].shape), "data_offsets": [off, off + len(raw)]}
    off += len(raw); blobs.append(raw)
hb = json.dumps(h).encode(); hb += b" " * ((8 - len(hb) % 8) % 8)
open(t + "/w.safetensors", "wb").write(struct.pack("<Q", len(hb)) + hb + b"".join(blobs))
PY
    expect 2 "--grad-out" "$MHA" grad --weights "$T/w.safetensors" --heads 2 --query "$T/q.npy" \
        --grad-out "$T/dy.npy" --out-dir "$T/o"
else
    echo "cli-grad: /usr/bin/python3 has no torch; PyTorch comparison skipped"
fi
echo "cli-grad: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
