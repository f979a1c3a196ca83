# The runtime: weights, inputs, data, the mesh, the training step and loop, the command line.

_ST_DTYPES = {"F64": "<f8", "F32": "<f4", "F16": "<f2", "I64": "<i8", "I32": "<i4",
              "I16": "<i2", "I8": "i1", "U8": "u1", "BOOL": "?"}


def fail(message):
    print(f"error: {message}", file=sys.stderr)
    sys.exit(1)


def read_safetensors(path):
    """The tensors of a safetensors file by name, as NumPy arrays (BF16 widened to f32)."""
    try:
        with open(path, "rb") as f:
            data = f.read()
        (size,) = struct.unpack("<Q", data[:8])
        header = json.loads(data[8:8 + size])
    except (OSError, ValueError, struct.error) as e:
        fail(f"`{path}`: not a readable safetensors file ({e})")
    base = 8 + size
    tensors = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        start, end = info["data_offsets"]
        raw = data[base + start:base + end]
        if info["dtype"] == "BF16":
            bits = np.frombuffer(raw, "<u2").astype(np.uint32) << 16
            array = bits.view(np.float32)
        elif info["dtype"] in _ST_DTYPES:
            array = np.frombuffer(raw, _ST_DTYPES[info["dtype"]])
        else:
            fail(f"`{path}`: tensor `{name}` has dtype {info['dtype']}, which this program cannot read")
        tensors[name] = array.reshape(info["shape"])
    return tensors


def write_safetensors(path, tensors):
    """Writes f32 tensors by name, atomically (a temporary file renamed into place)."""
    header, chunks, offset = {}, [], 0
    for name in sorted(tensors):
        raw = np.ascontiguousarray(tensors[name], dtype="<f4").tobytes()
        header[name] = {"dtype": "F32", "shape": list(tensors[name].shape),
                        "data_offsets": [offset, offset + len(raw)]}
        chunks.append(raw)
        offset += len(raw)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    tmp = path + ".partial"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(chunks))
    os.replace(tmp, path)


def load_params(path):
    """The parameters from a safetensors file, by path, checked against PARAMS."""
    tensors = read_safetensors(path)
    params = {}
    for name, (dtype, shape, _) in PARAMS.items():
        if name not in tensors:
            fail(f"`{path}` has no tensor `{name}`")
        array = tensors[name]
        if tuple(array.shape) != tuple(shape):
            fail(f"`{path}`: `{name}` has shape {list(array.shape)}, the model needs {list(shape)}")
        params[name] = np.asarray(array, dtype=jnp.dtype(dtype))
    return params


def make_mesh():
    """The declared mesh over the first devices JAX has; None (one device) without a
    declaration or with too few devices."""
    if MESH is None:
        return None
    names = tuple(a for a, _ in MESH["axes"])
    sizes = tuple(n for _, n in MESH["axes"])
    need = math.prod(sizes)
    devices = jax.devices()
    if len(devices) < need:
        print(f"note: mesh `{MESH['name']}` needs {need} devices and JAX has {len(devices)}: "
              "running on one device", file=sys.stderr)
        return None
    return jax.sharding.Mesh(np.array(devices[:need]).reshape(sizes), names)


def param_spec(name):
    """Parameter `name`'s partition spec in the plan ([] where every device holds it all)."""
    return [] if MESH is None else MESH["params"].get(name, [])


def param_sharding(mesh, name):
    return jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(*param_spec(name)))


def state_spec(name):
    """How parameter `name`'s optimizer states (and, with `shard_grads`, its gradient) are
    laid out: over the data-parallel axis too when the plan shards the optimizer."""
    if MESH is None:
        return []
    return MESH["states"].get(name, param_spec(name))


def batch_sharding(mesh, array):
    """The batch's first dim over the data-parallel axes, when they divide it."""
    axes = tuple(MESH["batch"])
    size = math.prod(mesh.shape[a] for a in axes)
    if not axes or array.ndim == 0 or array.shape[0] % size != 0:
        return jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
    first = axes[0] if len(axes) == 1 else axes
    return jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(first))


