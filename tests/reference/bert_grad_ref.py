#!/usr/bin/env python3
"""Gradients of Hugging Face BertModel (eval mode: no dropout) under examples/bert_base.msl's
`Distill` loss, mse(last_hidden_state, teacher) + mse(pooler_output, teacher_pooled), in float64
by JAX's autodiff of the forward written out here from HF's modeling_bert: embeddings (word +
token type + absolute position, LayerNorm), post-norm layers (separate query/key/value with
bias, softmax(q·kᵀ/√d)·v, output dense + residual + LayerNorm, exact-erf GeLU intermediate,
output dense + residual + LayerNorm), and the pooler tanh(dense(x[:, 0])). The ground truth for
`mslc train --dump-grads` on the example shrunk with --set.

usage: bert_grad_ref.py WEIGHTS.safetensors DATA_DIR OUT.safetensors --layers N --heads H
                        [--eps E]

DATA_DIR holds input_ids.npy, token_type_ids.npy [N, S], teacher.npy [N, S, H] and
teacher_pooled.npy [N, H]. OUT holds one f64 gradient per parameter (HF names) and `loss`.
"""
import argparse
import os

import jax

jax.config.update("jax_enable_x64", True)
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import llama_ref  # noqa: E402
import vit_ref  # noqa: E402
from llama_grad_ref import write_safetensors  # noqa: E402

# vit_ref's LayerNorm, traced by JAX: its NumPy calls go to jax.numpy.
vit_ref.np = jnp


def gelu(x):
    return 0.5 * x * (1.0 + jax.scipy.special.erf(x / jnp.sqrt(2.0)))


def linear(w, name, x):
    return x @ w[name + ".weight"].T + w[name + ".bias"]


def layer_norm(w, name, x, eps):
    return vit_ref.layer_norm(x, w[name + ".weight"], w[name + ".bias"], eps)


def attention(w, p, x, heads):
    b, s, hidden = x.shape
    d = hidden // heads

    def split(t):
        return t.reshape(b, s, heads, d).transpose(0, 2, 1, 3)

    q, k, v = (split(linear(w, p + "attention.self." + n, x)) for n in ("query", "key", "value"))
    probs = jax.nn.softmax(q @ k.transpose(0, 1, 3, 2) / jnp.sqrt(d), axis=-1)
    return (probs @ v).transpose(0, 2, 1, 3).reshape(b, s, hidden)


def forward(w, ids, types, layers, heads, eps):
    s = ids.shape[1]
    x = (
        w["embeddings.word_embeddings.weight"][ids]
        + w["embeddings.token_type_embeddings.weight"][types]
        + w["embeddings.position_embeddings.weight"][:s]
    )
    x = layer_norm(w, "embeddings.LayerNorm", x, eps)
    for i in range(layers):
        p = f"encoder.layer.{i}."
        a = linear(w, p + "attention.output.dense", attention(w, p, x, heads))
        h = layer_norm(w, p + "attention.output.LayerNorm", x + a, eps)
        o = linear(w, p + "output.dense", gelu(linear(w, p + "intermediate.dense", h)))
        x = layer_norm(w, p + "output.LayerNorm", h + o, eps)
    return x, jnp.tanh(linear(w, "pooler.dense", x[:, 0]))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("weights")
    ap.add_argument("data")
    ap.add_argument("out")
    ap.add_argument("--layers", type=int, required=True)
    ap.add_argument("--heads", type=int, required=True)
    ap.add_argument("--eps", type=float, default=1e-12)
    a = ap.parse_args()
    weights = {k: jnp.asarray(v) for k, v in llama_ref.load_safetensors(a.weights).items()}

    def load(name, dtype):
        return jnp.asarray(np.load(os.path.join(a.data, name + ".npy")).astype(dtype))

    ids, types = load("input_ids", np.int64), load("token_type_ids", np.int64)
    teacher, pooled = load("teacher", np.float64), load("teacher_pooled", np.float64)

    def loss(w):
        last, pool = forward(w, ids, types, a.layers, a.heads, a.eps)
        return jnp.mean((last - teacher) ** 2) + jnp.mean((pool - pooled) ** 2)

    value, grads = jax.value_and_grad(loss)(weights)
    out = {name: np.asarray(g) for name, g in grads.items()}
    out["loss"] = np.asarray(value)
    write_safetensors(a.out, out)


if __name__ == "__main__":
    main()
