// A plain Node.js HTTP server. It restarts when a file changes; it must
// listen on PORT (3000), where the project's preview_url reaches it.
const http = require('node:http');

const port = Number(process.env.PORT || 3000);
http.createServer((req, res) => {
  console.log(`${req.method} ${req.url}`);
  res.writeHead(200, { 'Content-Type': 'text/html; charset=utf-8' });
  res.end('<!doctype html><title>node</title><h1>Hello from Node.js</h1>\n');
}).listen(port, '0.0.0.0', () => console.log(`listening on port ${port}`));
