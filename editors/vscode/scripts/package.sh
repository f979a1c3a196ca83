#!/bin/sh
# Packages the extension with vsce into a .vsix in a temporary folder (or in $1), then checks the
# archive holds the manifest, the grammar, the client and its runtime dependency. Needs `npm ci`.
#   sh editors/vscode/scripts/package.sh [OUT_DIR]
set -eu
here=$(cd "$(dirname "$0")/.." && pwd)
out=${1:-}
if [ -z "$out" ]; then
  out=$(mktemp -d "${TMPDIR:-/tmp}/msl-vsix.XXXXXX")
  trap 'rm -rf "$out"' EXIT
fi
cd "$here"
[ -x node_modules/.bin/vsce ] || { echo "package.sh: run npm ci in editors/vscode first" >&2; exit 2; }
vsix="$out/msl-$(node -p 'require("./package.json").version').vsix"
node_modules/.bin/vsce package --skip-license --allow-missing-repository --out "$vsix"
# A .vsix is a zip; list it with node's unzip-free reader: the central directory names.
node -e '
const fs = require("fs");
const buf = fs.readFileSync(process.argv[1]);
const names = [];
for (let i = 0; i + 46 <= buf.length; i++) {
  if (buf.readUInt32LE(i) !== 0x02014b50) continue;
  const n = buf.readUInt16LE(i + 28), e = buf.readUInt16LE(i + 30), c = buf.readUInt16LE(i + 32);
  names.push(buf.toString("utf8", i + 46, i + 46 + n));
  i += 45 + n + e + c;
}
const need = ["extension/package.json", "extension/language-configuration.json",
  "extension/syntaxes/msl.tmLanguage.json", "extension/src/extension.js",
  "extension/node_modules/vscode-languageclient/package.json"];
const missing = need.filter((f) => !names.includes(f));
const stray = names.filter((f) => /^extension\/(test|scripts)\//.test(f) || /node_modules\/(@vscode\/vsce|vscode-tmgrammar-test)\//.test(f));
if (missing.length || stray.length) {
  console.error("package.sh: missing " + JSON.stringify(missing) + ", should not ship " + JSON.stringify(stray.slice(0, 5)));
  process.exit(1);
}
console.log("package.sh: ok, " + names.length + " files in " + process.argv[1]);
' "$vsix"
