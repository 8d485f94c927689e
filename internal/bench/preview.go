package bench

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os/exec"
	"strings"
	"time"

	"golang.org/x/net/websocket"
)

// Servers that programs start, for previews: the same source runs in a
// sandbox (through a preview URL) and in a plain container (the baseline).

// PythonPageServer serves /data, where it first writes an index.html of
// about size bytes, on 8000, keeping connections alive (HTTP/1.1).
func PythonPageServer(size int) string {
	return fmt.Sprintf(`import http.server
open('index.html', 'w').write('<!doctype html><h1>python preview</h1><p>' + 'x' * %d + '</p>')
http.server.SimpleHTTPRequestHandler.protocol_version = 'HTTP/1.1'
print('serving', flush=True)
http.server.ThreadingHTTPServer(('0.0.0.0', 8000), http.server.SimpleHTTPRequestHandler).serve_forever()
`, max(size-40, 0))
}

// NodeEchoServer answers HTTP on 3000 ("hello from node <path>") and
// echoes WebSocket messages; the protocol is written out, as the sandbox
// has no npm.
const NodeEchoServer = `import http from 'node:http';
import crypto from 'node:crypto';

const srv = http.createServer((req, res) => res.end('hello from node ' + req.url));
srv.on('upgrade', (req, sock) => {
  const accept = crypto.createHash('sha1').update(req.headers['sec-websocket-key'] + '258EAFA5-E914-47DA-95CA-C5AB0DC85B11').digest('base64');
  sock.write('HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: ' + accept + '\r\n\r\n');
  sock.setNoDelay(true);
  let buf = Buffer.alloc(0);
  sock.on('data', (d) => {
    buf = Buffer.concat([buf, d]);
    for (;;) {
      if (buf.length < 2) return;
      const op = buf[0] & 0x0f;
      let len = buf[1] & 0x7f, off = 2;
      if (len === 126) { if (buf.length < 4) return; len = buf.readUInt16BE(2); off = 4; }
      else if (len === 127) { if (buf.length < 10) return; len = Number(buf.readBigUInt64BE(2)); off = 10; }
      const masked = (buf[1] & 0x80) !== 0;
      if (buf.length < off + (masked ? 4 : 0) + len) return;
      const mask = masked ? buf.subarray(off, off + 4) : null;
      if (masked) off += 4;
      const data = Buffer.from(buf.subarray(off, off + len));
      if (mask) for (let i = 0; i < len; i++) data[i] ^= mask[i % 4];
      buf = buf.subarray(off + len);
      if (op === 8) { sock.end(); return; }
      if (op !== 1 && op !== 2) continue;
      let hdr;
      if (len < 126) hdr = Buffer.from([0x80 | op, len]);
      else if (len < 65536) hdr = Buffer.from([0x80 | op, 126, len >> 8, len & 255]);
      else { hdr = Buffer.alloc(10); hdr[0] = 0x80 | op; hdr[1] = 127; hdr.writeBigUInt64BE(BigInt(len), 2); }
      sock.write(Buffer.concat([hdr, data]));
    }
  });
});
srv.listen(3000, '0.0.0.0', () => console.log('listening'));
`

// Via is an HTTP client whose every connection goes to addr (host:port),
// whatever the URL's host: a browser's for <capability>.localhost:<port>.
func Via(addr string) *http.Client {
	return &http.Client{Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "tcp", addr)
		},
		MaxIdleConnsPerHost: 4,
	}}
}

// Gets times n GETs of url with c, one after another, after warmup
// untimed ones; each must answer 200.
func Gets(ctx context.Context, c *http.Client, url string, warmup, n int) ([]time.Duration, error) {
	var times []time.Duration
	for i := range warmup + n {
		t := time.Now()
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		resp, err := c.Do(req)
		if err != nil {
			return nil, err
		}
		_, err = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if err != nil || resp.StatusCode != http.StatusOK {
			return nil, fmt.Errorf("GET %s: %d %v", url, resp.StatusCode, err)
		}
		if i >= warmup {
			times = append(times, time.Since(t))
		}
	}
	return times, nil
}

// Echoes times n round trips of a short message over one WebSocket to
// url (ws://…), its connection made to addr, after warmup untimed ones.
func Echoes(url, addr string, warmup, n int) ([]time.Duration, error) {
	cfg, err := websocket.NewConfig(url, strings.Replace(url, "ws://", "http://", 1))
	if err != nil {
		return nil, err
	}
	raw, err := net.Dial("tcp", addr)
	if err != nil {
		return nil, err
	}
	ws, err := websocket.NewClient(cfg, raw)
	if err != nil {
		raw.Close()
		return nil, err
	}
	defer ws.Close()
	_ = ws.SetDeadline(time.Now().Add(5 * time.Minute))
	msg := strings.Repeat("m", 32)
	var times []time.Duration
	for i := range warmup + n {
		t := time.Now()
		if err := websocket.Message.Send(ws, msg); err != nil {
			return nil, err
		}
		var got string
		if err := websocket.Message.Receive(ws, &got); err != nil || got != msg {
			return nil, fmt.Errorf("websocket echo: %q %v", got, err)
		}
		if i >= warmup {
			times = append(times, time.Since(t))
		}
	}
	return times, nil
}

// Published is a container with a network, one port published on the
// host's loopback: the baseline "straight to the container".
type Published struct {
	ID   string
	Addr string // 127.0.0.1:port
}

// Publish starts image with args (after --entrypoint entrypoint), its
// port published on 127.0.0.1, and dataDir (if not empty) at /data.
func Publish(ctx context.Context, image string, port int, dataDir, entrypoint string, args ...string) (*Published, error) {
	cmd := []string{"run", "-d", "-p", fmt.Sprintf("127.0.0.1::%d", port), "--entrypoint", entrypoint, "-w", "/data"}
	if dataDir != "" {
		cmd = append(cmd, "-v", dataDir+":/data")
	}
	out, err := exec.CommandContext(ctx, "docker", append(append(cmd, image), args...)...).CombinedOutput()
	if err != nil {
		return nil, fmt.Errorf("docker run -d -p: %w: %s", err, out)
	}
	p := &Published{ID: strings.TrimSpace(string(out))}
	out, err = exec.CommandContext(ctx, "docker", "port", p.ID, fmt.Sprintf("%d/tcp", port)).Output()
	if err != nil {
		p.Remove()
		return nil, fmt.Errorf("docker port: %w", err)
	}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		if strings.HasPrefix(line, "127.0.0.1:") {
			p.Addr = line
		}
	}
	if p.Addr == "" {
		p.Remove()
		return nil, fmt.Errorf("docker port: %q", out)
	}
	return p, nil
}

// Remove removes the container.
func (p *Published) Remove() { _ = exec.Command("docker", "rm", "-f", p.ID).Run() }

// FirstOK polls url with c until it answers 200, and returns when.
func FirstOK(ctx context.Context, c *http.Client, url string) error {
	for {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		resp, err := c.Do(req)
		if err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s never answered 200: %w", url, ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
}
