#!/usr/bin/env python3
"""Gradients of Hugging Face LlamaForCausalLM's next-token cross-entropy, in float64, by JAX's
autodiff through the NumPy forward of llama_ref.py (run on jax.numpy): the ground truth for
`mslc train --dump-grads` on examples/tiny_llama.msl.

usage: llama_grad_ref.py WEIGHTS.safetensors TOKENS.npy OUT.safetensors --layers N --heads H
                         [--kv-heads K] [--eps E] [--theta T]

TOKENS is [N, S+1] as `mslc train --data tokens.npy` reads it: inputs [:, :-1], labels [:, 1:];
the loss is the mean over every position (PyTorch's cross_entropy). OUT holds one f64 tensor
per parameter (by its name) and `loss`.
"""
import argparse
import json
import struct

import jax

jax.config.update("jax_enable_x64", True)
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import llama_ref  # noqa: E402

# The reference forward, traced by JAX: its NumPy calls go to jax.numpy.
llama_ref.np = jnp


def write_safetensors(path, tensors):
    header, blobs, offset = {}, [], 0
    for name, array in tensors.items():
        data = np.ascontiguousarray(array, dtype="<f8").tobytes()
        header[name] = {
            "dtype": "F64",
            "shape": list(np.shape(array)),
            "data_offsets": [offset, offset + len(data)],
        }
        blobs.append(data)
        offset += len(data)
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)) + raw + b"".join(blobs))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("weights")
    ap.add_argument("tokens")
    ap.add_argument("out")
    ap.add_argument("--layers", type=int, required=True)
    ap.add_argument("--heads", type=int, required=True)
    ap.add_argument("--kv-heads", type=int)
    ap.add_argument("--eps", type=float, default=1e-6)
    ap.add_argument("--theta", type=float, default=10000.0)
    a = ap.parse_args()
    weights = {k: jnp.asarray(v) for k, v in llama_ref.load_safetensors(a.weights).items()}
    tokens = np.load(a.tokens).astype(np.int64)
    inputs, labels = jnp.asarray(tokens[:, :-1]), jnp.asarray(tokens[:, 1:])

    def loss(w):
        logits = llama_ref.forward(
            w, inputs, a.layers, a.heads, a.kv_heads or a.heads, a.eps, a.theta
        )
        lse = jax.scipy.special.logsumexp(logits, axis=-1)
        picked = jnp.take_along_axis(logits, labels[..., None], axis=-1)[..., 0]
        return jnp.mean(lse - picked)

    value, grads = jax.value_and_grad(loss)(weights)
    out = {name: np.asarray(g) for name, g in grads.items()}
    out["loss"] = np.asarray(value)
    write_safetensors(a.out, out)


if __name__ == "__main__":
    main()
