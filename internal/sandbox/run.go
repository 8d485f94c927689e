package sandbox

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/runbox-dev/runbox"
	"github.com/runbox-dev/runbox/internal/agent"
)

// ErrTerminate, as the cause of a run's context, asks its program to
// stop rather than kills it: SIGTERM to it and what it started, then,
// after runbox.TermGrace, the sandbox is killed.
var ErrTerminate = errors.New("asked to stop")

// run sends req to the agent and relays its output until the program ends.
func (sb *sandbox) run(ctx context.Context, req Request, out Output) (Outcome, error) {
	start := time.Now()
	// Set before the program starts, cleared once it is over: what the
	// program connects to the proxy listener meanwhile is this run's.
	sb.running.Store(&runTag{number: sb.conn.NextRun(), runID: req.RunID, conversation: req.ConversationID})
	defer sb.running.Store(nil)
	if err := sb.conn.Start(agent.Run{Code: req.Code, Env: req.Env, Trust: req.Trust, KeepState: req.KeepState, Filesystem: req.Filesystem}); err != nil {
		return Outcome{}, fmt.Errorf("send program: %w", err)
	}
	if req.OnStart != nil {
		req.OnStart()
	}
	// Input must never reach the sandbox's next program: the gate closes
	// when this run ends, whatever the reader is still waiting for.
	gate := &stdinGate{open: true}
	defer gate.close()
	go sb.feedStdin(req.Stdin, gate)

	k := &killer{sb: sb, ctx: ctx, keepState: req.KeepState}
	defer k.stop()
	timer := time.AfterFunc(req.Timeout, func() { k.kill(true) })
	defer timer.Stop()
	stop := context.AfterFunc(ctx, func() { k.kill(false) })
	defer stop()

	exit, recvErr := sb.relay(out)
	timer.Stop()
	oc := Outcome{Duration: time.Since(start)}
	oc.TimedOut, oc.Cancelled = k.ended()
	if exit != nil {
		oc.Kernel, oc.StateLost = exit.Kernel, exit.StateLost
		if exit.Phase == agent.PhaseCompile || exit.Phase == agent.PhaseRun {
			oc.Phase = exit.Phase // nothing else the sandbox says
		}
		if exit.Quota == agent.QuotaBytes || exit.Quota == agent.QuotaEntries {
			oc.Quota = exit.Quota
		}
	}
	switch {
	case oc.TimedOut || oc.Cancelled:
		oc.ExitCode = -1
		// An interrupted cell that ended in time leaves a sound sandbox.
		oc.interrupted = exit != nil
		oc.unclean = exit != nil && !exit.Clean
		return oc, nil
	case exit != nil:
		oc.ExitCode, oc.OOMKilled, oc.unclean = exit.ExitCode, exit.OOMKilled, !exit.Clean
		return oc, nil
	}
	return sb.agentGone(ctx, req, oc, recvErr)
}

// relay hands the program's output to out until it exits, or the agent
// fails it or goes away (the error).
func (sb *sandbox) relay(out Output) (*agent.Exit, error) {
	for {
		msg, err := sb.conn.Recv()
		switch {
		case err != nil:
			return nil, err
		case msg.Kind == agent.Stdout:
			out(Stdout, msg.Data)
		case msg.Kind == agent.Stderr:
			out(Stderr, msg.Data)
		case msg.Kind == agent.Exited:
			return &msg.Exit, nil
		case msg.Kind == agent.Failed:
			return nil, fmt.Errorf("agent could not start the program: %s", msg.Err)
		}
	}
}

// agentGone completes oc, the outcome of a run whose agent went away
// mid-run (recvErr): the container died, most likely of the memory limit
// (under gVisor the limit holds the whole sandbox, so a program past it
// always ends it), and a kept interpreter with it. Anything but an OOM
// kill is the service's error.
func (sb *sandbox) agentGone(ctx context.Context, req Request, oc Outcome, recvErr error) (Outcome, error) {
	ictx, cancel := context.WithTimeout(context.WithoutCancel(ctx), removeTimeout)
	defer cancel()
	// Its end may reach the engine after the attach stream's (under
	// gVisor the OOM killer takes the sentry, the engine learns it next).
	wctx, wcancel := context.WithTimeout(ictx, exitWait)
	_ = sb.m.engine.Wait(wctx, sb.id)
	wcancel()
	state, err := sb.m.engine.Inspect(ictx, sb.id)
	if err == nil && !state.Running {
		oc.ExitCode = -1
		oc.OOMKilled = state.OOMKilled
		oc.StateLost = req.KeepState
		if oc.OOMKilled {
			return oc, nil
		}
	}
	return oc, fmt.Errorf("sandbox ended unexpectedly: %w (agent: %s)", recvErr, sb.agentErr.String())
}

// killer stops a run's program at its timeout or its context's end, once.
// Killing the container is the one sure way to stop everything in it; the
// receive loop then ends on EOF. A cell of the kept interpreter is
// interrupted instead, so that its state survives; the agent ends it
// within its grace, or the container goes after all.
type killer struct {
	sb        *sandbox
	ctx       context.Context // the run's: its cause says how to stop
	keepState bool

	mu       sync.Mutex
	killed   bool
	timedOut bool
	backstop *time.Timer
}

func (k *killer) kill(timeout bool) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.killed {
		return
	}
	k.killed, k.timedOut = true, timeout
	sb := k.sb
	switch {
	case k.keepState && sb.conn.Kill() == nil:
		k.backstop = time.AfterFunc(interruptBackstop, func() { sb.m.kill(sb.id) })
	case !timeout && errors.Is(context.Cause(k.ctx), ErrTerminate) && sb.conn.Term() == nil:
		// Asked to stop: the program has its grace to end as it will,
		// then the container goes.
		k.backstop = time.AfterFunc(runbox.TermGrace, func() { sb.m.kill(sb.id) })
	default:
		sb.m.kill(sb.id)
	}
}

// ended reports whether the run timed out, or was cancelled.
func (k *killer) ended() (timedOut, cancelled bool) {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.timedOut, k.killed && !k.timedOut
}

// stop stops the backstop of an interrupted or terminated program: the
// run is over.
func (k *killer) stop() {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.backstop != nil {
		k.backstop.Stop()
	}
}

// exitWait bounds the wait for a container whose agent went away to be
// seen stopped.
const exitWait = 5 * time.Second

// interruptBackstop bounds how long an interrupted cell may take to end
// (the agent's 2 s grace, its sweep and the output drain) before its
// sandbox is killed.
const interruptBackstop = 10 * time.Second

// stdinGate lets a run's input through only while the run lasts.
type stdinGate struct {
	mu   sync.Mutex
	open bool
}

func (g *stdinGate) close() {
	g.mu.Lock()
	g.open = false
	g.mu.Unlock()
}

// send calls f if the run still lasts, and reports whether it did.
func (g *stdinGate) send(f func() error) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.open && f() == nil
}

// feedStdin copies the program's input to the agent, then closes it.
func (sb *sandbox) feedStdin(r io.Reader, gate *stdinGate) {
	if r != nil {
		buf := make([]byte, 32<<10)
		for {
			n, err := r.Read(buf)
			if n > 0 && !gate.send(func() error { return sb.conn.Stdin(buf[:n]) }) {
				return
			}
			if err != nil {
				break
			}
		}
	}
	gate.send(sb.conn.CloseStdin)
}
