#!/usr/bin/env python3
"""mslc against the implementations users compare it with: Hugging Face transformers,
torchvision and torch.optim, on random weights, in f32.

Forward (`mslc run --precision f32`): GPT-2, BERT and LLaMA (transformers' GPT2LMHeadModel,
BertModel, LlamaForCausalLM), ResNet-50 and ViT (torchvision), each shrunk with --set and loaded
from the framework's own state_dict written as safetensors (its names, its layouts), so the
examples' parameter paths are checked too. The figure is max |mslc - ref| / max |ref|.

Training (`mslc train --precision f32`):
- LLaMA with AdamW (betas, eps, decoupled weight decay, norms excluded by `no_decay`), a
  warm-up-cosine schedule with a floor (transformers'
  get_cosine_with_min_lr_schedule_with_warmup), clip_grad_norm_, cross-entropy with
  label_smoothing and ignore_index: every step's loss, learning rate and gradient norm, the first
  step's gradients (--dump-grads) and the final weights (the last checkpoint).
- An MLP with SGD (Nesterov momentum, weight decay) and a warm-up-linear schedule
  (get_linear_schedule_with_warmup): losses and final weights.
- ResNet-50 in training mode (BatchNorm on batch statistics, its running statistics updated
  with momentum and the unbiased variance): the running statistics after one step and the first
  step's gradients against torch in float64, as a ratio to torch's own float32 error against the
  same float64 (a batch-norm network on few samples per channel is ill-conditioned, so no f32
  result can be much closer than that).

usage: scripts/check_pytorch.py [--mslc PATH] [--keep DIR]

Needs torch, transformers, torchvision and safetensors, and a release mslc (`cargo build
--release`). Prints one line per check and exits 1 if any is beyond its tolerance.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np
import torch
import torch.nn.functional as F
import torchvision
import transformers
from safetensors.torch import load_file, save_file

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FORWARD_TOL = 1e-5  # max error relative to the largest reference magnitude, f32 both sides
LOSS_TOL = 1e-5  # relative, per step
WEIGHTS_TOL = 1e-5  # ‖got − want‖ / ‖want‖ per tensor after the last step
GRADS_TOL = 1e-5  # first-step gradients, relative to each tensor's largest magnitude

failures = []


def report(name, figure, tolerance):
    ok = figure <= tolerance
    if not ok:
        failures.append(name)
    print(f"{'ok  ' if ok else 'FAIL'} {name:66} {figure:9.2e}  (tolerance {tolerance:.0e})")


def rel_to_max(got, want):
    want = np.asarray(want, dtype=np.float64)
    return float(np.abs(np.asarray(got, dtype=np.float64) - want).max() / np.abs(want).max())


def norm_rel(got, want):
    got, want = got.double(), want.double()
    return ((got - want).norm() / want.norm().clamp(min=1e-30)).item()


def state_dict_file(model, path):
    """The model's state_dict as safetensors: float tensors as f32, integer ones as they are."""
    tensors = {}
    for name, value in model.state_dict().items():
        value = value.detach()
        tensors[name] = (value.float() if value.is_floating_point() else value).contiguous()
    save_file(tensors, path)


def mslc(args, *argv):
    result = subprocess.run([args.mslc, *argv], capture_output=True, text=True)
    if result.returncode != 0:
        sys.exit(f"mslc {argv[0]} failed:\n{result.stdout[-2000:]}\n{result.stderr[-4000:]}")


def knobs(flag, values):
    return [part for k, v in values.items() for part in (flag, f"{k}={v}")]


def forward(args, work, name, example, model, inputs, sets, dims, outputs):
    """Runs `example` with `model`'s weights on `inputs` and compares each output."""
    weights = os.path.join(work, f"{name}.safetensors")
    state_dict_file(model, weights)
    argv = ["run", os.path.join(ROOT, "examples", f"{example}.msl"), "--weights", weights,
            "--precision", "f32", "--output-dir", os.path.join(work, name)]
    for key, array in inputs.items():
        path = os.path.join(work, f"{name}.{key}.npy")
        np.save(path, array)
        argv += ["--input", f"{key}={path}"]
    mslc(args, *argv, *knobs("--set", sets), *knobs("--dim", dims))
    for output, want in outputs.items():
        got = np.load(os.path.join(work, name, f"{output}.npy"))
        report(f"forward {name} {output} {list(got.shape)}", rel_to_max(got, want), FORWARD_TOL)


