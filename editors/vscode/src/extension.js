// The MSL extension's client: starts `mslc lsp` (stdio) as the language server for .msl files.
// Plain JavaScript so the extension needs no build step; `vscode` is provided by the editor.
'use strict';
const vscode = require('vscode');
const { LanguageClient, TransportKind } = require('vscode-languageclient/node');

let client;

function serverOptions() {
  const config = vscode.workspace.getConfiguration('msl');
  const command = config.get('server.path') || 'mslc';
  const args = ['lsp', ...(config.get('server.extraArgs') || [])];
  return { command, args, transport: TransportKind.stdio };
}

async function start(context) {
  const clientOptions = {
    documentSelector: [
      { scheme: 'file', language: 'msl' },
      { scheme: 'untitled', language: 'msl' },
    ],
    synchronize: {
      fileEvents: vscode.workspace.createFileSystemWatcher('**/*.msl'),
    },
  };
  client = new LanguageClient('msl', 'MSL language server (mslc lsp)', serverOptions(), clientOptions);
  try {
    await client.start();
  } catch (err) {
    const path = vscode.workspace.getConfiguration('msl').get('server.path') || 'mslc';
    vscode.window.showWarningMessage(
      `MSL: could not start the language server \`${path} lsp\` (${err && err.message ? err.message : err}). ` +
        'Syntax highlighting still works; set "msl.server.path" to an mslc binary.'
    );
  }
}

async function stop() {
  if (client) {
    const c = client;
    client = undefined;
    try {
      await c.stop();
    } catch (_) {
      // The server may never have started.
    }
  }
}

async function activate(context) {
  context.subscriptions.push(
    vscode.commands.registerCommand('msl.restartServer', async () => {
      await stop();
      await start(context);
    }),
    vscode.workspace.onDidChangeConfiguration(async (e) => {
      if (e.affectsConfiguration('msl.server')) {
        await stop();
        await start(context);
      }
    })
  );
  await start(context);
}

function deactivate() {
  return stop();
}

module.exports = { activate, deactivate };
