#!/usr/bin/env python3
"""Keeps the editor grammars honest (issue 12, item 3).

Reads, at run time, every keyword of grammar/msl.pest (its quoted literals that are words) and
every op name of crates/core/src/ops/registry.rs (the `Variant = "name" => spec` table), writes a
probe file that uses each of them where the pest grammar allows it, and checks that

  * the VS Code TextMate grammar (editors/vscode/syntaxes/msl.tmLanguage.json, tokenized by
    vscode-textmate + oniguruma through editors/vscode/scripts/tokenize.js, the engine VS Code
    uses) gives each one a highlighting scope (ops: support.function.builtin.msl), and
  * Vim (editors/vim, loaded through ftdetect as a user would) gives each one a syntax group
    (ops: mslBuiltin);

that every examples/*.msl and stdlib/**/*.msl file tokenizes without `invalid` scopes
(TextMate) or error groups (Vim), that every scope the TextMate grammar can give is asserted
by some vscode-tmgrammar-test sample in editors/vscode/test, and that the two grammars agree, per
character of the probe, samples, examples and stdlib, on the token class (TM_TO_VIM), so every
token class the samples test in VS Code is also checked in Vim. Exits 1 listing what is missing.

Needs python3 (stdlib only), node with `npm ci` done in editors/vscode, and vim (`--no-vim`
skips the Vim half, e.g. on a machine without vim; CI should not pass it).

After adding an op to the registry, `python3 scripts/check_editor_grammars.py --fix` rewrites the op
lists of both grammars (the `ops` rule of the TextMate grammar, `s:ops` in syntax/msl.vim).
A new keyword needs a hand-written rule in each grammar and, if its probe is not obvious, an entry
in BY_WORD / BY_RULE below.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PEST = ROOT / "grammar" / "msl.pest"
REGISTRY = ROOT / "crates" / "core" / "src" / "ops" / "registry.rs"
VSCODE = ROOT / "editors" / "vscode"
TOKENIZE = VSCODE / "scripts" / "tokenize.js"
VIM_RTP = ROOT / "editors" / "vim"
VIM_DUMP = VIM_RTP / "test" / "dump_syntax.vim"
TM_GRAMMAR = VSCODE / "syntaxes" / "msl.tmLanguage.json"
TM_SAMPLES = VSCODE / "test"

# Literals of these rules are not keywords: the exponent letter and string escapes.
NOT_KEYWORDS = {"exponent", "string_inner"}

# Where each kind of word may stand, as a probe. `{w}` is the word; the check looks at its first
# whole-word occurrence. A word is probed once per pest rule that holds it (`f32` as a dtype and
# as an annotation): by the rule's probe, else by the word's; a `kw_*` rule or word neither table
# knows falls back to GENERIC, so a keyword added to the pest grammar is still probed (and fails
# until the editor grammars learn it).
BY_WORD = {
    "let": "let x = 1",
    "for": "for i in 0..n {\n}",
    "in": "for i in 0..n {\n}",
    "if": "if a {\n} else {\n}",
    "else": "if a {\n} else {\n}",
    "return": "return x",
    "true": "x = true",
    "false": "x = false",
    "pub": "pub const a = 1",
    "import": "import std.nn.Linear",
    "as": "import std.nn.{Linear as L}",
    "const": "const a = 1, b = 2",
    "dims": "dims B = 1, S = 128",
    "block": "block F(x: [B]) -> [B] {\n}",
    "model": "model M {\n}",
    "train": "train T for M {\n}",
    "target": "target t {\n}",
    "shard": "parallel P {\n    shard \"a.*.b\" = [mp, _]\n}",
    "input": "input x: f32[B]",
    "output": "output y = x",
}
BY_RULE = {
    "scalar_type": "block F(a: {w}) {{\n}}",
    "dtype_name": "input x: {w}[B, S]",
    "annotation_name": "let y = x @{w}",
    "matmul_op": "@{w}(unused)\nmodel M {{\n}}",
    "lint_name": "@allow({w})\nmodel M {{\n}}",
    "policy_kind": "{w} P {{\n    a = 1\n}}",
    "param_kind": "{w} w: [4] ~ zeros",
    "unit": "target t {{\n    m = 8{w}\n}}",
    "word": "parallel P {{\n    pipeline = {{ schedule: {w} }}\n}}",
}
GENERIC = "{w} x"
OP_PROBES = ["let y = {w}(x, axis: -1)", "precision P {{\n    keep_f32 = [{w}]\n}}"]

# What counts as highlighted. TextMate: the innermost scope is not the file's, a meta scope, a
# plain name, a comment, a string or invalid. Vim: a group that is not a plain name or an error.
TM_PLAIN = ("source.msl", "meta.", "variable.other.msl", "variable.other.constant.msl",
            "variable.parameter", "variable.other.property", "entity.name.tag", "comment.",
            "string.", "invalid.", "punctuation.")
VIM_PLAIN = {"", "mslNamedArg", "mslLabel", "mslTypeName", "mslLineComment", "mslDocComment",
             "mslBlockComment", "mslString", "mslNumberError", "mslBadEscape", "mslError"}
VIM_ERRORS = {"mslNumberError", "mslBadEscape", "mslError"}

# The two grammars must agree on every character of the samples, examples and stdlib: the
# TextMate scope (longest matching prefix) -> the Vim groups allowed there. Scopes not listed are
# plain text in both (names, brackets, separators): Vim may leave them plain or treat them as part
# of a name, label, import or operator.
TM_TO_VIM = {
    "comment.block": {"mslBlockComment"},
    "comment.line.documentation": {"mslDocComment"},
    "comment.line.double-slash": {"mslLineComment"},
    "punctuation.definition.comment": {"mslLineComment", "mslDocComment", "mslBlockComment"},
    "constant.character.escape": {"mslEscape"},
    "constant.language.boolean": {"mslBoolean"},
    "constant.language.schedule": {"mslWord"},
    "constant.numeric.float": {"mslFloat"},
    "constant.numeric.integer": {"mslNumber"},
    "constant.numeric.quantity": {"mslQuantity"},
    "keyword.other.unit": {"mslUnit"},
    "entity.name.tag.label": {"mslLabel"},
    "entity.name.type.block": {"mslBlockRef", "mslTypeName"},
    "entity.name.type.model": {"mslTypeName", "mslModelRef"},
    "entity.name.type.policy": {"mslTypeName"},
    "entity.name.type.target": {"mslTypeName"},
    "entity.name.type.train": {"mslTypeName"},
    "entity.name.type": {"mslImportType"},
    "entity.name.namespace": {"mslNamespace"},
    "invalid.illegal.character": {"mslError"},
    "invalid.illegal.escape": {"mslBadEscape"},
    "invalid.illegal.numeric": {"mslNumberError"},
    "keyword.control.import.as": {"mslImportAs", "mslInclude"},
    "keyword.control.import": {"mslInclude"},
    "keyword.control": {"mslConditional", "mslRepeat", "mslStatement"},
    "keyword.operator.glob": {"mslGlob"},
    "keyword.operator.transpose": {"mslTranspose"},
    "keyword.operator": {"mslOperator"},
    "keyword.other.for": {"mslRepeat"},
    "keyword.other.input": {"mslStatement"},
    "keyword.other.output": {"mslStatement"},
    "keyword.other.policy": {"mslStructure"},
    "keyword.other.target": {"mslStructure"},
    "keyword.other.train": {"mslStructure"},
    "keyword.other.shard": {"mslKeyword"},
    "punctuation.definition.alternation": {"mslGlob"},
    "punctuation.definition.annotation": {"mslAnnotation"},
    "storage.modifier.annotation": {"mslAnnotation"},
    "punctuation.definition.string": {"mslString"},
    "string.quoted.double": {"mslString"},
    "storage.modifier.pub": {"mslStorageClass"},
    "storage.type.block": {"mslStructure"},
    "storage.type.model": {"mslStructure"},
    "storage.type.dtype": {"mslDtype"},
    "storage.type.primitive": {"mslScalarType"},
    "storage.type": {"mslDeclare"},
    "support.function.builtin": {"mslBuiltin"},
    "support.function": {"mslLibFunction"},
    "variable.language.wildcard": {"mslWildcard"},
}
VIM_NEUTRAL = {"", "mslNamedArg", "mslLabel", "mslImport", "mslOperator"}


def vim_groups_for(scope: str):
    """The Vim groups allowed where TextMate gives `scope` (None: plain, see VIM_NEUTRAL)."""
    parts = scope.removesuffix(".msl").split(".")
    for n in range(len(parts), 0, -1):
        allowed = TM_TO_VIM.get(".".join(parts[:n]))
        if allowed is not None:
            return allowed
    return None


def pest_rules(text: str) -> dict[str, str]:
    """Rule name -> body, for every `name = MOD{ ... }` of a pest file (bodies may span lines)."""
    text = re.sub(r"//[^\n]*", "", text)
    rules = {}
    for m in re.finditer(r"(?m)^\s*(\w+)\s*=\s*[_@$!]?\{", text):
        i, depth, in_str = m.end(), 1, False
        while i < len(text) and depth:
            c = text[i]
            if in_str:
                if c == "\\":
                    i += 1
                elif c == '"':
                    in_str = False
            elif c == '"':
                in_str = True
            elif c == "{":
                depth += 1
            elif c == "}":
                depth -= 1
            i += 1
        rules[m.group(1)] = text[m.end(): i - 1]
    return rules


def pest_words() -> list[tuple[str, str]]:
    """(word, rule) for every quoted literal of the pest grammar that contains a letter."""
    found = set()
    for rule, body in pest_rules(PEST.read_text()).items():
        if rule in NOT_KEYWORDS:
            continue
        for lit in re.findall(r'"((?:[^"\\]|\\.)*)"', body):
            if re.fullmatch(r"[A-Za-z0-9_/]+", lit) and re.search(r"[A-Za-z]", lit):
                found.add((lit, rule))
    return sorted(found)


def registry_ops() -> list[str]:
    ops = re.findall(r'(?m)^\s*[A-Z]\w*\s*=\s*"([^"]+)"\s*=>', REGISTRY.read_text())
    if not ops:
        sys.exit(f"check_editor_grammars: found no `Variant = \"name\" => spec` rows in {REGISTRY}")
    return sorted(set(ops))


def probe_for(word: str, rule: str) -> str:
    if rule in BY_RULE:
        return BY_RULE[rule].format(w=word)
    return BY_WORD.get(word, GENERIC.format(w=word))


def build_probe(words, ops):
    """The probe file's lines and, per (kind, name, probe), the (line, col) of the name."""
    lines, sites = [], []

    def add(kind, name, snippet):
        start = len(lines)
        lines.extend(snippet.split("\n"))
        for i, line in enumerate(lines[start:], start):
            before = r"(?<=\d)" if kind == "unit" else r"(?<![A-Za-z0-9_])"  # a unit follows its number
            m = re.search(before + re.escape(name) + r"(?![A-Za-z0-9_])", line)
            if m:
                sites.append((kind, name, snippet, i, m.start(), m.end()))
                break
        else:
            raise AssertionError(f"probe for {name!r} does not contain it: {snippet!r}")
        lines.append("")

    for word, rule in words:
        add("keyword" if rule != "unit" else "unit", word, probe_for(word, rule))
    for op in ops:
        for p in OP_PROBES:
            add("op", op, p.format(w=op))
    return lines, sites


