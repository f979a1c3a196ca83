# The ops that take more than one expression, each with mslc's meaning (docs/ops.md).


def _softplus(x):
    """PyTorch's defaults (beta 1, threshold 20): the identity above 20."""
    return jnp.where(x > 20, x, jnp.log1p(jnp.exp(jnp.minimum(x, 20))))


def _rms_norm(x, eps):
    """x * rsqrt(mean(x^2, -1) + eps), no scale."""
    return x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + eps)


def _layer_norm(x, eps):
    """(x - mean) * rsqrt(var + eps) over the last dim, biased variance, no affine."""
    mean = jnp.mean(x, axis=-1, keepdims=True)
    centered = x - mean
    var = jnp.mean(centered * centered, axis=-1, keepdims=True)
    return centered * jax.lax.rsqrt(var + eps)


def _batch_norm(x, mean, var, eps):
    """Inference normalisation of x [N, C, ...] by per-channel statistics, no affine."""
    shape = (1, x.shape[1]) + (1,) * (x.ndim - 2)
    return (x - mean.reshape(shape)) / jnp.sqrt(var.reshape(shape) + eps)


def _rope(x, theta):
    """Rotate-half rotary embedding (HF LLaMA) of x [B, S, heads, D], positions 0..S."""
    s, d = x.shape[1], x.shape[3]
    half = d // 2
    pos = np.arange(s, dtype=np.float64)[:, None]
    inv = theta ** (-2.0 * np.arange(half, dtype=np.float64) / d)
    angle = pos * inv[None, :]
    cos = jnp.asarray(np.cos(angle)[None, :, None, :], dtype=x.dtype)
    sin = jnp.asarray(np.sin(angle)[None, :, None, :], dtype=x.dtype)
    x1, x2 = x[..., :half], x[..., half:]
    return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)


def _attention(q, k, v, causal, scale):
    """softmax(q k^T * scale [+ causal mask]) v over q [B, S, Hq, D], k and v [B, T, Hkv, D];
    query head h reads kv head h // (Hq / Hkv); causal aligns the last query with the last key;
    a query that sees no key gives zeros."""
    s, t, hq, hkv = q.shape[1], k.shape[1], q.shape[2], k.shape[2]
    if hq != hkv:
        k = jnp.repeat(k, hq // hkv, axis=2)
        v = jnp.repeat(v, hq // hkv, axis=2)
    scores = jnp.einsum("bshd,bthd->bhst", q, k) * scale
    if causal:
        visible = (np.arange(t)[None, :] + s) <= (np.arange(s)[:, None] + t)
        masked = jnp.where(visible, scores, -jnp.inf)
        top = jnp.max(masked, axis=-1, keepdims=True)
        top = jax.lax.stop_gradient(jnp.where(jnp.isfinite(top), top, 0.0))
        weights = jnp.exp(masked - top)
        total = jnp.sum(weights, axis=-1, keepdims=True)
        weights = weights / jnp.where(total > 0, total, 1.0)
    else:
        weights = jax.nn.softmax(scores, axis=-1)
    return jnp.einsum("bhst,bthd->bshd", weights, v)


def _causal_mask(size, dtype):
    """[size, size]: 0 on and below the diagonal, -inf above."""
    above = np.arange(size)[None, :] > np.arange(size)[:, None]
    return jnp.asarray(np.where(above, -np.inf, 0.0), dtype=dtype)


def _pool_padding(padding):
    return ((0, 0), (0, 0), (padding[0], padding[0]), (padding[1], padding[1]))


def _max_pool2d(x, kernel, stride, padding):
    """Max over each window of x [N, C, H, W], padding with -inf (PyTorch)."""
    return jax.lax.reduce_window(
        x, -jnp.inf, jax.lax.max, (1, 1) + kernel, (1, 1) + stride, _pool_padding(padding)
    )


def _avg_pool2d(x, kernel, stride, padding):
    """Mean over each window of x [N, C, H, W], padding counted (PyTorch's default)."""
    total = jax.lax.reduce_window(
        x, 0.0, jax.lax.add, (1, 1) + kernel, (1, 1) + stride, _pool_padding(padding)
    )
    return total / (kernel[0] * kernel[1])


def _adaptive_avg_pool2d(x, output):
    """Cell (i, j) averages rows [floor(i H / oh), ceil((i + 1) H / oh)) and the matching
    columns (PyTorch's bins)."""
    h, w = x.shape[2], x.shape[3]
    oh, ow = output
    rows = []
    for i in range(oh):
        y0, y1 = (i * h) // oh, -((-(i + 1) * h) // oh)
        cells = []
        for j in range(ow):
            x0, x1 = (j * w) // ow, -((-(j + 1) * w) // ow)
            cells.append(jnp.mean(x[:, :, y0:y1, x0:x1], axis=(2, 3)))
        rows.append(jnp.stack(cells, axis=-1))
    return jnp.stack(rows, axis=-2)


def _cross_entropy(logits, labels, ignore_index, smoothing):
    """PyTorch's: the mean over positions not labelled ignore_index (NaN when all are) of
    (1 - e) * nll + e * mean over classes of -log p."""
    logp = jax.nn.log_softmax(logits, axis=-1)
    counted = labels != ignore_index
    safe = jnp.where(counted, labels, 0).astype(jnp.int32)
    nll = -jnp.take_along_axis(logp, safe[..., None], axis=-1)[..., 0]
    per = (1.0 - smoothing) * nll
    if smoothing != 0.0:
        per = per + smoothing * -jnp.mean(logp, axis=-1)
    per = jnp.where(counted, per, 0.0)
    return jnp.sum(per) / jnp.sum(counted).astype(logits.dtype)
