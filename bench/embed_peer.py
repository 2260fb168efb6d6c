#!/usr/bin/env python3
"""The peers of `mha embed` on the same sentences (bench/embed_bench.sh):
sentence-transformers' encode (batch 32, model loaded, torch threads = T) and
ONNX Runtime on the same model exported to ONNX (ORT's BERT optimisations
when onnxruntime.transformers.optimizer is there; the same tokenizer, the
same length-sorted batches of 32 padded to their longest text, the same mean
pooling and L2 normalisation).  Each peer is checked against the other
before timing (cosine >= 0.9999).

usage: embed_peer.py MODEL_DIR SENTENCES.txt WORKDIR THREADS
Prints one line per measurement: "peer NAME sentences_per_s X seconds Y".
Also writes WORKDIR/ids.txt (the tokenizer's ids, for mha embed --ids) and
WORKDIR/st.npy (the reference embeddings)."""
import os
import sys
import time

import numpy as np


def main():
    model_dir, sent_path, work, threads = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    os.environ["OMP_NUM_THREADS"] = str(threads)
    import torch
    torch.set_num_threads(threads)
    from sentence_transformers import SentenceTransformer
    texts = [l.rstrip("\n") for l in open(sent_path, encoding="utf-8")]
    model = SentenceTransformer(model_dir, device="cpu")
    tok = model.tokenizer
    feats = tok(texts, truncation=True, max_length=model.max_seq_length)
    with open(os.path.join(work, "ids.txt"), "w") as f:
        for ids in feats["input_ids"]:
            f.write(" ".join(map(str, ids)) + "\n")
    n_tokens = sum(len(i) for i in feats["input_ids"])
    print(f"peer tokens {n_tokens} texts {len(texts)}", flush=True)

    # sentence-transformers, model loaded, one warm-up batch
    model.encode(texts[:32], batch_size=32)
    t0 = time.perf_counter()
    ref = model.encode(texts, batch_size=32, convert_to_numpy=True)
    dt = time.perf_counter() - t0
    np.save(os.path.join(work, "st.npy"), ref.astype(np.float32))
    print(f"peer sentence-transformers sentences_per_s {len(texts) / dt:.1f} seconds {dt:.3f}",
          flush=True)

    # ONNX Runtime on the exported BertModel
    import onnxruntime as ort
    onnx_path = os.path.join(work, "minilm.onnx")
    opt_path = os.path.join(work, "minilm-opt.onnx")
    if not os.path.exists(onnx_path):
        bert = model[0].auto_model.eval()

        class Hidden(torch.nn.Module):  # keyword arguments: BertModel's order moves
            def __init__(self, m):
                super().__init__()
                self.m = m

            def forward(self, input_ids, attention_mask, token_type_ids):
                return self.m(input_ids=input_ids, attention_mask=attention_mask,
                              token_type_ids=token_type_ids).last_hidden_state

        dummy = tok(["hello world", "a longer second text"], padding=True, return_tensors="pt")
        torch.onnx.export(Hidden(bert), (dummy["input_ids"], dummy["attention_mask"],
                                         dummy["token_type_ids"]), onnx_path,
                          input_names=["input_ids", "attention_mask", "token_type_ids"],
                          output_names=["last_hidden_state"],
                          dynamic_axes={k: {0: "b", 1: "s"} for k in
                                        ["input_ids", "attention_mask", "token_type_ids",
                                         "last_hidden_state"]},
                          opset_version=17, dynamo=False)
    path = onnx_path
    try:
        from onnxruntime.transformers import optimizer
        if not os.path.exists(opt_path):
            m = optimizer.optimize_model(onnx_path, model_type="bert", num_heads=0, hidden_size=0)
            m.save_model_to_file(opt_path)
        path = opt_path
        print("peer ort optimizer: onnxruntime.transformers.optimizer (bert)", flush=True)
    except Exception as e:  # report and run the plain export
        print(f"peer ort optimizer unavailable ({e}); plain export", flush=True)
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    sess = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])

    order = np.argsort([-len(i) for i in feats["input_ids"]], kind="stable")

    def run_ort():
        out = np.zeros((len(texts), 384), np.float32)
        for b in range(0, len(texts), 32):
            idx = order[b:b + 32]
            L = max(len(feats["input_ids"][i]) for i in idx)
            ids = np.zeros((len(idx), L), np.int64)
            mask = np.zeros((len(idx), L), np.int64)
            for r, i in enumerate(idx):
                x = feats["input_ids"][i]
                ids[r, :len(x)] = x
                mask[r, :len(x)] = 1
            h = sess.run(None, {"input_ids": ids, "attention_mask": mask,
                                "token_type_ids": np.zeros_like(ids)})[0]
            m = mask[:, :, None].astype(np.float32)
            e = (h * m).sum(1) / np.clip(m.sum(1), 1e-9, None)
            out[idx] = e / np.maximum(np.linalg.norm(e, axis=1, keepdims=True), 1e-12)
        return out

    run_ort()  # warm-up and check
    t0 = time.perf_counter()
    got = run_ort()
    dt = time.perf_counter() - t0
    cos = (got * ref).sum(1).min()
    assert cos >= 0.9999, f"ORT disagrees with sentence-transformers: min cosine {cos}"
    print(f"peer onnxruntime sentences_per_s {len(texts) / dt:.1f} seconds {dt:.3f}", flush=True)


if __name__ == "__main__":
    main()