def forwards(args, work):
    rng = np.random.default_rng(0)
    b, s, vocab = 2, 16, 300
    ids = rng.integers(0, vocab, (b, s)).astype(np.int32)
    ids_t = torch.tensor(ids, dtype=torch.long)
    dims = {"B": b, "S": s}

    gpt2 = transformers.GPT2LMHeadModel(transformers.GPT2Config(
        vocab_size=vocab, n_embd=64, n_layer=2, n_head=4, n_positions=32)).eval()
    with torch.no_grad():
        out = gpt2(ids_t, output_hidden_states=True)
    # mslc's gpt2 ties the head to `wte` and names the blocks as GPT2Model does.
    gpt2_body = gpt2.transformer
    forward(args, work, "gpt2", "gpt2", gpt2_body, {"input_ids": ids},
            {"vocab": vocab, "hidden": 64, "layers": 2, "heads": 4, "max_positions": 32}, dims,
            {"logits": out.logits, "last_hidden_state": out.hidden_states[-1]})

    bert = transformers.BertModel(transformers.BertConfig(
        vocab_size=vocab, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=128, max_position_embeddings=64)).eval()
    types = rng.integers(0, 2, (b, s)).astype(np.int32)
    with torch.no_grad():
        out = bert(ids_t, token_type_ids=torch.tensor(types, dtype=torch.long))
    forward(args, work, "bert", "bert_base", bert, {"input_ids": ids, "token_type_ids": types},
            {"vocab": vocab, "hidden": 64, "layers": 2, "heads": 4, "ffn": 128,
             "max_positions": 64}, dims,
            {"last_hidden_state": out.last_hidden_state, "pooler_output": out.pooler_output})

    llama = transformers.LlamaForCausalLM(llama_config(vocab)).eval()
    with torch.no_grad():
        out = llama(ids_t)
    forward(args, work, "llama", "tiny_llama", llama, {"tokens": ids}, llama_sets(vocab), dims,
            {"logits": out.logits})

    images = rng.standard_normal((2, 3, 64, 64)).astype(np.float32)
    resnet = torchvision.models.resnet50().eval()
    randomize(resnet)
    with torch.no_grad():
        want = resnet(torch.tensor(images))
    forward(args, work, "resnet50", "resnet50", resnet, {"images": images}, {},
            {"B": 2, "R": 64}, {"logits": want})

    vit = torchvision.models.VisionTransformer(
        image_size=64, patch_size=16, num_layers=2, num_heads=4, hidden_dim=64, mlp_dim=128,
        num_classes=10).eval()
    randomize(vit)
    with torch.no_grad():
        want = vit(torch.tensor(images))
    forward(args, work, "vit", "vit_b16", vit, {"images": images},
            {"hidden": 64, "layers": 2, "heads": 4, "mlp_dim": 128, "classes": 10},
            {"B": 2, "R": 64}, {"logits": want})


def randomize(model):
    """Gives the zero-initialised heads and the batch-norm running statistics random values, so
    every parameter and buffer matters."""
    with torch.no_grad():
        for name, value in model.state_dict().items():
            if name.endswith("running_mean") or "head" in name:
                value.copy_(torch.randn_like(value) * 0.05)
            elif name.endswith("running_var"):
                value.copy_(torch.rand_like(value) + 0.5)


def llama_config(vocab):
    return transformers.LlamaConfig(
        vocab_size=vocab, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, intermediate_size=96, rms_norm_eps=1e-6,
        max_position_embeddings=64, tie_word_embeddings=False)


def llama_sets(vocab):
    return {"vocab": vocab, "hidden": 64, "layers": 2, "heads": 4, "kv_heads": 2, "ffn": 96}


def train_mslc(args, work, name, source, weights, data, steps, extra):
    """`mslc train` of `source` from `weights` on `data` for `steps` steps: its metrics, first
    gradients and final weights."""
    path = os.path.join(work, f"{name}.msl")
    with open(path, "w") as f:
        f.write(source)
    out = os.path.join(work, name)
    os.makedirs(out, exist_ok=True)
    mslc(args, "train", path, "--weights", weights, "--data", data, "--steps", str(steps),
         "--precision", "f32", "--metrics", os.path.join(out, "metrics.jsonl"),
         "--output-dir", os.path.join(out, "ck"), "--dump-grads", os.path.join(out, "grads"),
         *extra)
    with open(os.path.join(out, "metrics.jsonl")) as f:
        metrics = [json.loads(line) for line in f]
    grads = load_file(os.path.join(out, "grads", "grads.safetensors"))
    final = load_file(os.path.join(out, "ck", f"step-{steps}", "model.safetensors"))
    return metrics, grads, final


