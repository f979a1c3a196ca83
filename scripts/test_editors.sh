#!/bin/sh
# The editor-support tests (issue 12, item 3), as CI runs them. Needs node >= 20, npm, python3, vim.
#   sh scripts/test_editors.sh            # npm ci + all checks
#   MSL_SKIP_NPM_CI=1 sh scripts/test_editors.sh   # reuse an existing editors/vscode/node_modules
set -eu
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root/editors/vscode"
if [ -z "${MSL_SKIP_NPM_CI:-}" ] || [ ! -d node_modules ]; then
  npm ci --no-audit --no-fund
fi
npm test                                          # vscode-tmgrammar-test on test/*.msl
cd "$root"
python3 scripts/check_editor_grammars.py         # keywords + registry ops in both grammars
sh editors/vscode/scripts/package.sh             # vsce package into a temp dir
