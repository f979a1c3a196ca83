#!/usr/bin/env python3
"""A training step of tiny_llama: mslc against PyTorch eager on the same machine, in one script
(issue 9's benchmark).

Both train examples/tiny_llama.msl's model (--set layers=LAYERS, f32) on the same synthetic
tokens with AdamW(lr 1e-4, betas (0.9, 0.95), weight decay 0.1) on THREADS threads: mslc with
`mslc train`, PyTorch with Hugging Face's `LlamaForCausalLM` of the same config and
`torch.optim.AdamW`. Rounds alternate between the two; the script prints per framework the median
ms/step after the warm-up steps, tokens/s and the peak resident memory of its whole process, then
the ratios (mslc's tokens/s over PyTorch's, mslc's peak RSS over PyTorch's), and the step time
mslc's plan predicts for this machine (`mslc build`'s plan.json) against the one it measured
(issue 10: within 15 %).

usage: scripts/bench_train.py [--mslc PATH] [--torch-python PYTHON] [--layers 8] [--batch 4]
                              [--seq 128] [--threads 2] [--steps 12] [--warmup 2] [--rounds 2]

Needs numpy and a release mslc (`cargo build --release`); the PyTorch side needs a Python with
torch and transformers (`--torch-python`, default this one) and is skipped, saying so, without.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

import numpy as np

from bench_ort import ROOT, cpu_description, VOCAB, HIDDEN, HEADS, KV_HEADS, FFN, EPS, THETA

# Runs argv[1:] and prints its peak resident memory in KiB (the only child of a fresh process).
PEAK_RSS = """
import resource, subprocess, sys
code = subprocess.run(sys.argv[1:]).returncode
print("PEAK_RSS_KIB", resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)
sys.exit(code)
"""

# The PyTorch side: HF LLaMA of examples/tiny_llama.msl's config, AdamW, one JSON line of
# per-step milliseconds and the process's peak RSS.
TORCH = """
import json, resource, sys, time
import numpy as np
import torch
import torch.nn.functional as F
from transformers import LlamaConfig, LlamaForCausalLM

tokens, layers, batch, threads, steps = sys.argv[1], *map(int, sys.argv[2:6])
vocab, hidden, heads, kv_heads, ffn, eps, theta = {config}
torch.set_num_threads(threads)
torch.manual_seed(0)
data = torch.from_numpy(np.load(tokens).astype(np.int64))
config = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=ffn,
                     num_hidden_layers=layers, num_attention_heads=heads,
                     num_key_value_heads=kv_heads, rms_norm_eps=eps, rope_theta=theta,
                     max_position_embeddings=data.shape[1], tie_word_embeddings=False)
model = LlamaForCausalLM(config).train()
opt = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.95), weight_decay=0.1)
ms = []
for step in range(steps):
    rows = data[step * batch:(step + 1) * batch]
    x, y = rows[:, :-1], rows[:, 1:]
    start = time.perf_counter()
    logits = model(input_ids=x).logits
    loss = F.cross_entropy(logits.reshape(-1, vocab), y.reshape(-1))
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    ms.append((time.perf_counter() - start) * 1e3)
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({{"ms": ms, "peak_rss_kib": peak, "torch": torch.__version__}}))
""".format(config=(VOCAB, HIDDEN, HEADS, KV_HEADS, FFN, EPS, THETA))


def one_device_source(args, work):
    """examples/tiny_llama.msl's model with a train `Fit` of the benchmark's optimizer and
    batch on one device of this machine (`std.targets.cpu`, a memory policy so it is planned),
    written in `work`."""
    with open(os.path.join(ROOT, "examples/tiny_llama.msl")) as f:
        text = f.read()
    model = text[:text.index("// f16 has a narrow")]
    path = os.path.join(work, "fit.msl")
    with open(path, "w") as f:
        f.write(model + f"""
memory Host {{
    max_device_memory = 16GB
}}

train Fit for TinyLlama {{
    labels: i32[B, S]
    loss = cross_entropy(logits, labels)
    optimizer = adamw(lr: 1e-4, betas: (0.9, 0.95), weight_decay: 0.1)
    batch = {args.batch}
    memory = Host
    target = std.targets.cpu
}}
""")
    return path


def sizes(args):
    """The command-line sizes of the benchmark's model."""
    return ["--set", f"layers={args.layers}", "--dim", f"B={args.batch}", "--dim", f"S={args.seq}"]


