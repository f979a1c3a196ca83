#!/usr/bin/env python3
"""Gradients of Hugging Face LlamaForCausalLM's next-token cross-entropy, in float64, by JAX's
autodiff through the NumPy forward of llama_ref.py (run on jax.numpy): the ground truth for
`mslc train --dump-grads` on examples/tiny_llama.msl.

usage: llama_grad_ref.py WEIGHTS.safetensors TOKENS.npy OUT.safetensors --layers N --heads H
                         [--kv-heads K] [--eps E] [--theta T]
                         [--steps N --batch B --lr LR --betas B1 B2 --weight-decay WD
                          --adam-eps E]

TOKENS is [N, S+1] as `mslc train --data tokens.npy` reads it: inputs [:, :-1], labels [:, 1:];
the loss is the mean over every position (PyTorch's cross_entropy). OUT holds one f64 tensor
per parameter (by its name): the gradient on the first batch (all of TOKENS unless --batch),
and `loss`. With --steps N it also trains N steps of torch.optim.AdamW's documented update
(decoupled decay, bias correction), in float64, on batches of B rows taken in order (an epoch
is N // B batches), and adds `losses`, each step's loss before its update.
"""
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
    ap = llama_ref.model_arguments()
    ap.add_argument("--steps", type=int, default=0)
    ap.add_argument("--batch", type=int)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--betas", type=float, nargs=2, default=(0.9, 0.999))
    ap.add_argument("--weight-decay", type=float, default=0.01)
    ap.add_argument("--adam-eps", type=float, default=1e-8)
    a = ap.parse_args()
    weights = {k: jnp.asarray(v) for k, v in llama_ref.load_safetensors(a.weights).items()}
    tokens = np.load(a.tokens).astype(np.int64)
    batch = a.batch or tokens.shape[0]

    def rows(k):
        first = (k % (tokens.shape[0] // batch)) * batch
        part = tokens[first : first + batch]
        return jnp.asarray(part[:, :-1]), jnp.asarray(part[:, 1:])

    def loss(w, inputs, labels):
        logits = llama_ref.forward(
            w, inputs, a.layers, a.heads, a.kv_heads or a.heads, a.eps, a.theta
        )
        lse = jax.scipy.special.logsumexp(logits, axis=-1)
        picked = jnp.take_along_axis(logits, labels[..., None], axis=-1)[..., 0]
        return jnp.mean(lse - picked)

    step = jax.jit(jax.value_and_grad(loss))
    value, grads = step(weights, *rows(0))
    out = {name: np.asarray(g) for name, g in grads.items()}
    out["loss"] = np.asarray(value)
    losses = []
    m = {n: jnp.zeros_like(w) for n, w in weights.items()}
    v = {n: jnp.zeros_like(w) for n, w in weights.items()}
    (b1, b2), lr, wd = a.betas, a.lr, a.weight_decay
    for k in range(a.steps):
        value, grads = step(weights, *rows(k))
        losses.append(float(value))
        t = k + 1
        for n, g in grads.items():
            p = weights[n] * (1.0 - lr * wd)
            m[n] = b1 * m[n] + (1.0 - b1) * g
            v[n] = b2 * v[n] + (1.0 - b2) * g * g
            denom = jnp.sqrt(v[n]) / np.sqrt(1.0 - b2**t) + a.adam_eps
            weights[n] = p - lr / (1.0 - b1**t) * m[n] / denom
    if a.steps:
        out["losses"] = np.array(losses)
    write_safetensors(a.out, out)


if __name__ == "__main__":
    main()
