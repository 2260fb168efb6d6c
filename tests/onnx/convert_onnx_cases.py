#!/usr/bin/env python3
"""convert_onnx_cases.py - ONNX's own Attention backend test cases as .npy
files and an `mha attention` command line, one folder per case.

    python3 tests/onnx/convert_onnx_cases.py OUTDIR [--seed N]

Needs the pip `onnx` package (1.23; pyenv's python3, not /usr/bin/python3).
The cases are those of onnx/backend/test/case/node/attention.py, collected
with onnx.backend.test.case.node.collect_testcases("Attention") exactly as
`backend-test-tools generate-data` does (the `_expanded` twins run the same
numbers through the function body and are skipped).  The generator draws its
inputs with np.random; --seed fixes them (the committed set in
tests/onnx/cases used --seed 0), and a fresh seed gives inputs that are in no
repository, expected outputs from onnx.reference's _compute_attention.

Per case OUTDIR/<name>/:
    args                 the command line after `mha`, paths relative to the folder
    q.npy k.npy v.npy [mask.npy past_key.npy past_value.npy nonpad.npy]
    expected_out.npy [expected_present_key.npy expected_present_value.npy
                      expected_qk.npy]
    tol                  the pass rule's tolerance: 1e-4 float32, 2e-2 float16,
                         2e-2 bfloat16
bfloat16 has no .npy dtype: those cases are stored as float32 (exact for
the inputs) and compared with the bfloat16 tolerance.
"""
import argparse
import os
import shutil
import sys
import warnings

import numpy as np

INPUTS = ["q", "k", "v", "mask", "past_key", "past_value", "nonpad"]
IN_FLAGS = ["--q", "--k", "--v", "--mask", "--past-key", "--past-value", "--nonpad-kv-seqlen"]
OUTPUTS = ["out", "present_key", "present_value", "qk"]
ATTR_FLAGS = {
    "is_causal": "--causal",
    "scale": "--scale",
    "q_num_heads": "--q-heads",
    "kv_num_heads": "--kv-heads",
    "softcap": "--softcap",
    "qk_matmul_output_mode": "--qk-mode",
    "softmax_precision": "--softmax-precision",
    "left_window_size": "--window-left",
    "right_window_size": "--window-right",
}


def collect(seed):
    import onnx
    from onnx.backend.test.case.node import collect_testcases

    if seed is not None:
        np.random.seed(seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cases = collect_testcases("Attention")
    return onnx, [c for c in cases if "_expanded" not in c.name]


def kind(a):
    name = str(a.dtype)
    return "bfloat16" if "bfloat16" in name else name


def store(path, a):
    if kind(a) == "bfloat16":
        a = a.astype(np.float32)
    np.save(path, np.ascontiguousarray(a))


def convert(onnx, case, outdir):
    node = case.model.graph.node[0]
    assert node.op_type == "Attention", node.op_type
    inputs, outputs = case.data_sets[0]
    d = os.path.join(outdir, case.name)
    if os.path.exists(d):
        shutil.rmtree(d)
    os.makedirs(d)
    args = ["attention"]
    given = [n for n in node.input]
    it = iter(inputs)
    for pos, name in enumerate(given):
        if name == "":
            continue
        a = next(it)
        store(os.path.join(d, INPUTS[pos] + ".npy"), a)
        args += [IN_FLAGS[pos], INPUTS[pos] + ".npy"]
    for attr in node.attribute:
        v = onnx.helper.get_attribute_value(attr)
        flag = ATTR_FLAGS[attr.name]  # an unknown attribute is an error here
        if attr.name == "is_causal":
            if v:
                args.append(flag)
        elif isinstance(v, float):
            args += [flag, "%.9g" % v]
        else:
            args += [flag, str(v)]
    ot = iter(outputs)
    for pos, name in enumerate(node.output):
        if name == "":
            continue
        store(os.path.join(d, "expected_" + OUTPUTS[pos] + ".npy"), next(ot))
    k = kind(inputs[0])
    tol = {"float32": "1e-4", "float16": "2e-2", "bfloat16": "2e-2"}[k]
    with open(os.path.join(d, "args"), "w") as f:
        f.write(" ".join(args) + "\n")
    with open(os.path.join(d, "tol"), "w") as f:
        f.write(tol + "\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("outdir")
    ap.add_argument("--seed", type=int, default=None)
    a = ap.parse_args()
    onnx, cases = collect(a.seed)
    os.makedirs(a.outdir, exist_ok=True)
    for c in cases:
        convert(onnx, c, a.outdir)
    print("converted %d ONNX Attention cases (onnx %s) into %s" % (len(cases), onnx.__version__,
                                                                   a.outdir))
    return 0


if __name__ == "__main__":
    sys.exit(main())
