// The dev server of the react and vue project templates: esbuild bundles
// ENTRY (watching /data for changes) into /tmp/build, and this serves the
// app on PORT with live reload. esbuild's messages (builds, errors) go to
// stderr, the project's build output; each request is a line on stdout,
// its console log.
import { spawn } from 'node:child_process';
import fs from 'node:fs';
import http from 'node:http';
import path from 'node:path';

const port = Number(process.env.PORT || 3000);
const root = '/data';
const out = '/tmp/build';
const entry = process.env.ENTRY;
fs.mkdirSync(out, { recursive: true });

const esbuild = spawn('esbuild', [
  entry, '--bundle', `--outfile=${out}/app.js`, '--sourcemap', '--platform=browser',
  '--loader:.js=jsx', '--jsx=automatic', '--define:process.env.NODE_ENV="development"',
  '--watch', '--log-level=info', '--color=false',
  // stdin stays open: esbuild's watch ends when it closes.
], { cwd: root, stdio: ['pipe', 'inherit', 'inherit'] });
esbuild.on('exit', (code) => {
  console.error(`esbuild exited (${code})`);
  process.exit(1);
});

// Live reload: every page holds an event stream; a new bundle reloads it.
const clients = new Set();
let timer;
fs.watch(out, () => {
  clearTimeout(timer);
  timer = setTimeout(() => {
    for (const res of clients) res.write('data: reload\n\n');
  }, 100);
});
const reload = '<script>new EventSource("/__runbox/reload").onmessage = () => location.reload();</script>';

const types = {
  '.html': 'text/html; charset=utf-8', '.js': 'text/javascript; charset=utf-8', '.css': 'text/css; charset=utf-8',
  '.map': 'application/json', '.json': 'application/json', '.svg': 'image/svg+xml', '.png': 'image/png',
  '.jpg': 'image/jpeg', '.gif': 'image/gif', '.ico': 'image/x-icon', '.txt': 'text/plain; charset=utf-8',
  '.woff2': 'font/woff2',
};

// file returns the path under base that url names, or null if it leaves
// base or names a hidden file.
function file(base, url) {
  const rel = path.normalize(decodeURIComponent(url)).replace(/^\/+/, '');
  if (rel.split('/').some((p) => p.startsWith('.'))) return null;
  const p = path.join(base, rel);
  return p.startsWith(base + '/') ? p : null;
}

function send(res, status, type, body) {
  res.writeHead(status, { 'Content-Type': type, 'Cache-Control': 'no-store' });
  res.end(body);
  return status;
}

function serve(req, res) {
  const url = new URL(req.url, 'http://preview');
  if (url.pathname === '/__runbox/reload') {
    res.writeHead(200, { 'Content-Type': 'text/event-stream', 'Cache-Control': 'no-store' });
    res.write(': connected\n\n');
    clients.add(res);
    req.on('close', () => clients.delete(res));
    return 200;
  }
  const candidates = [];
  if (/^\/app\.(js|css)(\.map)?$/.test(url.pathname)) candidates.push(file(out, url.pathname));
  if (url.pathname !== '/') candidates.push(file(path.join(root, 'public'), url.pathname), file(root, url.pathname));
  for (const p of candidates) {
    if (p && fs.existsSync(p) && fs.statSync(p).isFile()) {
      return send(res, 200, types[path.extname(p)] || 'application/octet-stream', fs.readFileSync(p));
    }
  }
  if (path.extname(url.pathname) && url.pathname !== '/index.html') return send(res, 404, types['.txt'], 'not found\n');
  // Every other route is the app's: index.html, with live reload.
  let html;
  try {
    html = fs.readFileSync(path.join(root, 'index.html'), 'utf8');
  } catch {
    return send(res, 500, types['.txt'], 'index.html is missing\n');
  }
  html = html.includes('</body>') ? html.replace('</body>', reload + '</body>') : html + reload;
  return send(res, 200, types['.html'], html);
}

http.createServer((req, res) => {
  let status;
  try {
    status = serve(req, res);
  } catch (err) {
    status = send(res, 500, types['.txt'], 'error\n');
    console.log(`error serving ${req.url}: ${err.message}`);
  }
  console.log(`${req.method} ${req.url} ${status}`);
}).listen(port, '0.0.0.0', () => console.log(`dev server listening on port ${port}`));
