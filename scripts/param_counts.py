#!/usr/bin/env python3
"""Expected parameter counts of the example models, computed by hand from their configurations.

This is independent of mslc: it walks each architecture's parameter tensors with plain integer
arithmetic, so a test can compare `mslc check --summary` against it. Only trainable parameters
are counted; buffers (BatchNorm running statistics) are not. Tied weights count once.

The configurations below mirror the `const` and `dims` defaults of the files in `examples/`.
Where a public reference count exists (Hugging Face, torchvision), it is checked too, and the
script exits non-zero on any disagreement.

Usage:
    scripts/param_counts.py           # a table
    scripts/param_counts.py --json    # {"examples/NAME.msl": {"model": ..., "params": ...}, ...}
"""

import json
import sys


# --- building blocks: the parameter count of one layer ------------------------------------


def linear(n_in, n_out, bias):
    """torch.nn.Linear: weight [out, in] and optionally bias [out]."""
    return n_in * n_out + (n_out if bias else 0)


def embedding(vocab, dim):
    """torch.nn.Embedding: weight [vocab, dim]."""
    return vocab * dim


def rms_norm(dim):
    """LLaMA RMSNorm: weight [dim]."""
    return dim


def layer_norm(dim):
    """torch.nn.LayerNorm: weight and bias [dim]."""
    return 2 * dim