def place_params(mesh, params):
    if mesh is None:
        return {n: jnp.asarray(a) for n, a in params.items()}
    return {n: jax.device_put(a, param_sharding(mesh, n)) for n, a in params.items()}


def place_batch(mesh, batch):
    if mesh is None:
        return {n: jnp.asarray(a) for n, a in batch.items()}
    return {n: jax.device_put(a, batch_sharding(mesh, a)) for n, a in batch.items()}


def checked_input(name, array, dtype, shape, what):
    if tuple(array.shape) != tuple(shape):
        fail(f"{what} `{name}` has shape {list(array.shape)}, the exported model takes {list(shape)} "
             "(export again with --dim for other shapes)")
    return np.asarray(array, dtype=jnp.dtype(dtype))


def read_inputs(pairs):
    arrays = {}
    for pair in pairs:
        name, sep, path = pair.partition("=")
        if not sep or name not in INPUTS:
            fail(f"--input {pair}: expected NAME=FILE.npy with NAME one of {', '.join(INPUTS)}")
        dtype, shape = INPUTS[name]
        arrays[name] = checked_input(name, np.load(path), dtype, shape, "input")
    missing = [n for n in INPUTS if n not in arrays]
    if missing:
        fail(f"give every input: {', '.join(missing)} missing (--input NAME=FILE.npy)")
    return arrays


def read_data(path):
    """`mslc train`'s --data: a folder of NAME.npy per input and label, or one tokens file
    [N, S+1] feeding the one input ([:, :-1]) and the one label ([:, 1:])."""
    inputs = TRAIN["inputs"]
    if os.path.isdir(path):
        columns = {}
        for name in inputs:
            file = os.path.join(path, f"{name}.npy")
            if not os.path.exists(file):
                fail(f"`{file}` is missing: --data needs one NAME.npy per input and label")
            columns[name] = np.load(file)
    else:
        model_inputs = [n for n in inputs if n not in TRAIN["labels"]]
        if len(model_inputs) != 1 or len(TRAIN["labels"]) != 1:
            fail(f"`{path}` is one file, the language-model shorthand, which needs one input and one label")
        tokens = np.load(path)
        if tokens.ndim != 2 or tokens.shape[1] < 2:
            fail(f"`{path}` must be an integer array [N, S+1] of token ids")
        columns = {model_inputs[0]: tokens[:, :-1], TRAIN["labels"][0]: tokens[:, 1:]}
    samples = None
    for name, array in columns.items():
        dtype, shape = inputs[name]
        if tuple(array.shape[1:]) != tuple(shape[1:]):
            fail(f"--data `{name}` has shape {list(array.shape)}: each sample must have shape {list(shape[1:])}")
        if samples is not None and array.shape[0] != samples:
            fail(f"--data: `{name}` has {array.shape[0]} samples, another column {samples}")
        samples = array.shape[0]
        columns[name] = np.asarray(array, dtype=jnp.dtype(dtype))
    return columns, samples


def lr_at(k):
    """The learning rate of update k (from 0): `mslc train`'s schedule."""
    lr = TRAIN["optimizer"]["lr"]
    s = TRAIN["schedule"]
    if s is None:
        return lr
    if k < s["warmup"]:
        return lr * k / s["warmup"]
    progress = min((k - s["warmup"]) / (s["total"] - s["warmup"]), 1.0)
    if s["decay"] == "cosine":
        fraction = 0.5 * (1.0 + math.cos(math.pi * progress))
    else:
        fraction = 1.0 - progress
    return s["min_lr"] + (lr - s["min_lr"]) * fraction


def state_names():
    o = TRAIN["optimizer"]
    if o["kind"] == "sgd":
        return ["momentum_buffer"] if o["momentum"] > 0 else []
    return ["exp_avg", "exp_avg_sq"]