def planned_step_ms(mslc, source, entry, sets, out_dir):
    """The step time in ms that `mslc build`'s plan of `entry` predicts for this machine (per
    device: on ranks of this machine, each with its share of the cores)."""
    cmd = [mslc, "build", source, "--entry", entry, *sets, "-o", out_dir]
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"mslc build failed:\n{out.stdout}\n{out.stderr}")
    with open(os.path.join(out_dir, f"{entry}.plan.json")) as f:
        return json.load(f)["step_time_s"] * 1e3


def run_mslc(args, source, tokens, work):
    """Per-step milliseconds and peak RSS (KiB) of one `mslc train` run."""
    metrics = os.path.join(work, "metrics.jsonl")
    if os.path.exists(metrics):
        os.remove(metrics)
    cmd = [
        args.mslc, "train", source, *sizes(args),
        "--init-seed", "0", "--data", tokens, "--steps", str(args.steps),
        "--threads", str(args.threads), "--metrics", metrics,
    ]
    out = subprocess.run([sys.executable, "-c", PEAK_RSS, *cmd], capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"mslc train failed:\n{out.stdout}\n{out.stderr}")
    peak = int(out.stdout.split("PEAK_RSS_KIB")[-1])
    with open(metrics) as f:
        ms = [json.loads(line)["ms"] for line in f]
    return ms, peak


def run_torch(args, tokens):
    """Per-step milliseconds, peak RSS (KiB) and version of one PyTorch run, or None."""
    cmd = [args.torch_python, "-c", TORCH, tokens, str(args.layers), str(args.batch),
           str(args.threads), str(args.steps)]
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads), MKL_NUM_THREADS=str(args.threads))
    out = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if out.returncode != 0:
        print(f"PyTorch side not run ({args.torch_python}):\n{out.stderr.strip()[-400:]}")
        return None
    result = json.loads(out.stdout.strip().splitlines()[-1])
    return result["ms"], result["peak_rss_kib"], result["torch"]


def summary(name, ms_lists, peaks, args):
    """Median ms/step over every round's post-warm-up steps, tokens/s, peak RSS (MiB)."""
    ms = statistics.median(m for run in ms_lists for m in run[args.warmup:])
    tokens_per_s = args.batch * args.seq / (ms / 1e3)
    rss = max(peaks) / 1024
    print(f"{name:>8}: {ms:8.1f} ms/step  {tokens_per_s:8.0f} tokens/s  {rss:7.0f} MiB peak RSS")
    return tokens_per_s, rss


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mslc", default=os.path.join(ROOT, "target/release/mslc"))
    p.add_argument("--torch-python", default=sys.executable)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--rounds", type=int, default=2)
    args = p.parse_args()
    if args.steps <= args.warmup:
        sys.exit("--steps must exceed --warmup")
    print(f"machine: {cpu_description()}")
    print(f"tiny_llama: {args.layers} layers, B={args.batch}, S={args.seq}, f32, AdamW, "
          f"{args.threads} threads, {args.steps} steps ({args.warmup} warm-up) x {args.rounds} rounds")
    with tempfile.TemporaryDirectory() as work:
        rng = np.random.default_rng(0)
        tokens = os.path.join(work, "tokens.npy")
        np.save(tokens, rng.integers(0, VOCAB, (args.batch * args.steps, args.seq + 1),
                                     dtype=np.int32))
        source = one_device_source(args, work)
        planned = planned_step_ms(args.mslc, source, "Fit", sizes(args), os.path.join(work, "plan"))
        mslc_ms, mslc_rss, torch_ms, torch_rss, version = [], [], [], [], None
        for _ in range(args.rounds):
            ms, peak = run_mslc(args, source, tokens, work)
            mslc_ms.append(ms)
            mslc_rss.append(peak)
            result = run_torch(args, tokens)
            if result is not None:
                torch_ms.append(result[0])
                torch_rss.append(result[1])
                version = result[2]
    ours, our_rss = summary("mslc", mslc_ms, mslc_rss, args)
    measured = statistics.median(m for run in mslc_ms for m in run[args.warmup:])
    print(f"    plan: {planned:8.1f} ms/step predicted for this machine, "
          f"{100 * (planned - measured) / measured:+.1f} % of the measured (goal within 15 %)")
    if not torch_ms:
        print("no PyTorch figures: install torch and transformers, or pass --torch-python")
        return
    theirs, their_rss = summary(f"torch {version}", torch_ms, torch_rss, args)
    print(f"ratio: {ours / theirs:.2f}x PyTorch's tokens/s (goal >= 1.3), "
          f"{our_rss / their_rss:.2f}x its peak RSS (goal <= 0.5)")


if __name__ == "__main__":
    main()