def conv2d(c_in, c_out, kernel, bias=False, groups=1):
    """torch.nn.Conv2d: weight [out, in / groups, k, k] and optionally bias [out]."""
    return c_out * (c_in // groups) * kernel * kernel + (c_out if bias else 0)


def batch_norm2d(channels):
    """torch.nn.BatchNorm2d: weight and bias [C]; running_mean/var are buffers."""
    return 2 * channels


# --- architectures ------------------------------------------------------------------------


def mlp(c):
    """A stack of biased Linear layers: in -> hidden... -> classes."""
    widths = [c["inputs"]] + [c["hidden"]] * c["depth"] + [c["classes"]]
    return sum(linear(a, b, True) for a, b in zip(widths, widths[1:]))


def llama(c):
    """HF LlamaForCausalLM: embeddings, decoder layers, final norm, untied lm_head."""
    h, heads, kv = c["hidden"], c["heads"], c["kv_heads"]
    d = h // heads
    attention = (
        linear(h, heads * d, False)  # q_proj
        + 2 * linear(h, kv * d, False)  # k_proj, v_proj
        + linear(heads * d, h, False)  # o_proj
    )
    mlp_ = 2 * linear(h, c["ffn"], False) + linear(c["ffn"], h, False)  # gate, up; down
    layer = rms_norm(h) + attention + rms_norm(h) + mlp_
    return (
        embedding(c["vocab"], h)
        + c["layers"] * layer
        + rms_norm(h)
        + linear(h, c["vocab"], False)  # lm_head
    )


def gpt_megatron(c):
    """Megatron-LM GPT: word + learned position embeddings, pre-LN layers with biases and a
    GeLU MLP, final LayerNorm; the output layer is tied to the word embeddings."""
    h, ffn = c["hidden"], c["ffn"]
    layer = (
        layer_norm(h)  # input_layernorm
        + linear(h, 3 * h, True)  # self_attention.query_key_value
        + linear(h, h, True)  # self_attention.dense
        + layer_norm(h)  # post_attention_layernorm
        + linear(h, ffn, True)  # mlp.dense_h_to_4h
        + linear(ffn, h, True)  # mlp.dense_4h_to_h
    )
    return (
        embedding(c["vocab"], h)
        + embedding(c["max_positions"], h)
        + c["layers"] * layer
        + layer_norm(h)  # final_layernorm
    )


def bert(c):
    """HF BertModel with its pooler (no pre-training heads)."""
    h, ffn = c["hidden"], c["ffn"]
    embeddings = (
        embedding(c["vocab"], h)
        + embedding(c["max_positions"], h)
        + embedding(c["type_vocab"], h)
        + layer_norm(h)
    )
    layer = (
        3 * linear(h, h, True)  # attention.self.{query,key,value}
        + linear(h, h, True)  # attention.output.dense
        + layer_norm(h)  # attention.output.LayerNorm
        + linear(h, ffn, True)  # intermediate.dense
        + linear(ffn, h, True)  # output.dense
        + layer_norm(h)  # output.LayerNorm
    )
    pooler = linear(h, h, True)
    return embeddings + c["layers"] * layer + pooler


def resnet_bottleneck(c):
    """torchvision ResNet with Bottleneck blocks (expansion 4, stride on the 3x3 conv)."""
    expansion = 4
    total = conv2d(c["channels"], 64, 7) + batch_norm2d(64)  # conv1, bn1
    inplanes = 64
    for stage, (planes, blocks) in enumerate(zip([64, 128, 256, 512], c["blocks"])):
        for b in range(blocks):
            stride = 2 if (stage > 0 and b == 0) else 1
            out = planes * expansion
            total += conv2d(inplanes, planes, 1) + batch_norm2d(planes)
            total += conv2d(planes, planes, 3) + batch_norm2d(planes)
            total += conv2d(planes, out, 1) + batch_norm2d(out)
            if stride != 1 or inplanes != out:
                total += conv2d(inplanes, out, 1) + batch_norm2d(out)  # downsample.{0,1}
            inplanes = out
    return total + linear(inplanes, c["classes"], True)  # fc


# --- the examples -------------------------------------------------------------------------

# (file, model name, architecture, config, published reference count or None)
EXAMPLES = [
    (
        "examples/mlp.msl",
        "Mlp",
        mlp,
        dict(inputs=784, hidden=256, depth=2, classes=10),
        None,
    ),
    (
        "examples/tiny_llama.msl",
        "TinyLlama",
        llama,
        dict(vocab=1000, hidden=256, layers=4, heads=4, kv_heads=4, ffn=688),
        None,
    ),
    (
        "examples/llama2_7b.msl",
        "Llama2_7B",
        llama,
        dict(vocab=32000, hidden=4096, layers=32, heads=32, kv_heads=32, ffn=11008),
        6_738_415_616,
    ),
    (
        "examples/llama2_13b.msl",
        "Llama2_13B",
        llama,
        dict(vocab=32000, hidden=5120, layers=40, heads=40, kv_heads=40, ffn=13824),
        13_015_864_320,
    ),
    (
        "examples/llama2_70b.msl",
        "Llama2_70B",
        llama,
        dict(vocab=32000, hidden=8192, layers=80, heads=64, kv_heads=8, ffn=28672),
        68_976_648_192,
    ),
    (
        "examples/gpt3_175b.msl",
        "Gpt3_175B",
        gpt_megatron,
        dict(vocab=51200, hidden=12288, layers=96, heads=96, ffn=4 * 12288, max_positions=2048),
        None,
    ),
    (
        "examples/bert_base.msl",
        "BertBase",
        bert,
        dict(vocab=30522, hidden=768, layers=12, heads=12, ffn=3072, max_positions=512, type_vocab=2),
        109_482_240,
    ),
    (
        "examples/resnet50.msl",
        "ResNet50",
        resnet_bottleneck,
        dict(channels=3, blocks=[3, 4, 6, 3], classes=1000),
        25_557_032,
    ),
]


def megatron_estimate(c):
    """The closed form of Narayanan et al. 2021 (Megatron-LM, eq. 2), which leaves out the
    final LayerNorm: 12 l h^2 (1 + 13 / (12 h) + (V + s) / (12 l h))."""
    l, h = c["layers"], c["hidden"]
    return 12 * l * h * h + 13 * l * h + (c["vocab"] + c["max_positions"]) * h


def main(argv):
    rows = [(path, name, arch(cfg), ref) for path, name, arch, cfg, ref in EXAMPLES]
    failures = [
        f"{path}: computed {count:,}, published {ref:,}"
        for path, _, count, ref in rows
        if ref is not None and count != ref
    ]
    gpt = next(cfg for path, _, _, cfg, _ in EXAMPLES if path.endswith("gpt3_175b.msl"))
    gpt_count = gpt_megatron(gpt)
    if gpt_count != megatron_estimate(gpt) + layer_norm(gpt["hidden"]):
        failures.append("examples/gpt3_175b.msl: disagrees with the Megatron-LM closed form")

    if "--json" in argv[1:]:
        print(json.dumps({p: {"model": n, "params": c} for p, n, c, _ in rows}, indent=2))
    else:
        print(f"{'example':<26} {'model':<12} {'parameters':>17}  reference")
        for path, name, count, ref in rows:
            note = "" if ref is None else ("ok" if ref == count else f"MISMATCH {ref:,}")
            print(f"{path:<26} {name:<12} {count:>17,}  {note}")
    for failure in failures:
        print(f"error: {failure}", file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
