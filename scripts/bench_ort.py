#!/usr/bin/env python3
"""mslc against onnxruntime on the same model, in one script (issue 14's goal).

Builds examples/tiny_llama.msl (f32: the train's precision policy dropped) with --set
layers=LAYERS as an ONNX graph with the `onnx` helper API, with the SAME weights: this script
writes them once as a .safetensors file that `mslc run --weights` loads and the ONNX graph embeds
as initializers. It checks that both give the same logits, then times the forward pass of both
on the same number of threads, alternating rounds, and prints the medians and the ratio. mslc
runs twice per round: with its default kernel parameters, and with the kernel table `mslc tune`
wrote for this model on this machine (`mslc tune --budget TUNE_BUDGET` into a fresh knowledge
base, then `mslc build --tune-db`), as a user who tunes would run it; `--no-tune` skips that.

usage: scripts/bench_ort.py [--mslc PATH] [--layers 8] [--seq 128] [--threads 2]
                            [--iterations 30] [--rounds 3] [--tune-budget 60s | --no-tune]

Needs numpy, onnx and onnxruntime (`pip install onnx onnxruntime`) and a release mslc
(default target/release/mslc; `cargo build --release`).
"""
import argparse
import json
import os
import platform
import struct
import subprocess
import sys
import tempfile
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# examples/tiny_llama.msl's constants.
VOCAB, HIDDEN, HEADS, KV_HEADS, FFN, EPS, THETA = 1000, 256, 4, 4, 688, 1e-6, 10000.0
# |mslc - ort| <= ATOL + RTOL * |ort|, element by element: both are f32 and sum in
# different orders (and ORT fuses differently), over a few hundred terms per dot product.
ATOL, RTOL = 1e-4, 1e-3


def cpu_description():
    """CPU model and the widest vector ISA, read from the machine (never assumed)."""
    model, flags = platform.processor() or "unknown", set()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() == "model name":
                    model = value.strip()
                elif key.strip() == "flags":
                    flags = set(value.split())
    except OSError:
        pass
    isa = next(
        (name for flag, name in [("avx512f", "AVX-512"), ("avx2", "AVX2"), ("sse4_2", "SSE4.2")]
         if flag in flags),
        "unknown ISA",
    )
    if isa == "AVX2" and "fma" in flags:
        isa = "AVX2+FMA"
    return f"{model}, {isa}, {os.cpu_count()} logical CPUs"


def weights(layers, seed):
    """HF LLaMA parameters (Linear weights [out, in]) as f32: N(0, 0.02), norms near 1."""
    rng = np.random.default_rng(seed)
    normal = lambda *shape: rng.normal(0.0, 0.02, shape).astype(np.float32)
    norm = lambda: (1.0 + rng.normal(0.0, 0.1, HIDDEN)).astype(np.float32)
    kv = HIDDEN // HEADS * KV_HEADS
    w = {"model.embed_tokens.weight": normal(VOCAB, HIDDEN)}
    for i in range(layers):
        p = f"model.layers.{i}."
        w[p + "input_layernorm.weight"] = norm()
        w[p + "self_attn.q_proj.weight"] = normal(HIDDEN, HIDDEN)
        w[p + "self_attn.k_proj.weight"] = normal(kv, HIDDEN)
        w[p + "self_attn.v_proj.weight"] = normal(kv, HIDDEN)
        w[p + "self_attn.o_proj.weight"] = normal(HIDDEN, HIDDEN)
        w[p + "post_attention_layernorm.weight"] = norm()
        w[p + "mlp.gate_proj.weight"] = normal(FFN, HIDDEN)
        w[p + "mlp.up_proj.weight"] = normal(FFN, HIDDEN)
        w[p + "mlp.down_proj.weight"] = normal(HIDDEN, FFN)
    w["model.norm.weight"] = norm()
    w["lm_head.weight"] = normal(VOCAB, HIDDEN)
    return w


def write_safetensors(path, tensors):
    """The safetensors format: u64 header length, JSON header, raw little-endian data."""
    header, offset = {}, 0
    for name, t in tensors.items():
        header[name] = {"dtype": "F32", "shape": list(t.shape),
                        "data_offsets": [offset, offset + t.nbytes]}
        offset += t.nbytes
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(raw)) + raw)
        for t in tensors.values():
            f.write(np.ascontiguousarray(t, dtype="<f4").tobytes())
    os.replace(tmp, path)


