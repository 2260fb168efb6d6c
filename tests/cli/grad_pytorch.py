#!/usr/bin/python3
"""grad_pytorch.py MHA SEED - `mha grad` against fresh random PyTorch modules.

For several configurations (self- and cross-attention, packed and separate
weights, bias_k/bias_v, zero attention, masks, causal, unbatched, --prefix)
draws a random nn.MultiheadAttention and an upstream gradient dY that are not
in the repository, runs `mha grad`, and checks every written tensor against
float64 autograd: max|g - ref| <= 1e-4 * max(1, max|ref|).  Also checks the
set of names in grad_weights.safetensors is exactly the module's parameters.
Prints one FAIL line per failure and "grad-pytorch: N passed, N failed".
"""
import json
import os
import struct
import subprocess
import sys
import tempfile

import numpy as np
import torch


def save_st(path, tensors):
    header, off, blobs = {}, 0, []
    for name in sorted(tensors):
        raw = np.ascontiguousarray(tensors[name], dtype='<f4').tobytes()
        header[name] = {'dtype': 'F32', 'shape': list(tensors[name].shape),
                        'data_offsets': [off, off + len(raw)]}
        off += len(raw)
        blobs.append(raw)
    h = json.dumps(header, separators=(',', ':')).encode()
    h += b' ' * ((8 - len(h) % 8) % 8)
    with open(path, 'wb') as f:
        f.write(struct.pack('<Q', len(h)) + h + b''.join(blobs))


def load_st(path):
    with open(path, 'rb') as f:
        data = f.read()
    n = struct.unpack('<Q', data[:8])[0]
    header = json.loads(data[8:8 + n])
    out = {}
    for name, info in header.items():
        if name == '__metadata__':
            continue
        a, b = info['data_offsets']
        out[name] = np.frombuffer(data[8 + n + a:8 + n + b], dtype='<f4').reshape(info['shape'])
    return out


def rel_err(y, ref):
    return float(np.max(np.abs(y.astype(np.float64) - ref)) / max(1.0, float(np.max(np.abs(ref)))))


