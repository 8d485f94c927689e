// Runs a JavaScript program as `node main.mjs` or `node main.cjs` would:
// as an ES module when it has a static import or export, or a top-level
// await; as CommonJS otherwise (require, module.exports), which is what
// Node.js does with a .js file outside a "type": "module" package.
//
// Usage: node run-javascript.cjs SOURCE. The agent starts it before the run
// comes (-prestart), with SOURCE /dev/fd/3: Node.js's start is over when
// the program arrives there.
'use strict';
const fs = require('node:fs');
const source = fs.readFileSync(process.argv[2], 'utf8');
const esm = /^\s*(import\s*[\w{*'"]|export\s)|^((const|let|var)\s[^=\n]*=\s*)?await\s/m.test(source);
const main = '/tmp/runbox/main.' + (esm ? 'mjs' : 'cjs');
fs.mkdirSync('/tmp/runbox', { recursive: true });
fs.writeFileSync(main, source);
process.chdir('/data'); // started in /, see internal/agent/prestart.go
process.argv.splice(1, 2, main);
require('node:module').runMain();