def tm_unasserted_scopes() -> list[str]:
    """Scopes the TextMate grammar can give that no vscode-tmgrammar-test sample asserts: the
    samples must exercise every token class the grammar has."""
    names = set()

    def walk(o):
        if isinstance(o, dict):
            for k, v in o.items():
                if k in ("name", "contentName") and isinstance(v, str):
                    names.update(v.split())
                else:
                    walk(v)
        elif isinstance(o, list):
            for v in o:
                walk(v)

    grammar = json.loads(TM_GRAMMAR.read_text())
    walk(grammar["patterns"])
    walk(grammar["repository"])
    asserted = set()
    for f in TM_SAMPLES.glob("*.msl"):
        for line in f.read_text().splitlines():
            m = re.match(r"\s*//\s*(?:\^+|<[-~]+)\s+(.*)$", line)
            if m:
                asserted.update(t for t in m.group(1).split() if t != "-")
    return sorted(names - asserted)


def fix_op_lists(ops) -> list[str]:
    """Rewrites the op list of both grammars to the registry's (`--fix`); returns what changed."""
    changed = []
    grammar = json.loads(TM_GRAMMAR.read_text())
    rule = grammar["repository"]["ops"]
    m = re.fullmatch(r"(.*?\()([a-z0-9_|]+)(\).*)", rule["match"])
    if not m:
        sys.exit(f"check_editor_grammars: cannot find the op alternation in {TM_GRAMMAR}: {rule['match']}")
    longest_first = sorted(ops, key=lambda o: (-len(o), o))
    new = m.group(1) + "|".join(longest_first) + m.group(3)
    if new != rule["match"]:
        rule["match"] = new
        TM_GRAMMAR.write_text(json.dumps(grammar, indent=2, ensure_ascii=False) + "\n")
        changed.append(str(TM_GRAMMAR.relative_to(ROOT)))
    vim_syntax = VIM_RTP / "syntax" / "msl.vim"
    text = vim_syntax.read_text()
    m = re.search(r"(?ms)^let s:ops = \[\n.*?^\s*\\ \]\n", text)
    if not m:
        sys.exit(f"check_editor_grammars: cannot find `let s:ops = [` in {vim_syntax}")
    lines, line = ["let s:ops = ["], "      \\ "
    for i, op in enumerate(ops):
        item = f"'{op}'" + (", " if i + 1 < len(ops) else "")
        if len(line) + len(item) > 100:
            lines.append(line.rstrip())
            line = "      \\ "
        line += item
    lines += [line.rstrip(), "      \\ ]"]
    block = "\n".join(lines) + "\n"
    if block != m.group(0):
        vim_syntax.write_text(text[: m.start()] + block + text[m.end():])
        changed.append(str(vim_syntax.relative_to(ROOT)))
    return changed