def main():
    mha, seed = sys.argv[1], int(sys.argv[2])
    rng = np.random.default_rng(seed)
    torch.manual_seed(seed)
    passed = failed = 0
    configs = [
        dict(E=8, H=2, B=2, L=5, S=7, self=False, kdim=8, vdim=8),
        dict(E=6, H=3, B=3, L=4, S=4, self=True, causal=True),
        dict(E=6, H=2, B=2, L=3, S=5, self=False, kdim=5, vdim=7, bias_kv=True, kpm=True),
        dict(E=9, H=3, B=1, L=6, S=6, self=True, zero=True, mask='bool'),
        dict(E=4, H=1, B=0, L=5, S=3, self=False, kdim=4, vdim=4, mask='float', bias=False),
        dict(E=12, H=4, B=2, L=7, S=9, self=False, kdim=12, vdim=12, prefix='self_attn.',
             bias_kv=True, zero=True, kpm=True),
    ]
    with tempfile.TemporaryDirectory() as tmp:
        for ci, c in enumerate(configs):
            E, H, L = c['E'], c['H'], c['L']
            S = L if c['self'] else c['S']
            batched = c['B'] > 0
            B = c['B'] if batched else 1
            lead = (B,) if batched else ()
            kdim, vdim = (E, E) if c['self'] else (c['kdim'], c['vdim'])
            mod = torch.nn.MultiheadAttention(E, H, bias=c.get('bias', True),
                                              add_bias_kv=c.get('bias_kv', False),
                                              add_zero_attn=c.get('zero', False), kdim=kdim,
                                              vdim=vdim, batch_first=True)
            with torch.no_grad():
                for p in mod.parameters():
                    p.copy_(torch.tensor(rng.standard_normal(tuple(p.shape)).astype(np.float32) * 0.5))
            prefix = c.get('prefix', '')
            save_st(os.path.join(tmp, 'w.safetensors'),
                    {prefix + n: p.detach().numpy() for n, p in mod.named_parameters()})
            mod = mod.double()
            args = [mha, 'grad', '--weights', os.path.join(tmp, 'w.safetensors'), '--heads', str(H)]
            if prefix:
                args += ['--prefix', prefix]
            q = rng.standard_normal(lead + (L, E)).astype(np.float32)
            np.save(os.path.join(tmp, 'q.npy'), q)
            args += ['--query', os.path.join(tmp, 'q.npy')]
            tq = torch.tensor(q, dtype=torch.float64, requires_grad=True)
            if c['self']:
                tk = tv = tq
            else:
                k = rng.standard_normal(lead + (S, kdim)).astype(np.float32)
                v = rng.standard_normal(lead + (S, vdim)).astype(np.float32)
                np.save(os.path.join(tmp, 'k.npy'), k)
                np.save(os.path.join(tmp, 'v.npy'), v)
                args += ['--key', os.path.join(tmp, 'k.npy'), '--value', os.path.join(tmp, 'v.npy')]
                tk = torch.tensor(k, dtype=torch.float64, requires_grad=True)
                tv = torch.tensor(v, dtype=torch.float64, requires_grad=True)
            kpm = am = None
            if c.get('kpm'):
                m = rng.random(lead + (S,)) < 0.3
                m[..., 0] = False
                np.save(os.path.join(tmp, 'kpm.npy'), m)
                args += ['--key-padding-mask', os.path.join(tmp, 'kpm.npy')]
                kpm = torch.tensor(m)
            if c.get('mask') == 'bool':
                m = rng.random((L, S)) < 0.3
                m[:, 0] = False
                np.save(os.path.join(tmp, 'am.npy'), m)
                args += ['--attn-mask', os.path.join(tmp, 'am.npy')]
                am = torch.tensor(m)
            elif c.get('mask') == 'float':
                m = rng.standard_normal((L, S)).astype(np.float32)
                np.save(os.path.join(tmp, 'am.npy'), m)
                args += ['--attn-mask', os.path.join(tmp, 'am.npy')]
                am = torch.tensor(m, dtype=torch.float64)
            if c.get('causal'):
                args += ['--causal']
                cm = torch.ones(L, S, dtype=torch.bool).tril().logical_not()
                am = cm if am is None else (am | cm if am.dtype == torch.bool
                                            else am.masked_fill(cm, float('-inf')))
            if c.get('zero'):
                args += ['--add-zero-attn']
            out, _ = mod(tq, tk, tv, key_padding_mask=kpm, attn_mask=am, need_weights=False)
            dy = rng.standard_normal(tuple(out.shape)).astype(np.float32)
            np.save(os.path.join(tmp, 'dy.npy'), dy)
            (out * torch.tensor(dy, dtype=torch.float64)).sum().backward()
            od = os.path.join(tmp, 'out%d' % ci)
            args += ['--grad-out', os.path.join(tmp, 'dy.npy'), '--out-dir', od]
            r = subprocess.run(args, capture_output=True, text=True)
            if r.returncode != 0:
                print('FAIL: config %d: exit %d: %s' % (ci, r.returncode, r.stderr.strip()))
                failed += 1
                continue
            refs = {'grad_query': tq.grad.numpy()}
            if not c['self']:
                refs['grad_key'] = tk.grad.numpy()
                refs['grad_value'] = tv.grad.numpy()
            for name, ref in refs.items():
                path = os.path.join(od, name + '.npy')
                e = rel_err(np.load(path), ref) if os.path.exists(path) else float('inf')
                if e <= 1e-4:
                    passed += 1
                else:
                    print('FAIL: config %d: %s error %.3g' % (ci, name, e))
                    failed += 1
            if c['self'] and os.path.exists(os.path.join(od, 'grad_key.npy')):
                print('FAIL: config %d: grad_key.npy written for self-attention' % ci)
                failed += 1
            got = load_st(os.path.join(od, 'grad_weights.safetensors'))
            want = {prefix + n: p.grad.numpy() for n, p in mod.named_parameters()}
            if sorted(got) != sorted(want):
                print('FAIL: config %d: names %s, want %s' % (ci, sorted(got), sorted(want)))
                failed += 1
                continue
            for name, ref in want.items():
                e = rel_err(got[name].reshape(ref.shape), ref)
                if e <= 1e-4:
                    passed += 1
                else:
                    print('FAIL: config %d: %s error %.3g' % (ci, name, e))
                    failed += 1
    print('grad-pytorch: %d passed, %d failed' % (passed, failed))
    return 1 if failed else 0


if __name__ == '__main__':
    sys.exit(main())
