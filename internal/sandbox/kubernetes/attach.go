package kubernetes

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/url"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/httpstream"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/remotecommand"
)

// AwaitEnv is set in every sandbox's environment: it has the agent wait
// for a byte of input (awaitByte) before it says hello. The executor
// attaches to a container that already runs, and what the agent wrote
// before that went to the container's log, not to the stream; so the
// executor attaches first, then sends the byte.
const AwaitEnv = "RUNBOX_AWAIT_INPUT"

// DataSumEnv has the agent end each run's exit with a fingerprint of
// /data (agent.Config.DataSum): the engine copies /data out after a run
// only when it changed (filesync.go).
const DataSumEnv = "RUNBOX_DATA_SUM"

// awaitByte is the byte Start sends once attached.
const awaitByte = '\n'

// Stream is an attached sandbox's stdin (Write) and stdout (Read), over
// the API server and the kubelet. Reads end with the stream: when the
// container's stdout ends, the pod goes, or Close.
type Stream struct {
	out    *io.PipeReader
	in     *io.PipeWriter
	cancel context.CancelFunc
	done   chan struct{}
	err    error
}

func (s *Stream) Read(p []byte) (int, error)  { return s.out.Read(p) }
func (s *Stream) Write(p []byte) (int, error) { return s.in.Write(p) }

// Close ends the stream (not the sandbox: its stdin stays open for the
// next attach) and waits for it to be over.
func (s *Stream) Close() error {
	s.cancel()
	s.in.Close()
	s.out.Close()
	<-s.done
	return nil
}

// Done is closed when the stream has ended; Err then says why (nil when
// the container's output ended).
func (s *Stream) Done() <-chan struct{} { return s.done }

// Err is why the stream ended, once Done is closed.
func (s *Stream) Err() error { return s.err }

// Start makes the pod of spec, waits until it runs and attaches to it,
// with stderr receiving what the agent writes there; its agent then says
// hello on the stream. On failure the pod is removed.
func (e *Engine) Start(ctx context.Context, spec Spec, stderr io.Writer) (_ *Stream, err error) {
	if err := e.Create(ctx, spec); err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			e.Remove(spec.Name)
		}
	}()
	s, err := e.Attach(ctx, spec.Name, stderr)
	if err != nil {
		return nil, err
	}
	// Written once the attach is up (the pipe hands it over then), or
	// failed with it.
	wrote := make(chan error, 1)
	go func() { _, err := s.Write([]byte{awaitByte}); wrote <- err }()
	select {
	case err = <-wrote:
	case <-ctx.Done():
		err = ctx.Err()
	}
	if err != nil {
		s.Close()
		return nil, fmt.Errorf("kubernetes: attach to pod %s: %w", spec.Name, err)
	}
	return s, nil
}

// Attach attaches to a sandbox's stdin, stdout and stderr (to stderr).
// The stream lasts until Close or the sandbox's end, whatever becomes of
// ctx.
func (e *Engine) Attach(ctx context.Context, name string, stderr io.Writer) (*Stream, error) {
	u := e.client.CoreV1().RESTClient().Post().
		Namespace(e.settings.Namespace).Resource("pods").Name(name).SubResource("attach").
		VersionedParams(&corev1.PodAttachOptions{
			Container: Container, Stdin: true, Stdout: true, Stderr: true,
		}, scheme.ParameterCodec).URL()
	exec, err := e.executor(u)
	if err != nil {
		return nil, err
	}
	inR, inW := io.Pipe()
	outR, outW := io.Pipe()
	sctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	s := &Stream{out: outR, in: inW, cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(s.done)
		err := exec.StreamWithContext(sctx, remotecommand.StreamOptions{
			Stdin: inR, Stdout: outW, Stderr: cmpWriter(stderr),
		})
		if err != nil {
			err = fmt.Errorf("kubernetes: attach to pod %s: %w", name, err)
		}
		s.err = err
		outW.CloseWithError(cmpErr(err, io.EOF))
		inR.CloseWithError(cmpErr(err, io.ErrClosedPipe))
	}()
	return s, nil
}

// executor streams to u over WebSocket, or over SPDY where the server
// offers no WebSocket (an API server before 1.30, or a proxy between).
func (e *Engine) executor(u *url.URL) (remotecommand.Executor, error) {
	ws, err := remotecommand.NewWebSocketExecutor(e.config, "GET", u.String())
	if err != nil {
		return nil, fmt.Errorf("kubernetes: websocket executor: %w", err)
	}
	spdy, err := remotecommand.NewSPDYExecutor(e.config, "POST", u)
	if err != nil {
		return nil, fmt.Errorf("kubernetes: spdy executor: %w", err)
	}
	return remotecommand.NewFallbackExecutor(ws, spdy, func(err error) bool {
		return httpstream.IsUpgradeFailure(err) || httpstream.IsHTTPSProxyError(err)
	})
}

func cmpWriter(w io.Writer) io.Writer {
	if w == nil {
		return io.Discard
	}
	return w
}

func cmpErr(err, otherwise error) error {
	if err == nil || errors.Is(err, context.Canceled) {
		return otherwise
	}
	return err
}