# The mesh the program runs on (None: one device), for the pipeline's sharding constraints.
RUN_MESH = None


def constrain(array, *spec):
    """`array` laid out as `spec` over the run's mesh (unchanged on one device)."""
    if RUN_MESH is None:
        return array
    sharding = jax.sharding.NamedSharding(RUN_MESH, jax.sharding.PartitionSpec(*spec))
    return jax.lax.with_sharding_constraint(array, sharding)


def to_micro(array):
    """[B, ...] as [M, B / M, ...]: micro-batch k of the step holds the k-th micro-batch of
    every data-parallel replica's rows (as `mslc train` splits them), so no row moves."""
    m, r = PIPELINE["micro_batches"], PIPELINE["replicas"]
    rest = array.shape[1:]
    rows = array.shape[0] // (m * r)
    return array.reshape((r, m, rows) + rest).swapaxes(0, 1).reshape((m, r * rows) + rest)


def from_micro(array):
    """The inverse of `to_micro`: [M, B / M, ...] back to [B, ...]."""
    m, r = PIPELINE["micro_batches"], PIPELINE["replicas"]
    rest = array.shape[2:]
    rows = array.shape[1] // r
    return array.reshape((m, r, rows) + rest).swapaxes(0, 1).reshape((m * r * rows,) + rest)


def pipelined(parts, p, x):
    """A part of the model (`forward`, `train_graph`) as the plan's pipeline runs it, GSPMD
    style: the step's batch split into micro-batches; the head (what comes before the layers)
    on each; the layers' parameters stacked by stage, [stages, layers per stage, ...], the
    stage axis over the mesh's pipeline axis; at each of M + P - 1 ticks every stage applies
    its layers to the micro-batch it holds (the first stage taking the next one) and the
    stream shifts one stage on (jnp.roll over the pipeline axis: collective-permutes); the
    tail on each micro-batch leaving the last stage; the outputs joined back along the batch
    (a scalar loss averaged over the micro-batches, as `mslc train` averages them)."""
    head, layer, tail, spec = parts
    stages = PIPELINE["stage_layers"]
    n_stages, m = len(stages), PIPELINE["micro_batches"]
    if stages[-1][1] != len(spec["layers"]):
        fail(f"the plan's stages cover {stages[-1][1]} layers and the model has {len(spec['layers'])}")
    batch = {n: to_micro(a) for n, a in x.items()}
    env = jax.vmap(head, in_axes=(None, 0))(p, batch)
    stream = tuple(env[n] for n in spec["stream"])
    depth = max(end - first for first, end in stages)
    # Stage s's slot j holds layer first_s + j; a stage with fewer layers repeats its last one
    # in the slots it lacks, masked out.
    slot = [[first + min(j, end - first - 1) for j in range(depth)] for first, end in stages]
    live = np.array([[j < end - first for j in range(depth)] for first, end in stages])
    axis = PIPELINE["axis"]
    stacked = {}
    for rel in spec["params"]:
        array = jnp.stack([jnp.stack([p[spec["layers"][i] + rel] for i in row]) for row in slot])
        tensor = param_spec(spec["layers"][0] + rel)
        stacked[rel] = constrain(array, axis, None, *tensor)
    batch_axes = tuple(MESH["batch"]) if MESH else ()
    rows = batch_axes[0] if len(batch_axes) == 1 else (batch_axes or None)

    def stage(params, alive, s):
        for j in range(depth):
            out = layer({rel: a[j] for rel, a in params.items()}, s, p)
            s = tuple(jnp.where(alive[j], new, old) for new, old in zip(out, s))
        return s

    state = tuple(jnp.zeros((n_stages,) + a.shape[1:], a.dtype) for a in stream)
    done = []
    for tick in range(m + n_stages - 1):
        if tick < m:
            state = tuple(s.at[0].set(a[tick]) for s, a in zip(state, stream))
        state = tuple(constrain(s, axis, rows) if s.ndim > 1 else s for s in state)
        state = jax.vmap(stage)(stacked, live, state)
        if tick >= n_stages - 1:
            done.append(tuple(s[n_stages - 1] for s in state[:spec["carry"]]))
        state = tuple(jnp.roll(s, 1, axis=0) for s in state)
    carry = tuple(jnp.stack([d[i] for d in done]) for i in range(spec["carry"]))
    outputs = jax.vmap(tail, in_axes=(None, 0, 0, 0))(p, batch, env, carry)
    return {n: jnp.mean(v, axis=0) if spec["outputs"][n] == "mean" else from_micro(v)
            for n, v in outputs.items()}


