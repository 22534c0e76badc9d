#!/usr/bin/python3
"""Writes the real model versions of `viper bench --only delta` (docs/BENCHMARKS.md, "Delta
updates"), as safetensors files in --out:

  sgd_0, sgd_1        an fp32 MLP classifier, trained a few Adam steps on a synthetic task (labels
                      from a fixed random teacher network), before and after one plain SGD step at
                      lr 1e-4 (case b): every parameter gets a gradient;
  frozen_0, frozen_1  the same network before and after one Adam step (lr 1e-4) with every other
                      layer frozen (case c): half the layers do not change at all.

Real training steps on a real network, not noise. Uses torch from Debian (/usr/bin/python3).

    /usr/bin/python3 bench/delta_models.py --out DIR [--params 32e6] [--seed 0]
"""
import argparse
import json
import os
import struct

import torch

DTYPES = {torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16"}


def save(path, state):
    """safetensors: 8-byte little-endian header length, JSON header (padded to 8), tensor bytes."""
    header, blobs, offset = {}, [], 0
    for name, tensor in state.items():
        t = tensor.detach().contiguous().cpu()
        raw = t.view(torch.int16).numpy().tobytes() if t.dtype == torch.bfloat16 else t.numpy().tobytes()
        header[name] = {"dtype": DTYPES[t.dtype], "shape": list(t.shape), "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    text = json.dumps(header, separators=(",", ":"))
    text += " " * ((8 - (8 + len(text)) % 8) % 8)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text.encode())
        for b in blobs:
            f.write(b)
    os.replace(tmp, path)


def network(width, inputs=1024, classes=100, layers=4):
    dims = [inputs] + [width] * (layers - 1) + [classes]
    mods = []
    for i in range(layers):
        mods.append(torch.nn.Linear(dims[i], dims[i + 1]))
        if i + 1 < layers:
            mods.append(torch.nn.GELU())
    return torch.nn.Sequential(*mods)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--params", type=float, default=32e6, help="parameters of the network (about)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--warmup-steps", type=int, default=5)
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    torch.manual_seed(args.seed)
    # 1024*w + 2*w*w + 100*w parameters with 4 layers: solve for the width.
    width = int((-(1124) + (1124 ** 2 + 8 * args.params) ** 0.5) / 4)
    teacher = network(64)
    x_all = torch.randn(4096, 1024)
    with torch.no_grad():
        y_all = teacher(x_all).argmax(dim=1)

    def batch(i, n=64):
        idx = torch.arange(i * n, (i + 1) * n) % x_all.shape[0]
        return x_all[idx], y_all[idx]

    def loss_of(net, i):
        x, y = batch(i)
        return torch.nn.functional.cross_entropy(net(x), y)

    def warm(net):
        opt = torch.optim.Adam(net.parameters(), lr=1e-3)
        for i in range(args.warmup_steps):
            opt.zero_grad()
            loss_of(net, i).backward()
            opt.step()

    net = network(width)
    warm(net)
    save(os.path.join(args.out, "sgd_0.safetensors"), net.state_dict())
    sgd = torch.optim.SGD(net.parameters(), lr=1e-4)
    sgd.zero_grad()
    loss_of(net, 100).backward()
    sgd.step()
    save(os.path.join(args.out, "sgd_1.safetensors"), net.state_dict())

    net = network(width)
    warm(net)
    linears = [m for m in net if isinstance(m, torch.nn.Linear)]
    for m in linears[::2]:  # layers 0 and 2 of 4: half the layers frozen
        for p in m.parameters():
            p.requires_grad_(False)
    save(os.path.join(args.out, "frozen_0.safetensors"), net.state_dict())
    adam = torch.optim.Adam([p for p in net.parameters() if p.requires_grad], lr=1e-4)
    adam.zero_grad()
    loss_of(net, 100).backward()
    adam.step()
    save(os.path.join(args.out, "frozen_1.safetensors"), net.state_dict())
    params = sum(p.numel() for p in net.parameters())
    print(f"delta_models: width {width}, {params} parameters ({params * 4 / 2**20:.0f} MiB fp32) in {args.out}")


if __name__ == "__main__":
    main()