def tm_tokenize(paths):
    if not (VSCODE / "node_modules" / "vscode-textmate").is_dir():
        sys.exit("check_editor_grammars: run `npm ci` in editors/vscode first "
                 "(vscode-textmate is not installed)")
    node = shutil.which("node")
    if not node:
        sys.exit("check_editor_grammars: node is not on PATH")
    out = subprocess.run([node, str(TOKENIZE), *map(str, paths)], capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"check_editor_grammars: tokenize.js failed:\n{out.stderr}")
    return json.loads(out.stdout)


def vim_dump(paths):
    vim = shutil.which("vim")
    if not vim:
        sys.exit("check_editor_grammars: vim is not on PATH (pass --no-vim to skip the Vim half)")
    with tempfile.TemporaryDirectory() as d:
        cmd = [vim, "-u", "NONE", "-i", "NONE", "-N", "-es", "-n",
               "--cmd", f"set rtp^={VIM_RTP}", "-c", "filetype on", "-c", "syntax on",
               "-c", f"let g:msl_dump_dir = {json.dumps(d)}", "-c", f"source {VIM_DUMP}",
               *map(str, paths)]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        dumps = []
        for i, p in enumerate(paths):
            f = Path(d) / f"{i}.txt"
            if not f.exists():
                sys.exit(f"check_editor_grammars: vim wrote no dump for {p} "
                         f"(rc {r.returncode}): {r.stdout}{r.stderr}")
            rows = f.read_text().split("\n")
            dumps.append((rows[0], [row.split(",") if row else [] for row in rows[1:]]))
        return dumps


