#!/usr/bin/env python3
"""Independent NumPy implementation of torchvision's VisionTransformer forward pass (float64,
eval mode): the ground truth for mslc's executor on examples/vit_b16.msl.

usage: vit_ref.py WEIGHTS.safetensors IMAGES.npy OUT_LOGITS.npy --layers N --heads H
                  --patch P [--eps E]

Weights use torchvision's names (class_token, conv_proj.weight, encoder.pos_embedding,
encoder.layers.encoder_layer_{i}.self_attention.in_proj_weight, ..., heads.head.bias). The
patch convolution (kernel = stride = P) is computed as a matmul over flattened patches.
"""
import argparse
import math

import numpy as np

from llama_ref import load_safetensors

erf = np.vectorize(math.erf)


def layer_norm(x, w, b, eps):
    mean = x.mean(axis=-1, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=-1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * w + b


def gelu(x):
    return 0.5 * x * (1.0 + erf(x / np.sqrt(2.0)))


def patchify(images, w, b, patch):
    # torch: conv_proj(x) [B, H, g, g] -> reshape [B, H, g*g] -> permute [B, g*g, H]
    n, c, r, _ = images.shape
    g = r // patch
    t = images.reshape(n, c, g, patch, g, patch).transpose(0, 2, 4, 1, 3, 5)
    t = t.reshape(n, g * g, c * patch * patch)
    return t @ w.reshape(w.shape[0], -1).T + b


def self_attention(x, w_in, b_in, w_out, b_out, heads):
    # torch.nn.MultiheadAttention(x, x, x): packed in_proj rows are q, k, v.
    b, s, hidden = x.shape
    d = hidden // heads
    q, k, v = np.split(x @ w_in.T + b_in, 3, axis=-1)

    def split_heads(t):
        return t.reshape(b, s, heads, d).transpose(0, 2, 1, 3)

    scores = split_heads(q) @ split_heads(k).transpose(0, 1, 3, 2) / np.sqrt(d)
    scores = scores - scores.max(axis=-1, keepdims=True)
    p = np.exp(scores)
    o = (p / p.sum(axis=-1, keepdims=True)) @ split_heads(v)
    return o.transpose(0, 2, 1, 3).reshape(b, s, hidden) @ w_out.T + b_out


def forward(w, images, layers, heads, patch, eps):
    x = patchify(images, w["conv_proj.weight"], w["conv_proj.bias"], patch)
    cls = np.broadcast_to(w["class_token"], (x.shape[0], 1, x.shape[2]))
    x = np.concatenate([cls, x], axis=1) + w["encoder.pos_embedding"]
    for i in range(layers):
        p = f"encoder.layers.encoder_layer_{i}."
        a = layer_norm(x, w[p + "ln_1.weight"], w[p + "ln_1.bias"], eps)
        x = x + self_attention(
            a,
            w[p + "self_attention.in_proj_weight"],
            w[p + "self_attention.in_proj_bias"],
            w[p + "self_attention.out_proj.weight"],
            w[p + "self_attention.out_proj.bias"],
            heads,
        )
        y = layer_norm(x, w[p + "ln_2.weight"], w[p + "ln_2.bias"], eps)
        y = gelu(y @ w[p + "mlp.0.weight"].T + w[p + "mlp.0.bias"])
        x = x + y @ w[p + "mlp.3.weight"].T + w[p + "mlp.3.bias"]
    x = layer_norm(x, w["encoder.ln.weight"], w["encoder.ln.bias"], eps)
    return x[:, 0] @ w["heads.head.weight"].T + w["heads.head.bias"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("weights")
    ap.add_argument("images")
    ap.add_argument("out")
    ap.add_argument("--layers", type=int, required=True)
    ap.add_argument("--heads", type=int, required=True)
    ap.add_argument("--patch", type=int, required=True)
    ap.add_argument("--eps", type=float, default=1e-6)
    a = ap.parse_args()
    w = load_safetensors(a.weights)
    images = np.load(a.images).astype(np.float64)
    np.save(a.out, forward(w, images, a.layers, a.heads, a.patch, a.eps))


if __name__ == "__main__":
    main()
