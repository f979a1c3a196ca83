#!/usr/bin/env python3
"""Training-mode BatchNorm, as PyTorch's `model.train()`, in float64: SGD steps of a small
convolutional classifier (tests/it/train_mode.rs writes the matching .msl), with JAX's autodiff
for the gradients (through the batch statistics) and torch.nn.BatchNorm2d's documented
train-mode semantics written out here:

- y = (x - mean_b) / sqrt(var_b + eps) * weight + bias, with mean_b and the *biased* var_b over
  (N, H, W) per channel;
- running_mean <- (1 - momentum) * running_mean + momentum * mean_b, and running_var likewise
  with the *unbiased* batch variance var_b * n / (n - 1), n = N * H * W.

Model: conv.weight [C, Cin, 3, 3] (padding 1, no bias) -> bn (BatchNorm2d) -> relu -> flatten
-> head (Linear with bias) -> mean cross-entropy. Optimizer: torch.optim.SGD with momentum
(dampening 0, no weight decay).

usage: train_mode_ref.py WEIGHTS.safetensors DATA_DIR OUT_DIR --batch B --steps N --lr LR
                         --momentum M --bn-momentum M [--eps E] [--eval IMAGES.npy]

DATA_DIR holds images.npy [N, Cin, H, W] and labels.npy [N]; batches are taken in order.
Writes OUT_DIR/losses.npy, OUT_DIR/grads/PATH.npy (the first step's gradients) and
OUT_DIR/final/PATH.npy (every parameter and running statistic after the last step). With
--eval, also OUT_DIR/eval_logits.npy: the final model's logits on IMAGES in eval mode (the
BatchNorm normalising with its running statistics), what `mslc run` computes.
"""
import argparse
import os

import jax

jax.config.update("jax_enable_x64", True)
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from llama_ref import load_safetensors  # noqa: E402

PARAMS = ["conv.weight", "bn.weight", "bn.bias", "head.weight", "head.bias"]


def forward(w, x, eps, running=None):
    """The logits and the statistics (mean, variance) the BatchNorm used: the batch's (train
    mode, the biased variance) or the `running` pair given (eval mode)."""
    c = jax.lax.conv_general_dilated(x, w["conv.weight"], (1, 1), [(1, 1), (1, 1)])
    if running is None:
        mean = jnp.mean(c, axis=(0, 2, 3))
        var = jnp.mean((c - mean[None, :, None, None]) ** 2, axis=(0, 2, 3))
    else:
        mean, var = running
    n = (c - mean[None, :, None, None]) / jnp.sqrt(var[None, :, None, None] + eps)
    h = jnp.maximum(n * w["bn.weight"][None, :, None, None] + w["bn.bias"][None, :, None, None], 0)
    h = h.reshape(h.shape[0], -1)
    return h @ w["head.weight"].T + w["head.bias"], (mean, var)


def loss_fn(w, x, labels, eps):
    logits, stats = forward(w, x, eps)
    lse = jax.scipy.special.logsumexp(logits, axis=-1)
    picked = jnp.take_along_axis(logits, labels[:, None], axis=-1)[:, 0]
    return jnp.mean(lse - picked), stats


def main():
    p = argparse.ArgumentParser()
    p.add_argument("weights")
    p.add_argument("data")
    p.add_argument("out")
    p.add_argument("--batch", type=int, required=True)
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--lr", type=float, required=True)
    p.add_argument("--momentum", type=float, required=True)
    p.add_argument("--bn-momentum", type=float, required=True)
    p.add_argument("--eps", type=float, default=1e-5)
    p.add_argument("--eval")
    a = p.parse_args()

    loaded = load_safetensors(a.weights)
    w = {k: jnp.asarray(loaded[k]) for k in PARAMS}
    running_mean = np.asarray(loaded.get("bn.running_mean", np.zeros(w["bn.weight"].shape)))
    running_var = np.asarray(loaded.get("bn.running_var", np.ones(w["bn.weight"].shape)))
    images = np.load(os.path.join(a.data, "images.npy")).astype(np.float64)
    labels = np.load(os.path.join(a.data, "labels.npy")).astype(np.int64)
    per_epoch = images.shape[0] // a.batch
    grad_fn = jax.jit(jax.value_and_grad(loss_fn, has_aux=True), static_argnums=3)
    bufs, losses = {}, []
    for k in range(a.steps):
        first = (k % per_epoch) * a.batch
        x = jnp.asarray(images[first : first + a.batch])
        y = jnp.asarray(labels[first : first + a.batch])
        (loss, (mean, var)), grads = grad_fn(w, x, y, a.eps)
        losses.append(float(loss))
        if k == 0:
            os.makedirs(os.path.join(a.out, "grads"), exist_ok=True)
            for name, g in grads.items():
                np.save(os.path.join(a.out, "grads", name + ".npy"), np.asarray(g))
        n = x.shape[0] * x.shape[2] * x.shape[3]
        m = a.bn_momentum
        running_mean = (1 - m) * running_mean + m * np.asarray(mean)
        running_var = (1 - m) * running_var + m * np.asarray(var) * n / (n - 1)
        for name in PARAMS:
            g = grads[name]
            buf = bufs.get(name)
            buf = g if buf is None else a.momentum * buf + g
            bufs[name] = buf
            w[name] = w[name] - a.lr * buf
    np.save(os.path.join(a.out, "losses.npy"), np.array(losses))
    final = os.path.join(a.out, "final")
    os.makedirs(final, exist_ok=True)
    for name, value in w.items():
        np.save(os.path.join(final, name + ".npy"), np.asarray(value))
    np.save(os.path.join(final, "bn.running_mean.npy"), running_mean)
    np.save(os.path.join(final, "bn.running_var.npy"), running_var)
    if a.eval:
        x = jnp.asarray(np.load(a.eval).astype(np.float64))
        logits, _ = forward(w, x, a.eps, (jnp.asarray(running_mean), jnp.asarray(running_var)))
        np.save(os.path.join(a.out, "eval_logits.npy"), np.asarray(logits))


if __name__ == "__main__":
    main()