def model_source(example):
    """The example's model declaration without its own policies and train."""
    with open(os.path.join(ROOT, "examples", f"{example}.msl")) as f:
        text = f.read()
    cut = min(i for i in (text.find("\nprecision "), text.find("\n// f16 has"), len(text))
              if i >= 0)
    return text[:cut]


def data_dir(work, name, arrays):
    path = os.path.join(work, f"{name}.data")
    os.makedirs(path, exist_ok=True)
    for key, array in arrays.items():
        np.save(os.path.join(path, f"{key}.npy"), array)
    return path


def train_llama(args, work):
    torch.manual_seed(0)
    rng = np.random.default_rng(1)
    b, s, vocab, steps = 4, 16, 300, 10
    model = transformers.LlamaForCausalLM(llama_config(vocab)).train()
    weights = os.path.join(work, "llama_train.safetensors")
    state_dict_file(model, weights)
    tokens = rng.integers(0, vocab, (b * steps, s)).astype(np.int32)
    labels = rng.integers(0, vocab, (b * steps, s)).astype(np.int32)
    labels[rng.random(labels.shape) < 0.2] = -100
    data = data_dir(work, "llama", {"tokens": tokens, "labels": labels})
    source = model_source("tiny_llama") + """
train Fit for TinyLlama {
    labels: i32[B, S]
    loss = cross_entropy(logits, labels, label_smoothing: 0.1)
    optimizer = adamw(lr: 3e-3, betas: (0.9, 0.95), eps: 1e-8, weight_decay: 0.1)
    schedule = warmup_cosine(warmup: 3, total: 12, min_lr: 3e-4)
    clip_grad_norm = 0.5
    no_decay = ["**.*norm*.weight"]
    batch = 4
    target = std.targets.cpu
}
"""
    metrics, grads, final = train_mslc(args, work, "llama_train", source, weights, data, steps,
                                       knobs("--set", llama_sets(vocab)) + ["--dim", f"S={s}"])
    named = list(model.named_parameters())
    groups = [{"params": [p for n, p in named if "norm" not in n], "weight_decay": 0.1},
              {"params": [p for n, p in named if "norm" in n], "weight_decay": 0.0}]
    opt = torch.optim.AdamW(groups, lr=3e-3, betas=(0.9, 0.95), eps=1e-8)
    schedule = transformers.get_cosine_with_min_lr_schedule_with_warmup(opt, 3, 12, min_lr=3e-4)
    worst = {"loss": 0.0, "lr": 0.0, "grad_norm": 0.0}
    for k in range(steps):
        x = torch.tensor(tokens[k * b:(k + 1) * b], dtype=torch.long)
        y = torch.tensor(labels[k * b:(k + 1) * b], dtype=torch.long)
        loss = F.cross_entropy(model(x).logits.reshape(-1, vocab), y.reshape(-1),
                               ignore_index=-100, label_smoothing=0.1)
        opt.zero_grad()
        loss.backward()
        if k == 0:
            report("train llama: first step's gradients (worst tensor)",
                   max(rel_to_max(grads[n].numpy(), p.grad.numpy()) for n, p in named), GRADS_TOL)
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5).item()
        for key, want in (("loss", loss.item()), ("lr", schedule.get_last_lr()[0]),
                          ("grad_norm", norm)):
            got = metrics[k][key]
            worst[key] = max(worst[key], abs(got - want) / max(abs(want), 1e-30))
        opt.step()
        schedule.step()
    for key, figure in worst.items():
        report(f"train llama: {key} of {steps} steps (worst step, relative)", figure, LOSS_TOL)
    report(f"train llama: weights after {steps} steps (worst tensor, in norm)",
           max(norm_rel(final[n], p.detach()) for n, p in named), WEIGHTS_TOL)