def train_step(params, states, batch, lr, step_size, bc2_sqrt):
    """One update, as `mslc train` compiles it: the loss and its gradients, their global
    2-norm, clip_grad_norm's scaling, then SGD / Adam / AdamW as torch.optim computes them."""
    o = TRAIN["optimizer"]
    trained = sorted(TRAIN["weight_decay"])
    frozen = {n: v for n, v in params.items() if n not in TRAIN["weight_decay"]}

    def loss_of(tp):
        return train_graph({**frozen, **tp}, batch)["loss"]

    loss, grads = jax.value_and_grad(loss_of)({n: params[n] for n in trained})
    if MESH is not None and MESH["shard_grads"]:
        grads = {n: constrain(g, *state_spec(n)) for n, g in grads.items()}
    total = None
    for n in trained:
        s = jnp.sum(grads[n] * grads[n])
        total = s if total is None else total + s
    norm = jnp.sqrt(total)
    coef = None
    if TRAIN["clip_grad_norm"] is not None:
        coef = jnp.minimum(TRAIN["clip_grad_norm"] / (norm + 1e-6), 1.0)
    new_params, new_states = dict(params), {}
    b1, b2 = o["betas"]
    for n in trained:
        p, g, wd = params[n], grads[n], TRAIN["weight_decay"][n]
        if coef is not None:
            g = g * coef
        if o["kind"] == "sgd":
            if wd > 0:
                g = g + wd * p
            d = g
            if o["momentum"] > 0:
                buf = constrain(o["momentum"] * states[n + ".momentum_buffer"] + g, *state_spec(n))
                new_states[n + ".momentum_buffer"] = buf
                d = g + o["momentum"] * buf if o["nesterov"] else buf
            new_params[n] = constrain(p - d * lr, *param_spec(n))
            continue
        if wd > 0 and o["kind"] == "adam":
            g = g + wd * p
        if wd > 0 and o["kind"] == "adamw":
            p = p - p * (lr * wd)
        m = b1 * states[n + ".exp_avg"] + (1.0 - b1) * g
        v = b2 * states[n + ".exp_avg_sq"] + (1.0 - b2) * (g * g)
        denom = jnp.sqrt(v) / bc2_sqrt + o["eps"]
        new_states[n + ".exp_avg"] = constrain(m, *state_spec(n))
        new_states[n + ".exp_avg_sq"] = constrain(v, *state_spec(n))
        new_params[n] = constrain(p - (m / denom) * step_size, *param_spec(n))
    return new_params, new_states, loss, norm


def write_hlo(path, jitted, *args):
    """The compiled HLO of the step this run executes (for counting its collectives)."""
    text = jitted.lower(*args).compile().as_text()
    with open(path, "w") as f:
        f.write(text)


def run_forward(args, mesh):
    params = place_params(mesh, load_params(args.weights))
    inputs = place_batch(mesh, read_inputs(args.input))
    step = jax.jit(forward)
    if args.dump_hlo:
        write_hlo(args.dump_hlo, step, params, inputs)
    outputs = step(params, inputs)
    if args.output_dir:
        os.makedirs(args.output_dir, exist_ok=True)
        for name in OUTPUTS:
            np.save(os.path.join(args.output_dir, f"{name}.npy"), np.asarray(outputs[name]))
    for name in OUTPUTS:
        print(f"{name}: {outputs[name].dtype}{list(outputs[name].shape)}")


