// Runs after `npm install` / `npm ci` in infra/ (see package.json).
//
// The CDK CLI ships `cdk init` templates written in Go (files named like
// "%name%.template.go"). Inside infra/ they would be taken for part of the Go
// module: `go vet ./...`, `go test ./...` and `gofmt -l infra` fail on them.
// Nothing here runs `cdk init`, so every .go file under node_modules is removed.
'use strict';
const fs = require('fs');
const path = require('path');

function prune(dir) {
  let removed = 0;
  for (const entry of fs.readdirSync(dir, { withFileTypes: true })) {
    const p = path.join(dir, entry.name);
    if (entry.isDirectory()) {
      removed += prune(p);
    } else if (entry.isFile() && entry.name.endsWith('.go')) {
      fs.unlinkSync(p);
      removed++;
    }
  }
  return removed;
}

const root = path.join(__dirname, 'node_modules');
if (fs.existsSync(root)) {
  const n = prune(root);
  if (n > 0) console.log(`npm-postinstall: removed ${n} Go template file(s) from node_modules`);
}
