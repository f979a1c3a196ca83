// Loads src/extension.js with stand-ins for `vscode` and `vscode-languageclient/node` (the real
// ones need a running editor) and checks what it starts: `<msl.server.path> lsp [extraArgs]`
// over stdio for the `msl` language, a restart on a settings change, and one warning, not a
// crash, when the server cannot be started.  node test/client.test.js
'use strict';
const assert = require('assert');
const Module = require('module');
const path = require('path');

const started = [];
const warnings = [];
let failStart = false;
let settings = { 'server.path': 'mslc', 'server.extraArgs': [] };
let onConfig;

const vscode = {
  workspace: {
    getConfiguration: (section) => {
      assert.strictEqual(section, 'msl');
      return { get: (k) => settings[k] };
    },
    createFileSystemWatcher: (glob) => ({ glob }),
    onDidChangeConfiguration: (f) => { onConfig = f; return { dispose() {} }; },
  },
  window: { showWarningMessage: (m) => warnings.push(m) },
  commands: { registerCommand: (name, f) => ({ name, f, dispose() {} }) },
};
class LanguageClient {
  constructor(id, name, server, client) {
    Object.assign(this, { id, name, server, client, running: false });
  }
  async start() {
    if (failStart) throw new Error('spawn mslc ENOENT');
    this.running = true;
    started.push(this);
  }
  async stop() { this.running = false; }
}
const lc = { LanguageClient, TransportKind: { stdio: 0 } };

const resolve = Module._resolveFilename;
Module._resolveFilename = function (req, ...rest) {
  if (req === 'vscode' || req === 'vscode-languageclient/node') return req;
  return resolve.call(this, req, ...rest);
};
require.cache.vscode = { id: 'vscode', filename: 'vscode', loaded: true, exports: vscode };
require.cache['vscode-languageclient/node'] = { id: 'lc', filename: 'lc', loaded: true, exports: lc };

(async () => {
  const ext = require(path.join(__dirname, '..', 'src', 'extension.js'));
  const context = { subscriptions: [] };
  await ext.activate(context);
  assert.strictEqual(started.length, 1);
  const c = started[0];
  assert.deepStrictEqual(c.server, { command: 'mslc', args: ['lsp'], transport: 0 });
  assert.deepStrictEqual(c.client.documentSelector.map((d) => d.language), ['msl', 'msl']);
  const cmds = context.subscriptions.map((s) => s.name).filter(Boolean);
  assert.deepStrictEqual(cmds, ['msl.restartServer']);

  // A new path in the settings restarts the server with it.
  settings = { 'server.path': '/opt/mslc/bin/mslc', 'server.extraArgs': ['--stdlib', 'std'] };
  await onConfig({ affectsConfiguration: (s) => s === 'msl.server' });
  assert.strictEqual(c.running, false);
  assert.strictEqual(started.length, 2);
  assert.deepStrictEqual(started[1].server.command, '/opt/mslc/bin/mslc');
  assert.deepStrictEqual(started[1].server.args, ['lsp', '--stdlib', 'std']);

  // No server binary (mslc lsp does not exist yet): a warning, and activation still succeeds.
  failStart = true;
  await ext.deactivate();
  await ext.activate({ subscriptions: [] });
  assert.strictEqual(warnings.length, 1);
  assert.match(warnings[0], /could not start the language server `\/opt\/mslc\/bin\/mslc lsp`/);
  await ext.deactivate();
  console.log('✓ test/client.test.js: starts `mslc lsp`, restarts on settings, survives a missing server');
})().catch((e) => {
  console.error(e);
  process.exit(1);
});