def run_train(args, mesh):
    if TRAIN is None:
        fail("this model has no train declaration, so there is no training step (--train)")
    if args.data is None:
        fail("--train needs --data PATH")
    params = place_params(mesh, load_params(args.weights))
    columns, samples = read_data(args.data)
    batch = TRAIN["inputs"][next(iter(TRAIN["inputs"]))][1][0]
    if samples < batch:
        fail(f"--data holds {samples} samples, fewer than one batch of {batch}")
    per_epoch = samples // batch
    states = {}
    for n in sorted(TRAIN["weight_decay"]):
        for key in state_names():
            zeros = np.zeros(PARAMS[n][1], dtype=jnp.dtype(PARAMS[n][0]))
            states[f"{n}.{key}"] = zeros if mesh is None else jax.device_put(
                zeros, jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(*state_spec(n))))
    step = jax.jit(train_step)
    b1, b2 = TRAIN["optimizer"]["betas"]
    metrics = open(args.metrics, "a") if args.metrics else None
    for k in range(args.steps):
        start = time.perf_counter()
        first = (k % per_epoch) * batch
        feed = place_batch(mesh, {n: c[first:first + batch] for n, c in columns.items()})
        lr = lr_at(k)
        t = k + 1
        scalars = (np.float32(lr), np.float32(lr / (1.0 - b1 ** t)), np.float32(math.sqrt(1.0 - b2 ** t)))
        if args.dump_hlo and k == 0:
            write_hlo(args.dump_hlo, step, params, states, feed, *scalars)
        params, states, loss, norm = step(params, states, feed, *scalars)
        loss, norm = float(loss), float(norm)
        record = {"step": t, "loss": loss, "lr": lr, "loss_scale": 1.0, "grad_norm": norm,
                  "skipped": False, "ms": (time.perf_counter() - start) * 1e3}
        print(f"step {t} loss {loss:.6f} lr {lr:.3e} |g| {norm:.4f}")
        if metrics:
            metrics.write(json.dumps(record) + "\n")
            metrics.flush()
    if metrics:
        metrics.close()
    if args.output_dir:
        os.makedirs(args.output_dir, exist_ok=True)
        final = {n: np.asarray(v) for n, v in params.items()}
        write_safetensors(os.path.join(args.output_dir, "model.safetensors"), final)


def main(argv=None):
    parser = argparse.ArgumentParser(description=f"Model {MODEL}, exported by mslc, on JAX.")
    parser.add_argument("--weights", required=True, metavar="W.safetensors",
                        help="parameters by path")
    parser.add_argument("--input", action="append", default=[], metavar="NAME=FILE.npy",
                        help="an input value (forward)")
    parser.add_argument("--output-dir", metavar="DIR",
                        help="forward: DIR/OUTPUT.npy per output; --train: DIR/model.safetensors")
    parser.add_argument("--train", action="store_true", help="run the training step")
    parser.add_argument("--data", metavar="PATH", help="NAME.npy per input and label, or tokens.npy")
    parser.add_argument("--steps", type=int, default=1, metavar="N", help="updates to run")
    parser.add_argument("--metrics", metavar="FILE.jsonl", help="append one JSON object per update")
    parser.add_argument("--dump-hlo", metavar="FILE", help="write the compiled HLO of the step")
    args = parser.parse_args(argv)
    global RUN_MESH
    mesh = RUN_MESH = make_mesh()
    if mesh is not None:
        print(f"mesh `{MESH['name']}`: {dict(mesh.shape)} over {mesh.devices.size} devices", file=sys.stderr)
    if args.train:
        run_train(args, mesh)
    else:
        run_forward(args, mesh)


if __name__ == "__main__":
    main()
