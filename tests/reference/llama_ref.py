#!/usr/bin/env python3
"""Independent NumPy implementation of Hugging Face LlamaForCausalLM's forward pass (float64),
the ground truth for mslc's executor on examples/tiny_llama.msl.

usage: llama_ref.py WEIGHTS.safetensors TOKENS.npy OUT.npy --layers N --heads H
                    [--kv-heads K] [--eps E] [--theta T]

Weights use HF names (model.embed_tokens.weight, model.layers.{i}.self_attn.q_proj.weight, ...,
lm_head.weight); Linear weights are [out_features, in_features]. The .safetensors file is parsed
here directly (8-byte header length, JSON header, raw little-endian data).
"""
import argparse
import json
import struct

import numpy as np

DTYPES = {"F32": "<f4", "F16": "<f2", "F64": "<f8", "I32": "<i4", "I64": "<i8"}


def load_safetensors(path):
    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + n])
    data = raw[8 + n :]
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        start, end = info["data_offsets"]
        arr = np.frombuffer(data[start:end], dtype=DTYPES[info["dtype"]])
        out[name] = arr.reshape(info["shape"]).astype(np.float64)
    return out


def rms_norm(x, w, eps):
    var = np.mean(x * x, axis=-1, keepdims=True)
    return x / np.sqrt(var + eps) * w


def rotate_half(x):
    half = x.shape[-1] // 2
    return np.concatenate([-x[..., half:], x[..., :half]], axis=-1)


def rope(x, theta):
    # x: [B, S, H, D]; HF: inv_freq = 1 / theta^(2i/D), emb = cat(freqs, freqs)
    _, s, _, d = x.shape
    inv_freq = 1.0 / theta ** (np.arange(0, d, 2, dtype=np.float64) / d)
    freqs = np.outer(np.arange(s, dtype=np.float64), inv_freq)
    emb = np.concatenate([freqs, freqs], axis=-1)  # [S, D]
    cos = np.cos(emb)[None, :, None, :]
    sin = np.sin(emb)[None, :, None, :]
    return x * cos + rotate_half(x) * sin


def attention(q, k, v):
    # q [B, S, Hq, D], k/v [B, S, Hkv, D]; causal; GQA repeats kv heads.
    b, s, hq, d = q.shape
    hkv = k.shape[2]
    rep = hq // hkv
    k = np.repeat(k, rep, axis=2)
    v = np.repeat(v, rep, axis=2)
    qh = q.transpose(0, 2, 1, 3)
    kh = k.transpose(0, 2, 1, 3)
    vh = v.transpose(0, 2, 1, 3)
    scores = qh @ kh.transpose(0, 1, 3, 2) / np.sqrt(d)
    mask = np.triu(np.ones((s, s), dtype=bool), k=1)
    scores = np.where(mask, -np.inf, scores)
    scores = scores - scores.max(axis=-1, keepdims=True)
    p = np.exp(scores)
    p = p / p.sum(axis=-1, keepdims=True)
    return (p @ vh).transpose(0, 2, 1, 3)


def silu(x):
    return x / (1.0 + np.exp(-x))


def forward(w, tokens, layers, heads, kv_heads, eps, theta):
    x = w["model.embed_tokens.weight"][tokens]
    b, s, hidden = x.shape
    d = hidden // heads
    for i in range(layers):
        p = f"model.layers.{i}."
        n = rms_norm(x, w[p + "input_layernorm.weight"], eps)
        q = (n @ w[p + "self_attn.q_proj.weight"].T).reshape(b, s, heads, d)
        k = (n @ w[p + "self_attn.k_proj.weight"].T).reshape(b, s, kv_heads, d)
        v = (n @ w[p + "self_attn.v_proj.weight"].T).reshape(b, s, kv_heads, d)
        o = attention(rope(q, theta), rope(k, theta), v).reshape(b, s, hidden)
        h = x + o @ w[p + "self_attn.o_proj.weight"].T
        n = rms_norm(h, w[p + "post_attention_layernorm.weight"], eps)
        gate = n @ w[p + "mlp.gate_proj.weight"].T
        up = n @ w[p + "mlp.up_proj.weight"].T
        x = h + (silu(gate) * up) @ w[p + "mlp.down_proj.weight"].T
    x = rms_norm(x, w["model.norm.weight"], eps)
    return x @ w["lm_head.weight"].T


def model_arguments():
    """The command line both LLaMA references share: weights, tokens, output and the config."""
    ap = argparse.ArgumentParser()
    ap.add_argument("weights")
    ap.add_argument("tokens")
    ap.add_argument("out")
    ap.add_argument("--layers", type=int, required=True)
    ap.add_argument("--heads", type=int, required=True)
    ap.add_argument("--kv-heads", type=int)
    ap.add_argument("--eps", type=float, default=1e-6)
    ap.add_argument("--theta", type=float, default=10000.0)
    return ap


def main():
    a = model_arguments().parse_args()
    w = load_safetensors(a.weights)
    tokens = np.load(a.tokens).astype(np.int64)
    logits = forward(w, tokens, a.layers, a.heads, a.kv_heads or a.heads, a.eps, a.theta)
    np.save(a.out, logits.astype(np.float64))


if __name__ == "__main__":
    main()