def onnx_model(w, layers, seq):
    """The same forward pass as an ONNX graph (opset 17), the weights as initializers."""
    from onnx import TensorProto, helper, numpy_helper

    nodes, inits = [], []
    count = [0]

    def name(prefix):
        count[0] += 1
        return f"{prefix}_{count[0]}"

    def const(value, prefix="c"):
        n = name(prefix)
        inits.append(numpy_helper.from_array(np.asarray(value), n))
        return n

    def op(kind, *inputs, **attrs):
        out = name(kind.lower())
        nodes.append(helper.make_node(kind, list(inputs), [out], **attrs))
        return out

    d = HIDDEN // HEADS
    eps = const(np.float32(EPS))

    def rms_norm(x, weight):
        var = op("ReduceMean", op("Mul", x, x), axes=[-1], keepdims=1)
        return op("Mul", op("Div", x, op("Sqrt", op("Add", var, eps))), const(weight))

    def linear(x, weight):
        return op("MatMul", x, const(np.ascontiguousarray(weight.T)))

    inv_freq = 1.0 / THETA ** (np.arange(0, d, 2, dtype=np.float64) / d)
    freqs = np.outer(np.arange(seq, dtype=np.float64), inv_freq)
    emb = np.concatenate([freqs, freqs], axis=-1)
    cos, sin = const(np.cos(emb).astype(np.float32)), const(np.sin(emb).astype(np.float32))
    lo, mid, hi, last = (const(np.array([v], dtype=np.int64)) for v in (0, d // 2, d, -1))

    def rope(x):  # x [B, H, S, D]
        first = op("Slice", x, lo, mid, last)
        second = op("Slice", x, mid, hi, last)
        rotated = op("Concat", op("Neg", second), first, axis=-1)
        return op("Add", op("Mul", x, cos), op("Mul", rotated, sin))

    def heads(x, h):  # [B, S, h*D] -> [B, h, S, D]
        shaped = op("Reshape", x, const(np.array([1, seq, h, d], dtype=np.int64)))
        return op("Transpose", shaped, perm=[0, 2, 1, 3])

    mask = np.triu(np.full((seq, seq), -np.inf, dtype=np.float32), k=1)
    mask_name, scale = const(mask), const(np.float32(1.0 / np.sqrt(d)))
    merged = const(np.array([1, seq, HIDDEN], dtype=np.int64))
    x = op("Gather", const(w["model.embed_tokens.weight"]), "tokens", axis=0)
    for i in range(layers):
        p = f"model.layers.{i}."
        n = rms_norm(x, w[p + "input_layernorm.weight"])
        q = rope(heads(linear(n, w[p + "self_attn.q_proj.weight"]), HEADS))
        k = rope(heads(linear(n, w[p + "self_attn.k_proj.weight"]), KV_HEADS))
        v = heads(linear(n, w[p + "self_attn.v_proj.weight"]), KV_HEADS)
        scores = op("MatMul", q, op("Transpose", k, perm=[0, 1, 3, 2]))
        probs = op("Softmax", op("Add", op("Mul", scores, scale), mask_name), axis=-1)
        o = op("Reshape", op("Transpose", op("MatMul", probs, v), perm=[0, 2, 1, 3]), merged)
        h = op("Add", x, linear(o, w[p + "self_attn.o_proj.weight"]))
        n = rms_norm(h, w[p + "post_attention_layernorm.weight"])
        gate = linear(n, w[p + "mlp.gate_proj.weight"])
        up = linear(n, w[p + "mlp.up_proj.weight"])
        act = op("Mul", op("Mul", gate, op("Sigmoid", gate)), up)
        x = op("Add", h, linear(act, w[p + "mlp.down_proj.weight"]))
    logits = linear(rms_norm(x, w["model.norm.weight"]), w["lm_head.weight"])
    nodes[-1].output[:] = ["logits"]
    graph = helper.make_graph(
        nodes, "tiny_llama",
        [helper.make_tensor_value_info("tokens", TensorProto.INT64, [1, seq])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, seq, VOCAB])],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def shape_args(args):
    """The model's size and shapes, as every mslc command of this script gives them."""
    return ["--set", f"layers={args.layers}", "--dim", "B=1", "--dim", f"S={args.seq}"]


def tuned_table(args, model, tmp):
    """`mslc tune` of the model into a fresh knowledge base, then `mslc build` with it: the
    path of the tuned kernel table it wrote."""
    kb, out = os.path.join(tmp, "kb.json"), os.path.join(tmp, "tuned")
    for cmd in ([args.mslc, "tune", model, *shape_args(args), "--threads", str(args.threads),
                 "--budget", args.tune_budget,
                 "--db", kb, "-o", out],
                [args.mslc, "build", model, *shape_args(args), "--tune-db", kb, "-o", out]):
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode != 0:
            sys.exit(f"{' '.join(cmd)} failed:\n{done.stdout}\n{done.stderr}")
    tables = [f for f in os.listdir(out) if f.endswith(".kernels.toml")]
    if len(tables) != 1:
        sys.exit(f"expected one kernel table in {out}, found {tables}")
    return os.path.join(out, tables[0])


def run_mslc(args, model, wfile, tokens, out_dir, iterations, kernels=None):
    """`mslc run` with the weights and tokens (and a kernel table, when given); its summary
    (median/best ms) as JSON."""
    cmd = [args.mslc, "run", model, *shape_args(args), "--threads", str(args.threads),
           "--weights", wfile,
           "--input", f"tokens={tokens}", "--output-dir", out_dir, "--iterations",
           str(iterations), "--message-format", "json"]
    if kernels:
        cmd += ["--kernels", kernels]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"mslc run failed ({' '.join(cmd)}):\n{done.stdout}\n{done.stderr}")
    for line in done.stdout.splitlines():
        try:
            doc = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(doc, dict) and "summary" in doc:
            return doc["summary"]
    sys.exit(f"no summary in mslc's output:\n{done.stdout}")