def tm_scopes_at(tokens, col):
    for t in tokens:
        if t["start"] <= col < t["end"]:
            return t["scopes"]
    return ["source.msl"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--no-vim", action="store_true", help="skip the Vim syntax checks")
    ap.add_argument("-v", "--verbose", action="store_true", help="print every probed word")
    ap.add_argument("--fix", action="store_true",
                    help="first rewrite the op lists of both grammars to the registry's, then check")
    args = ap.parse_args()

    words, ops = pest_words(), registry_ops()
    if args.fix:
        for path in fix_op_lists(ops):
            print(f"check_editor_grammars: rewrote the op list in {path}")
    lines, sites = build_probe(words, ops)
    corpus = sorted((ROOT / "examples").glob("*.msl")) + sorted((ROOT / "stdlib").rglob("*.msl"))
    samples = sorted(TM_SAMPLES.glob("*.msl"))
    problems = []

    with tempfile.TemporaryDirectory() as d:
        probe = Path(d) / "probe.msl"
        probe.write_text("\n".join(lines) + "\n")
        files = [probe, *corpus, *samples]

        # ---- TextMate
        for scope in tm_unasserted_scopes():
            problems.append(f"TextMate: no sample in {TM_SAMPLES.relative_to(ROOT)} asserts {scope}")
        tm = tm_tokenize(files)
        probe_tokens = tm[str(probe)]
        for kind, name, snippet, li, c0, c1 in sites:
            scopes_per_char = [tm_scopes_at(probe_tokens[li], c)[-1] for c in range(c0, c1)]
            bad = [s for s in scopes_per_char if s.startswith(TM_PLAIN)]
            if kind == "op":
                bad = [s for s in scopes_per_char if s != "support.function.builtin.msl"]
            if bad:
                problems.append(f"TextMate: {kind} {name!r} is not highlighted (scope {bad[0]!r}) "
                                f"in: {snippet!r}")
            elif args.verbose:
                print(f"TextMate ok: {kind} {name!r} -> {scopes_per_char[0]}  in {snippet!r}")
        for path in corpus:
            for li, toks in enumerate(tm[str(path)]):
                for t in toks:
                    if any(s.startswith("invalid.") for s in t["scopes"]):
                        problems.append(f"TextMate: {path.relative_to(ROOT)}:{li + 1}:{t['start'] + 1}:"
                                        f" {t['text']!r} is {t['scopes'][-1]}")

        # ---- Vim
        if not args.no_vim:
            dumps = vim_dump(files)
            for (ft, _), path in zip(dumps, files):
                if ft != "msl":
                    problems.append(f"Vim: ftdetect gave filetype {ft!r} for {path.name}, not 'msl'")
            probe_rows = dumps[0][1]
            for kind, name, snippet, li, c0, c1 in sites:
                # Vim columns are bytes; the probe is ASCII.
                groups = [probe_rows[li][c] if c < len(probe_rows[li]) else "" for c in range(c0, c1)]
                bad = [g for g in groups if g in VIM_PLAIN]
                if kind == "op":
                    bad = [g for g in groups if g != "mslBuiltin"]
                if bad:
                    problems.append(f"Vim: {kind} {name!r} is not highlighted (group {bad[0]!r}) "
                                    f"in: {snippet!r}")
                elif args.verbose:
                    print(f"Vim ok: {kind} {name!r} -> {groups[0]}  in {snippet!r}")
            # Agreement, character by character, on everything both grammars tokenized.
            disagreements = {}
            for (_, rows), path in zip(dumps, files):
                text_lines = path.read_text().split("\n")
                for li, toks in enumerate(tm[str(path)]):
                    line = text_lines[li] if li < len(text_lines) else ""
                    if not line.isascii():   # Vim's columns are bytes; compare ASCII lines only
                        continue
                    row = rows[li] if li < len(rows) else []
                    for t in toks:
                        scope = t["scopes"][-1]
                        allowed = vim_groups_for(scope)
                        for col in range(t["start"], t["end"]):
                            if line[col].isspace():
                                continue
                            g = row[col] if col < len(row) else ""
                            ok = g in VIM_NEUTRAL if allowed is None else g in allowed
                            if not ok:
                                where = "probe" if path == probe else path.relative_to(ROOT)
                                disagreements.setdefault((scope, g), f"{where}:{li + 1}:{col + 1}: {line.strip()[:80]}")
            for (scope, g), where in sorted(disagreements.items()):
                problems.append(f"TextMate {scope} but Vim {g or 'no group'!s} at {where}")
            for (_, rows), path in zip(dumps[1:1 + len(corpus)], corpus):
                for li, row in enumerate(rows):
                    for c, g in enumerate(row):
                        if g in VIM_ERRORS and (c == 0 or row[c - 1] != g):
                            problems.append(f"Vim: {path.relative_to(ROOT)}:{li + 1}:{c + 1}: {g}")

    n_kw = len({w for w, r in words if r != "unit"})
    n_units = len({w for w, r in words if r == "unit"})
    summary = (f"{n_kw} keywords ({len(words) - n_units} uses) and {n_units} units of {PEST.relative_to(ROOT)}, "
               f"{len(ops)} ops of {REGISTRY.relative_to(ROOT)}, {len(corpus)} example/stdlib files, "
               f"{len(samples)} samples; "
               f"grammars: TextMate{'' if args.no_vim else ', Vim'}")
    if problems:
        print("check_editor_grammars: FAILED\n  " + "\n  ".join(problems), file=sys.stderr)
        print(summary, file=sys.stderr)
        return 1
    print(f"check_editor_grammars: ok ({summary})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
