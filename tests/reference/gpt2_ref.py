#!/usr/bin/env python3
"""Independent NumPy implementation of Hugging Face GPT2Model's forward pass (float64), plus the
tied-embedding logits of GPT2LMHeadModel: the ground truth for mslc's executor on
examples/gpt2.msl.

usage: gpt2_ref.py WEIGHTS.safetensors INPUT_IDS.npy OUT_HIDDEN.npy OUT_LOGITS.npy
                   --layers N --heads H [--eps E]

Weights use HF names (wte.weight, wpe.weight, h.{i}.ln_1.weight, h.{i}.attn.c_attn.weight, ...,
ln_f.bias). GPT-2's Conv1D stores its weight [in_features, out_features]: y = x @ W + b.
"""
import argparse

import numpy as np

from llama_ref import load_safetensors


def layer_norm(x, w, b, eps):
    mean = x.mean(axis=-1, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=-1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * w + b


def gelu_new(x):
    # HF's NewGELUActivation: the tanh approximation.
    return 0.5 * x * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (x + 0.044715 * x**3)))


def conv1d(x, w, b):
    return x @ w + b


def causal_attention(q, k, v):
    # q, k, v: [B, heads, S, D]
    s, d = q.shape[-2], q.shape[-1]
    scores = q @ k.transpose(0, 1, 3, 2) / np.sqrt(d)
    scores = np.where(np.triu(np.ones((s, s), dtype=bool), k=1), -np.inf, scores)
    scores = scores - scores.max(axis=-1, keepdims=True)
    p = np.exp(scores)
    return (p / p.sum(axis=-1, keepdims=True)) @ v


def forward(w, ids, layers, heads, eps):
    b, s = ids.shape
    x = w["wte.weight"][ids] + w["wpe.weight"][:s]
    hidden = x.shape[-1]
    d = hidden // heads

    def split_heads(t):
        return t.reshape(b, s, heads, d).transpose(0, 2, 1, 3)

    for i in range(layers):
        p = f"h.{i}."
        n = layer_norm(x, w[p + "ln_1.weight"], w[p + "ln_1.bias"], eps)
        qkv = conv1d(n, w[p + "attn.c_attn.weight"], w[p + "attn.c_attn.bias"])
        q, k, v = np.split(qkv, 3, axis=-1)
        o = causal_attention(split_heads(q), split_heads(k), split_heads(v))
        o = o.transpose(0, 2, 1, 3).reshape(b, s, hidden)
        x = x + conv1d(o, w[p + "attn.c_proj.weight"], w[p + "attn.c_proj.bias"])
        n = layer_norm(x, w[p + "ln_2.weight"], w[p + "ln_2.bias"], eps)
        m = gelu_new(conv1d(n, w[p + "mlp.c_fc.weight"], w[p + "mlp.c_fc.bias"]))
        x = x + conv1d(m, w[p + "mlp.c_proj.weight"], w[p + "mlp.c_proj.bias"])
    x = layer_norm(x, w["ln_f.weight"], w["ln_f.bias"], eps)
    return x, x @ w["wte.weight"].T


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("weights")
    ap.add_argument("input_ids")
    ap.add_argument("out_hidden")
    ap.add_argument("out_logits")
    ap.add_argument("--layers", type=int, required=True)
    ap.add_argument("--heads", type=int, required=True)
    ap.add_argument("--eps", type=float, default=1e-5)
    a = ap.parse_args()
    w = load_safetensors(a.weights)
    ids = np.load(a.input_ids).astype(np.int64)
    hidden, logits = forward(w, ids, a.layers, a.heads, a.eps)
    np.save(a.out_hidden, hidden)
    np.save(a.out_logits, logits)


if __name__ == "__main__":
    main()