def time_ort(session, feed, iterations):
    """Median and best ms per forward pass after a warm-up."""
    for _ in range(3):
        session.run(["logits"], feed)
    times = []
    for _ in range(iterations):
        t = time.perf_counter()
        session.run(["logits"], feed)
        times.append(time.perf_counter() - t)
    return 1e3 * float(np.median(times)), 1e3 * min(times)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mslc", default=os.path.join(ROOT, "target", "release", "mslc"))
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--iterations", type=int, default=30)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--tune-budget", default="60s")
    ap.add_argument("--no-tune", action="store_true")
    args = ap.parse_args()
    import onnxruntime as ort

    print(f"machine: {cpu_description()}")
    print(f"model:   tiny_llama, {args.layers} layers, B=1, S={args.seq}, f32, "
          f"{args.threads} threads each; onnxruntime {ort.__version__}")
    with tempfile.TemporaryDirectory(prefix="mslc-ort-") as tmp:
        with open(os.path.join(ROOT, "examples", "tiny_llama.msl")) as f:
            source = f.read()
        f32_source = source.replace("precision = Mixed, ", "")
        if f32_source == source:
            sys.exit("examples/tiny_llama.msl's train no longer names `precision = Mixed`")
        model = os.path.join(tmp, "tiny_llama.msl")
        with open(model, "w") as f:
            f.write(f32_source)
        w = weights(args.layers, seed=7)
        wfile = os.path.join(tmp, "w.safetensors")
        write_safetensors(wfile, w)
        ids = np.random.default_rng(3).integers(0, VOCAB, (1, args.seq))
        tokens = os.path.join(tmp, "tokens.npy")
        np.save(tokens, ids.astype(np.int32))

        opts = ort.SessionOptions()
        opts.intra_op_num_threads = args.threads
        opts.inter_op_num_threads = 1
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        session = ort.InferenceSession(
            onnx_model(w, args.layers, args.seq).SerializeToString(), opts,
            providers=["CPUExecutionProvider"])
        feed = {"tokens": ids.astype(np.int64)}

        run_mslc(args, model, wfile, tokens, tmp, 1)
        got = np.load(os.path.join(tmp, "logits.npy")).astype(np.float64)
        want = session.run(["logits"], feed)[0].astype(np.float64)
        diff = np.abs(got - want)
        ok = bool(np.all(diff <= ATOL + RTOL * np.abs(want)))
        print(f"logits:  max |mslc - ort| = {diff.max():.3g} (max |ort| {np.abs(want).max():.3g});"
              f" |d| <= {ATOL} + {RTOL}*|ort| everywhere: {'yes' if ok else 'NO'}")
        if not ok:
            sys.exit("the two disagree: timings would compare different computations")

        table = None
        if not args.no_tune:
            t = time.monotonic()
            table = tuned_table(args, model, tmp)
            run_mslc(args, model, wfile, tokens, tmp, 1, table)
            tuned = np.load(os.path.join(tmp, "logits.npy")).astype(np.float64)
            if not np.all(np.abs(tuned - want) <= ATOL + RTOL * np.abs(want)):
                sys.exit("the tuned kernels' logits disagree with onnxruntime's")
            print(f"tuned:   `mslc tune --budget {args.tune_budget}` and `mslc build --tune-db` "
                  f"in {time.monotonic() - t:.1f} s; the tuned logits agree too")

        runs = {"mslc": [], "mslc tuned": [], "onnxruntime": []}
        for r in range(args.rounds):
            s = run_mslc(args, model, wfile, tokens, tmp, args.iterations)
            runs["mslc"].append(s["median_ms"])
            line = f"mslc median {s['median_ms']:.2f} ms (best {s['best_ms']:.2f})"
            if table:
                s = run_mslc(args, model, wfile, tokens, tmp, args.iterations, table)
                runs["mslc tuned"].append(s["median_ms"])
                line += f", tuned {s['median_ms']:.2f} (best {s['best_ms']:.2f})"
            o = time_ort(session, feed, args.iterations)
            runs["onnxruntime"].append(o[0])
            print(f"round {r + 1}: {line}, onnxruntime median {o[0]:.2f} ms (best {o[1]:.2f})")
        o = float(np.median(runs["onnxruntime"]))
        for name in ("mslc", "mslc tuned"):
            if runs[name]:
                m = float(np.median(runs[name]))
                print(f"median of rounds: {name} {m:.2f} ms, onnxruntime {o:.2f} ms: {name} is "
                      f"{o / m:.2f}x {'faster' if o >= m else 'as fast'} (goal >= 1.3x)")


if __name__ == "__main__":
    main()
