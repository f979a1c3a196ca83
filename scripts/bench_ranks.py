#!/usr/bin/env python3
"""Training speed on ranks (issue 11's benchmark): tokens/s of tiny_llama's training step on one
rank against two ranks, data parallel and Megatron tensor parallel, on the threads backend
(`mslc train --ranks 2`), every rank given one worker thread (`--threads 1` is per rank), so that
on a 2-core machine the two-rank runs use the cores one rank alone cannot (ideal: 2x for data
parallel). One rank on two threads is printed as well, as what the cores give without ranks.
Then the threads backend's all-reduce bandwidth for 1-64 MiB against a memcpy of the same size
(crates/exec/benches/collectives.rs). Ratios are taken within this one run.

All runs train examples/tiny_llama.msl's model (--set layers=LAYERS, f32, AdamW) on the same
synthetic tokens from the same weights; the script prints per configuration the median ms/step
after the warm-up steps and tokens/s, then the ratios against one rank on one thread. A run
of two ranks or processes on half the cores each is what its plan describes (two devices
sharing this machine's cores), so beside it the script prints the step time `mslc build`'s
plan predicts and its difference from the measured (issue 10's goal: within 15 %).

For each run on two ranks it also prints the communication of rank 0's last step (its
`--profile`): the time its collectives took, their share of the step, and how much of it
overlapped compute. mslc's executor hands an all-reduce whose result the next step does not
read (a data-parallel gradient's) to its communication thread, and goes on with the steps that
do not touch it; the profile puts those on a track of their own. Overlapped is the part of that
track's time during which the step's thread was computing; every other collective (and an
all-reduce the next step needs) blocks the step and is exposed. A rank on one thread overlaps
nothing (its thread is never idle, so a communication thread would only take time from it): on
a machine of at least 4 cores the script adds two data-parallel ranks of half the cores each
against one rank on all of them, where the all-reduces do overlap.

With `--grad-accum K` every step accumulates K micro-batches of batch / K sequences (a data
replica's micro-batch is batch / (2K)): the replicas all-reduce their gradient sums once per step.

With `--mpi` the same two-rank runs go again as two processes under `mpiexec -n 2 … --mpi`, and
the MPI backend's all-reduce bandwidth is measured too; this needs an mslc built with
`--features mpi` and MPICH's mpiexec.

usage: scripts/bench_ranks.py [--mslc PATH] [--layers 8] [--batch 8] [--seq 64] [--steps 10]
                              [--warmup 2] [--grad-accum 1] [--no-collectives] [--mpi]

Needs numpy and a release mslc (`cargo build --release`, with `--features mpi` for `--mpi`);
the bandwidth part runs `cargo bench -p mslc-exec --bench collectives` (and with `--mpi`
`cargo bench -p mslc-exec --features mpi --bench collectives -- --mpi`).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

import numpy as np

from bench_train import planned_step_ms

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

DATA = """parallel P {
    mesh = { dp: 2 }
    mode = data
}
"""

TENSOR = """parallel P {
    mesh = { mp: 2 }
    mode = semi_auto
    shard "model.layers.*.self_attn.{q,k,v}_proj.weight" = [mp, _]
    shard "model.layers.*.self_attn.o_proj.weight" = [_, mp]
    shard "model.layers.*.mlp.{gate,up}_proj.weight" = [mp, _]
    shard "model.layers.*.mlp.down_proj.weight" = [_, mp]
}
"""

TRAIN = """
train Pretrain for TinyLlama {{
    labels: i32[B, S]
    loss = cross_entropy(logits, labels)
    optimizer = adamw(lr: 1e-4, betas: (0.9, 0.95), weight_decay: 0.1)
    batch = {batch}, grad_accum = {grad_accum}
    parallel = P
    target = std.targets.cpu
}}
"""


def source(tmp, name, policy, batch, grad_accum):
    """examples/tiny_llama.msl's model with `policy` and a train of `batch` sequences in
    `grad_accum` micro-batches."""
    with open(os.path.join(ROOT, "examples", "tiny_llama.msl")) as f:
        example = f.read()
    model = example[: example.index("// f16 has")]
    path = os.path.join(tmp, name)
    with open(path, "w") as f:
        f.write(model + policy + TRAIN.format(batch=batch, grad_accum=grad_accum))
    return path


# The ops of a step that exchange data between ranks, as its profile names them.
COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send", "recv")


def communication(profile):
    """(ms in collectives, ms of them overlapping compute, ms of the whole step) of the step a
    `--profile` trace recorded."""
    with open(profile) as f:
        trace = json.load(f)
    events = trace.get("traceEvents", trace)
    # The track of the all-reduces that ran beside the steps, if the run had any.
    comm_tracks = {e["tid"] for e in events if e.get("ph") == "M" and e.get("name") == "thread_name"
                   and e["args"]["name"].startswith("communication")}
    spans = [e for e in events if e.get("ph") == "X"]
    if not spans:
        return 0.0, 0.0, 0.0
    step = max(e["ts"] + e["dur"] for e in spans) - min(e["ts"] for e in spans)
    is_comm = lambda e: e.get("name", "").split(" ")[0] in COLLECTIVES
    comm = sum(e["dur"] for e in spans if is_comm(e))
    # The step thread's compute, as sorted intervals, and each overlapped collective's part
    # inside them.
    compute = sorted((e["ts"], e["ts"] + e["dur"]) for e in spans
                     if not is_comm(e) and e["tid"] not in comm_tracks and e.get("cat") != "parallel tasks")
    overlapped = 0.0
    for e in spans:
        if e["tid"] in comm_tracks:
            a, b = e["ts"], e["ts"] + e["dur"]
            overlapped += sum(max(0.0, min(b, y) - max(a, x)) for x, y in compute if x < b and y > a)
    return comm / 1e3, overlapped / 1e3, step / 1e3


def train(mslc, src, sets, tokens, out, extra, launcher=()):
    """Runs `mslc train` (under `launcher`, such as mpiexec); the per-step milliseconds from its
    metrics."""
    metrics = out + ".jsonl"
    cmd = [*launcher, mslc, "train", src, "--data", tokens, "--metrics", metrics, *sets, *extra]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed:\n{done.stdout}{done.stderr}")
    with open(metrics) as f:
        return [json.loads(line)["ms"] for line in f]


def collectives(mpi=False):
    """The all-reduce and memcpy figures of crates/exec/benches/collectives.rs (of the MPI
    backend with `mpi`)."""
    cmd = ["cargo", "bench", "-q", "-p", "mslc-exec", "--bench", "collectives"]
    if mpi:
        cmd[5:5] = ["--features", "mpi"]
        cmd += ["--", "--mpi"]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"the collectives benchmark failed:\n{done.stdout}{done.stderr}")
    line = next(l for l in done.stdout.splitlines() if l.startswith("JSON "))
    return json.loads(line[5:])


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--mslc", default=os.path.join(ROOT, "target", "release", "mslc"))
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=64)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--grad-accum", type=int, default=1)
    p.add_argument("--no-collectives", action="store_true")
    p.add_argument("--mpi", action="store_true")
    a = p.parse_args()
    if not os.path.exists(a.mslc):
        sys.exit(f"{a.mslc} not found: build it with `cargo build --release` or pass --mslc")
    sets = ["--set", f"layers={a.layers}", "--dim", f"S={a.seq}"]
    with tempfile.TemporaryDirectory() as tmp:
        rng = np.random.default_rng(0)
        tokens = os.path.join(tmp, "tokens.npy")
        vocab = 1000  # examples/tiny_llama.msl's vocab
        np.save(tokens, rng.integers(0, vocab, size=(a.batch * 4, a.seq + 1)).astype(np.int64))
        data_src = source(tmp, "dp.msl", DATA, a.batch, a.grad_accum)
        tensor_src = source(tmp, "tp.msl", TENSOR, a.batch, a.grad_accum)
        # The same starting weights for every run (a tensor-parallel rank cuts its shards from
        # whole weights): one seeded step on one device.
        train(a.mslc, data_src, sets, tokens, os.path.join(tmp, "init"),
              ["--init-seed", "0", "--steps", "1", "--output-dir", os.path.join(tmp, "init")])
        weights = ["--weights", os.path.join(tmp, "init", "step-1", "model.safetensors")]
        steps = ["--steps", str(a.steps + a.warmup)]
        runs = [
            ("1 rank x 1 thread", data_src, ["--threads", "1"], ()),
            ("1 rank x 2 threads", data_src, ["--threads", "2"], ()),
            ("2 ranks data parallel x 1 thread", data_src, ["--ranks", "2", "--threads", "1"], ()),
            ("2 ranks tensor parallel x 1 thread", tensor_src, ["--ranks", "2", "--threads", "1"], ()),
        ]
        cores = os.cpu_count() or 1
        if cores >= 4:
            half = str(cores // 2)
            runs += [
                (f"1 rank x {cores} threads", data_src, ["--threads", str(cores)], ()),
                (f"2 ranks data parallel x {half} threads", data_src,
                 ["--ranks", "2", "--threads", half], ()),
            ]
        if a.mpi:
            mpiexec = ("mpiexec", "-n", "2")
            runs += [
                ("2 processes data parallel (MPI)", data_src, ["--mpi", "--threads", "1"], mpiexec),
                ("2 processes tensor parallel (MPI)", tensor_src, ["--mpi", "--threads", "1"], mpiexec),
            ]
        tokens_per_step = a.batch * a.seq
        print(f"tiny_llama {a.layers} layers, batch {a.batch} x S {a.seq} = {tokens_per_step} "
              f"tokens per step in {a.grad_accum} micro-batch(es), f32, {a.steps} steps after {a.warmup} warm-up, {os.cpu_count()} cores")
        rates = {}
        exchanged = {}
        for i, (name, src, extra, launcher) in enumerate(runs):
            out = os.path.join(tmp, f"run{i}")
            profile = [] if "1 rank" in name else ["--profile", out + ".trace.json"]
            ms = train(a.mslc, src, sets, tokens, out,
                       [*weights, *steps, *extra, *profile], launcher)[a.warmup:]
            median = statistics.median(ms)
            rates[name] = tokens_per_step / (median / 1e3)
            line = f"  {name:36} {median:9.1f} ms/step  {rates[name]:9.0f} tokens/s"
            threads = int(extra[extra.index("--threads") + 1])
            if not name.startswith("1 rank") and 2 * threads == cores:
                # What the plan describes: its two devices share the machine's cores.
                planned = planned_step_ms(a.mslc, src, "Pretrain", sets, out + ".plan")
                line += f"   plan {planned:6.1f} ms ({100 * (planned - median) / median:+.1f} %)"
            print(line)
            if profile:
                exchanged[name] = communication(profile[1])
        base = rates[runs[0][0]]
        for name, *_ in runs[1:]:
            print(f"  {name} / 1 rank x 1 thread: {rates[name] / base:.2f}x")
        print("communication in rank 0's last step (its profile), and the part of it that "
              "overlapped compute")
        for name, (comm, overlapped, step) in exchanged.items():
            share = comm / step if step else 0.0
            hidden = overlapped / comm if comm else 0.0
            print(f"  {name:36} {comm:7.1f} ms of {step:7.1f} ms ({100 * share:4.1f} %), "
                  f"overlapped {overlapped:6.1f} ms ({100 * hidden:4.1f} % of it), "
                  f"exposed {comm - overlapped:6.1f} ms")
    if not a.no_collectives:
        for mpi in [False, True] if a.mpi else [False]:
            c = collectives(mpi)
            print(f"all-reduce over {c['ranks']} ranks ({c['backend']}) against memcpy:")
            for s in c["sizes"]:
                print(f"  {s['mib']:3} MiB: {s['algo_gbps']:6.2f} GB/s algorithm, "
                      f"{s['bus_gbps']:6.2f} GB/s bus, memcpy {s['memcpy_gbps']:6.2f} GB/s, "
                      f"ratio {s['algo_gbps'] / s['memcpy_gbps']:.3f}")


if __name__ == "__main__":
    main()
