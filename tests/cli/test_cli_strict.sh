#!/bin/sh
# test_cli_strict.sh - issue 12 defect 7: consistent exit codes and strict
# arguments.  A missing input file is exit 2 (bad input) in every command
# (forward, forward --layer, grad, grad --layer, train --resume, attention,
# viz); an unknown MHA_KERNEL/MHA_GEMM value is exit 2 with the valid values,
# said once; numbers are strict decimal (no spaces, hex, overflow or
# underflow).  Prints "cli-strict: N passed, N failed".
. tests/cli/lib/common.sh
F=tests/fixtures/cli/fwd_masked_rows_zero
# expect CODE NEEDLE cmd...: exit status CODE and NEEDLE in stderr
M=$T/missing

# ---- a missing input file is bad input (2), naming the file, everywhere ----
expect 2 "$M/w.safetensors" "$MHA" forward --weights "$M/w.safetensors" --heads 2 \
    --query "$F/q.npy" --out "$T/y.npy"
expect 2 "$M/q.npy" "$MHA" forward --weights "$F/w.safetensors" --heads 2 \
    --query "$M/q.npy" --out "$T/y.npy"
expect 2 "$M/w.safetensors" "$MHA" forward --layer encoder --weights "$M/w.safetensors" \
    --heads 2 --query "$F/q.npy" --out "$T/y.npy"
expect 2 "$M/w.safetensors" "$MHA" forward --layer decoder --weights "$M/w.safetensors" \
    --heads 2 --query "$F/q.npy" --memory "$F/q.npy" --out "$T/y.npy"
expect 2 "$M/w.safetensors" "$MHA" grad --layer encoder --weights "$M/w.safetensors" \
    --heads 2 --query "$F/q.npy" --grad-out "$F/q.npy" --out-dir "$T/g"
expect 2 "$M/q.npy" "$MHA" grad --weights "$F/w.safetensors" --heads 2 \
    --query "$M/q.npy" --grad-out "$F/q.npy" --out-dir "$T/g"
expect 2 "$M/model.safetensors" "$MHA" train --resume "$M" --out "$T/tr" --steps 1 --quiet
expect 2 "$M/q.npy" "$MHA" attention --q "$M/q.npy" --k "$M/q.npy" --v "$M/q.npy" \
    --out "$T/y.npy"
[ ! -e "$T/y.npy" ] && ok || ko "a failed run left $T/y.npy"

# ---- MHA_KERNEL / MHA_GEMM: an unknown value is an error, said once ----
for var in MHA_KERNEL MHA_GEMM; do
    expect 2 "$var=fastest" env "$var=fastest" "$MHA" forward --weights "$F/w.safetensors" \
        --heads 2 --query "$F/q.npy" --out "$T/y.npy"
    n=$(grep -c "$var" "$T/stderr")
    [ "$n" -eq 1 ] && ok || ko "$var=fastest reported $n times"
    grep -q "valid: auto" "$T/stderr" && ok || ko "$var: no list of valid values"
    [ ! -e "$T/y.npy" ] && ok || ko "$var=fastest still wrote the output"
    # empty means unset (auto)
    if env "$var=" "$MHA" forward --weights "$F/w.safetensors" --heads 2 \
        --query "$F/q.npy" --out "$T/y_empty.npy" 2>"$T/stderr"; then ok
    else ko "$var= (empty) rejected: $(head -c 200 "$T/stderr")"; fi
done
for v in ref scalar avx2 auto; do
    if env MHA_KERNEL=$v "$MHA" forward --weights "$F/w.safetensors" --heads 2 \
        --query "$F/q.npy" --out "$T/y_$v.npy" 2>"$T/stderr"; then ok
    else ko "MHA_KERNEL=$v rejected: $(head -c 200 "$T/stderr")"; fi
done
# avx512: runs where the CPU has AVX-512 F/DQ/BW/VL, else exit 2 naming
# AVX-512 and no output file (never a silent fallback to avx2)
flags=$(grep -m1 '^flags' /proc/cpuinfo 2>/dev/null)
has512=yes
for f in avx512f avx512dq avx512bw avx512vl; do
    case " $flags " in *" $f "*) ;; *) has512=no ;; esac
done
if [ "$has512" = yes ]; then
    if env MHA_KERNEL=avx512 "$MHA" forward --weights "$F/w.safetensors" --heads 2 \
        --query "$F/q.npy" --out "$T/y_avx512.npy" 2>"$T/stderr"; then ok
    else ko "MHA_KERNEL=avx512 rejected on an AVX-512 CPU: $(head -c 200 "$T/stderr")"; fi
else
    expect 2 "lacks AVX-512" env MHA_KERNEL=avx512 "$MHA" forward --weights "$F/w.safetensors" \
        --heads 2 --query "$F/q.npy" --out "$T/y_avx512.npy"
    [ ! -e "$T/y_avx512.npy" ] && ok || ko "a refused avx512 run left $T/y_avx512.npy"
fi
for v in blas avx2 portable auto; do
    if env MHA_GEMM=$v "$MHA" forward --weights "$F/w.safetensors" --heads 2 \
        --query "$F/q.npy" --out "$T/yg_$v.npy" 2>"$T/stderr"; then ok
    else ko "MHA_GEMM=$v rejected: $(head -c 200 "$T/stderr")"; fi
done

# ---- strict numbers: one parser for every flag ----
for h in " 2" "2 " "+2x" "0x2" "2.0" "" "99999999999999999999999"; do
    expect 2 "--heads" "$MHA" forward --weights "$F/w.safetensors" --heads "$h" \
        --query "$F/q.npy" --out "$T/y.npy"
    expect 2 "--heads" "$MHA" forward --layer encoder --weights "$F/w.safetensors" --heads "$h" \
        --query "$F/q.npy" --out "$T/y.npy"
    expect 2 "--heads" "$MHA" grad --layer encoder --weights "$F/w.safetensors" --heads "$h" \
        --query "$F/q.npy" --grad-out "$F/q.npy" --out-dir "$T/g"
done
for lr in 1e-400 1e400 0x1p-3 " 0.01" "0.01 " inf nan 1e-3x .e1; do
    expect 2 "--lr" "$MHA" train --steps 1 --quiet --lr "$lr" --out "$T/tr"
done
expect 2 "--steps" "$MHA" train --steps " 3" --quiet --out "$T/tr"
expect 2 "--steps" "$MHA" train --steps 0x3 --quiet --out "$T/tr"
expect 2 "--eps" "$MHA" forward --layer encoder --weights "$F/w.safetensors" --heads 2 \
    --eps 1e-50 --query "$F/q.npy" --out "$T/y.npy"
expect 2 "--eps" "$MHA" grad --layer encoder --weights "$F/w.safetensors" --heads 2 \
    --eps 0x1p-10 --query "$F/q.npy" --grad-out "$F/q.npy" --out-dir "$T/g"
expect 2 "--scale" "$MHA" attention --q "$F/q.npy" --k "$F/k.npy" --v "$F/v.npy" \
    --scale 1e39 --out "$T/y.npy"
expect 2 "--kv-seq" "$MHA" bench --decode --kv-seq "16, 32"
expect 2 "--kv-seq" "$MHA" bench --decode --kv-seq "16,,32"
expect 2 "--reps" "$MHA" bench --decode --reps 0x10
# well-formed decimals are still accepted
if "$MHA" train --steps 2 --quiet --lr 1e-3 --seed 1 --threads 1 --out "$T/ok" >/dev/null 2>"$T/stderr"; then ok
else ko "train --lr 1e-3 rejected: $(head -c 200 "$T/stderr")"; fi

echo "cli-strict: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
