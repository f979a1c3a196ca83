#!/usr/bin/env node
// Tokenizes .msl files with the extension's TextMate grammar (vscode-textmate + oniguruma, the
// engine VS Code uses) and prints JSON: one entry per file, one array of tokens per line, each
// token {start, end, text, scopes}. Used by scripts/check_editor_grammars.py.
//
//   node editors/vscode/scripts/tokenize.js FILE...
'use strict';
const fs = require('fs');
const path = require('path');
const vsctm = require('vscode-textmate');
const oniguruma = require('vscode-oniguruma');

const root = path.resolve(__dirname, '..');
const grammarPath = path.join(root, 'syntaxes', 'msl.tmLanguage.json');
const wasm = fs.readFileSync(path.join(path.dirname(require.resolve('vscode-oniguruma')), 'onig.wasm'));

async function main() {
  await oniguruma.loadWASM(wasm.buffer.slice(wasm.byteOffset, wasm.byteOffset + wasm.byteLength));
  const registry = new vsctm.Registry({
    onigLib: Promise.resolve({
      createOnigScanner: (sources) => new oniguruma.OnigScanner(sources),
      createOnigString: (s) => new oniguruma.OnigString(s),
    }),
    loadGrammar: async (scopeName) => {
      if (scopeName !== 'source.msl') return null;
      return vsctm.parseRawGrammar(fs.readFileSync(grammarPath, 'utf8'), grammarPath);
    },
  });
  const grammar = await registry.loadGrammar('source.msl');
  const out = {};
  for (const file of process.argv.slice(2)) {
    const lines = fs.readFileSync(file, 'utf8').split(/\r?\n/);
    let state = vsctm.INITIAL;
    out[file] = lines.map((line) => {
      const r = grammar.tokenizeLine(line, state);
      state = r.ruleStack;
      return r.tokens.map((t) => ({
        start: t.startIndex,
        end: Math.min(t.endIndex, line.length),
        text: line.slice(t.startIndex, t.endIndex),
        scopes: t.scopes,
      }));
    });
  }
  process.stdout.write(JSON.stringify(out));
}

main().catch((e) => {
  console.error(e);
  process.exit(2);
});
