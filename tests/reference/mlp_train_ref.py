#!/usr/bin/env python3
"""Independent NumPy (float64) training of examples/mlp.msl: the forward (LinearBias + relu
layers, a LinearBias head, mean cross-entropy), its backward written out by hand, global-norm
clipping as torch.nn.utils.clip_grad_norm_, and torch.optim's documented SGD (dampening 0),
Adam and AdamW algorithms, with the learning-rate schedules of mslc's LANGUAGE docs.

usage: mlp_train_ref.py WEIGHTS.safetensors DATA_DIR OUT_DIR --depth N --batch B --steps N
           --optimizer sgd|adam|adamw --lr LR [--momentum M] [--nesterov] [--betas B1 B2]
           [--eps E] [--weight-decay WD] [--no-decay-bias] [--clip MAX]
           [--schedule constant|warmup_cosine|warmup_linear --warmup W --total T --min-lr F]
           [--grad-accum K]

DATA_DIR holds images.npy [N, inputs] and labels.npy [N]; batches are taken in order. With
--grad-accum K a step takes K consecutive batches of B and follows PyTorch's accumulation
recipe: the gradients of each batch's loss / K are summed, then clipped and applied once; the
step's loss is the mean of its batches' losses. Writes
OUT_DIR/losses.npy (one loss per step), OUT_DIR/grads/PATH.npy (the first step's raw gradients)
and OUT_DIR/final/PATH.npy (the weights after the last step). Weights use mslc's paths:
layers.{i}.weight [out, in], layers.{i}.bias, head.weight, head.bias.
"""
import argparse
import math
import os

import numpy as np

from llama_ref import load_safetensors


def layer_names(depth):
    return [f"layers.{i}" for i in range(depth)] + ["head"]


def loss_and_grads(w, depth, x, labels):
    """Mean cross-entropy of the MLP and its gradient for every parameter."""
    acts = [x]
    pre = []
    h = x
    for name in layer_names(depth):
        z = h @ w[name + ".weight"].T + w[name + ".bias"]
        pre.append(z)
        h = np.maximum(z, 0.0) if name != "head" else z
        acts.append(h)
    logits = acts[-1]
    m = logits.max(axis=1, keepdims=True)
    logp = logits - m - np.log(np.exp(logits - m).sum(axis=1, keepdims=True))
    n = x.shape[0]
    loss = -logp[np.arange(n), labels].mean()
    dz = np.exp(logp)
    dz[np.arange(n), labels] -= 1.0
    dz /= n
    grads = {}
    names = layer_names(depth)
    for k in range(len(names) - 1, -1, -1):
        name = names[k]
        if name != "head":
            dz = dz * (pre[k] > 0.0)
        grads[name + ".weight"] = dz.T @ acts[k]
        grads[name + ".bias"] = dz.sum(axis=0)
        dz = dz @ w[name + ".weight"]
    return loss, grads


def schedule_lr(args, k):
    if args.schedule == "constant":
        return args.lr
    if k < args.warmup:
        return args.lr * k / args.warmup
    progress = min((k - args.warmup) / (args.total - args.warmup), 1.0)
    if args.schedule == "warmup_cosine":
        frac = 0.5 * (1.0 + math.cos(math.pi * progress))
    else:
        frac = 1.0 - progress
    return args.min_lr + (args.lr - args.min_lr) * frac


def main():
    p = argparse.ArgumentParser()
    p.add_argument("weights")
    p.add_argument("data")
    p.add_argument("out")
    p.add_argument("--depth", type=int, required=True)
    p.add_argument("--batch", type=int, required=True)
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--optimizer", required=True)
    p.add_argument("--lr", type=float, required=True)
    p.add_argument("--momentum", type=float, default=0.0)
    p.add_argument("--nesterov", action="store_true")
    p.add_argument("--betas", type=float, nargs=2, default=(0.9, 0.999))
    p.add_argument("--eps", type=float, default=1e-8)
    p.add_argument("--weight-decay", type=float, default=0.0)
    p.add_argument("--no-decay-bias", action="store_true")
    p.add_argument("--clip", type=float, default=None)
    p.add_argument("--schedule", default="constant")
    p.add_argument("--warmup", type=int, default=0)
    p.add_argument("--total", type=int, default=1)
    p.add_argument("--min-lr", type=float, default=0.0)
    p.add_argument("--grad-accum", type=int, default=1)
    args = p.parse_args()

    w = load_safetensors(args.weights)
    images = np.load(os.path.join(args.data, "images.npy")).astype(np.float64)
    labels = np.load(os.path.join(args.data, "labels.npy")).astype(np.int64)
    per_epoch = images.shape[0] // args.batch
    state = {name: {} for name in w}
    losses = []
    b1, b2 = args.betas
    micro = 0
    for k in range(args.steps):
        loss, grads = 0.0, {}
        for _ in range(args.grad_accum):
            first = (micro % per_epoch) * args.batch
            micro += 1
            x = images[first : first + args.batch]
            y = labels[first : first + args.batch]
            part, part_grads = loss_and_grads(w, args.depth, x, y)
            loss += part / args.grad_accum
            for name, g in part_grads.items():
                grads[name] = grads.get(name, 0.0) + g / args.grad_accum
        losses.append(loss)
        if k == 0:
            os.makedirs(os.path.join(args.out, "grads"), exist_ok=True)
            for name, g in grads.items():
                np.save(os.path.join(args.out, "grads", name + ".npy"), g)
        if args.clip is not None:
            total = math.sqrt(sum(float((g * g).sum()) for g in grads.values()))
            coef = min(args.clip / (total + 1e-6), 1.0)
            grads = {n: g * coef for n, g in grads.items()}
        lr = schedule_lr(args, k)
        t = k + 1
        for name in w:
            g = grads[name]
            wd = 0.0 if (args.no_decay_bias and name.endswith(".bias")) else args.weight_decay
            s = state[name]
            if args.optimizer == "sgd":
                if wd:
                    g = g + wd * w[name]
                if args.momentum:
                    buf = s.get("buf")
                    buf = g.copy() if buf is None else args.momentum * buf + g
                    s["buf"] = buf
                    g = g + args.momentum * buf if args.nesterov else buf
                w[name] = w[name] - lr * g
            else:
                if args.optimizer == "adamw":
                    w[name] = w[name] * (1.0 - lr * wd)
                elif wd:
                    g = g + wd * w[name]
                m = b1 * s.get("m", 0.0) + (1.0 - b1) * g
                v = b2 * s.get("v", 0.0) + (1.0 - b2) * g * g
                s["m"], s["v"] = m, v
                step_size = lr / (1.0 - b1**t)
                denom = np.sqrt(v) / math.sqrt(1.0 - b2**t) + args.eps
                w[name] = w[name] - step_size * m / denom
    np.save(os.path.join(args.out, "losses.npy"), np.array(losses))
    os.makedirs(os.path.join(args.out, "final"), exist_ok=True)
    for name, value in w.items():
        np.save(os.path.join(args.out, "final", name + ".npy"), value)


if __name__ == "__main__":
    main()