def train_mlp(args, work):
    torch.manual_seed(0)
    rng = np.random.default_rng(2)
    b, steps, inputs, hidden, classes = 16, 10, 32, 24, 5
    layers = [torch.nn.Linear(inputs, hidden), torch.nn.Linear(hidden, hidden)]
    head = torch.nn.Linear(hidden, classes)
    model = torch.nn.ModuleDict({"layers": torch.nn.ModuleList(layers), "head": head})

    def run(x):
        for layer in model["layers"]:
            x = torch.relu(layer(x))
        return model["head"](x)

    weights = os.path.join(work, "mlp_train.safetensors")
    state_dict_file(model, weights)
    images = rng.standard_normal((b * steps, inputs)).astype(np.float32)
    labels = rng.integers(0, classes, b * steps).astype(np.int32)
    data = data_dir(work, "mlp", {"images": images, "labels": labels})
    source = model_source("mlp") + """
train Fit for Mlp {
    labels: i32[B]
    loss = cross_entropy(logits, labels)
    optimizer = sgd(lr: 0.1, momentum: 0.9, nesterov: true, weight_decay: 0.01)
    schedule = warmup_linear(warmup: 2, total: 10)
    batch = 16
    target = std.targets.cpu
}
"""
    sets = {"inputs": inputs, "hidden": hidden, "depth": 2, "classes": classes}
    metrics, _, final = train_mslc(args, work, "mlp_train", source, weights, data, steps,
                                   knobs("--set", sets))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, nesterov=True,
                          weight_decay=0.01)
    schedule = transformers.get_linear_schedule_with_warmup(opt, 2, 10)
    worst = 0.0
    for k in range(steps):
        x = torch.tensor(images[k * b:(k + 1) * b])
        y = torch.tensor(labels[k * b:(k + 1) * b], dtype=torch.long)
        loss = F.cross_entropy(run(x), y)
        opt.zero_grad()
        loss.backward()
        worst = max(worst, abs(metrics[k]["loss"] - loss.item()) / loss.item())
        opt.step()
        schedule.step()
    report(f"train mlp (SGD Nesterov): loss of {steps} steps (worst, relative)", worst, LOSS_TOL)
    report(f"train mlp (SGD Nesterov): weights after {steps} steps (worst, in norm)",
           max(norm_rel(final[n], p.detach()) for n, p in model.named_parameters()),
           WEIGHTS_TOL)


def train_resnet(args, work):
    torch.manual_seed(0)
    rng = np.random.default_rng(3)
    b, r, classes = 4, 64, 10
    model = torchvision.models.resnet50(num_classes=classes).train()
    weights = os.path.join(work, "resnet_train.safetensors")
    state_dict_file(model, weights)
    images = rng.standard_normal((b, 3, r, r)).astype(np.float32)
    labels = rng.integers(0, classes, b).astype(np.int32)
    data = data_dir(work, "resnet", {"images": images, "labels": labels})
    source = model_source("resnet50") + """
train Fit for ResNet50 {
    labels: i32[B]
    loss = cross_entropy(logits, labels)
    optimizer = sgd(lr: 0.05, momentum: 0.9)
    batch = 4
    target = std.targets.cpu
}
"""
    _, grads, final = train_mslc(args, work, "resnet_train", source, weights, data, 1,
                             ["--set", f"classes={classes}", "--dim", f"R={r}"])

    def torch_grads(dtype):
        net = torchvision.models.resnet50(num_classes=classes).train()
        net.load_state_dict(load_file(weights))
        net = net.to(dtype)
        y = torch.tensor(labels, dtype=torch.long)
        F.cross_entropy(net(torch.tensor(images).to(dtype)), y).backward()
        buffers = {n: b for n, b in net.named_buffers() if "running" in n}
        return {n: p.grad.double() for n, p in net.named_parameters()}, buffers

    (exact, running), (single, single_running) = (torch_grads(torch.float64),
                                                  torch_grads(torch.float32))
    for what, ours, theirs, want in (
            ("running mean and var after one step", final, single_running, running),
            ("first step's gradients", grads, single, exact)):
        ours = max(norm_rel(ours[n], w) for n, w in want.items())
        theirs = max(norm_rel(theirs[n], w) for n, w in want.items())
        print(f"     resnet50 train mode, {what} against torch f64 (worst tensor, in norm): "
              f"mslc {ours:.2e}, torch f32 {theirs:.2e}")
        report(f"train resnet50: {what}, mslc's error over torch f32's",
               ours / max(theirs, 1e-30), 2.0)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--mslc", default=os.path.join(ROOT, "target", "release", "mslc"))
    p.add_argument("--keep", help="write the work files here and keep them")
    args = p.parse_args()
    print(f"torch {torch.__version__}, transformers {transformers.__version__}, "
          f"torchvision {torchvision.__version__}")
    work = args.keep or tempfile.mkdtemp(prefix="mslc-check-pytorch-")
    os.makedirs(work, exist_ok=True)
    try:
        forwards(args, work)
        train_llama(args, work)
        train_mlp(args, work)
        train_resnet(args, work)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    if failures:
        sys.exit(f"{len(failures)} check(s) beyond tolerance: {', '.join(failures)}")


if __name__ == "__main__":
    main()
