package envd

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"slices"
	"sync"
	"syscall"
	"time"

	"connectrpc.com/connect"

	ppb "github.com/runbox-dev/runbox/internal/e2b/envdpb/process"
)

// Bounds of a process a client starts.
const (
	maxArgs     = 4096
	maxEnvVars  = 512
	maxArgBytes = 1 << 20 // a command, its arguments and environment together
)

var errNoProcess = errors.New("no such process")

// processes are the processes the daemon started that still run.
type processes struct {
	s      *Server
	mu     sync.Mutex
	byPID  map[uint32]*proc
	closed bool
}

func newProcesses(s *Server) *processes {
	return &processes{s: s, byPID: map[uint32]*proc{}}
}

// find returns the running process sel names, by pid or tag.
func (ps *processes) find(sel *ppb.ProcessSelector) (*proc, error) {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	switch sel.GetSelector().(type) {
	case *ppb.ProcessSelector_Pid:
		if p, ok := ps.byPID[sel.GetPid()]; ok {
			return p, nil
		}
	case *ppb.ProcessSelector_Tag:
		for _, pid := range slices.Sorted(maps.Keys(ps.byPID)) {
			if p := ps.byPID[pid]; p.tag != nil && *p.tag == sel.GetTag() {
				return p, nil
			}
		}
	}
	return nil, connect.NewError(connect.CodeNotFound, errNoProcess)
}

// list returns the running processes, by pid.
func (ps *processes) list() []*ppb.ProcessInfo {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	out := make([]*ppb.ProcessInfo, 0, len(ps.byPID))
	for _, pid := range slices.Sorted(maps.Keys(ps.byPID)) {
		p := ps.byPID[pid]
		out = append(out, &ppb.ProcessInfo{Config: p.config, Pid: pid, Tag: p.tag})
	}
	return out
}

// start starts the process req asks for, with first (if not nil)
// following it from its start.
func (ps *processes) start(req *ppb.StartRequest, first *subscriber) (*proc, error) {
	cmd, err := ps.command(req.GetProcess())
	if err != nil {
		return nil, err
	}
	p := &proc{tag: req.Tag, config: req.GetProcess(), cmd: cmd, stall: ps.s.cfg.Limits.Stall,
		subs: map[*subscriber]struct{}{}, done: make(chan struct{})}
	if first != nil {
		p.subs[first] = struct{}{}
	}
	ps.mu.Lock()
	defer ps.mu.Unlock()
	switch {
	case ps.closed:
		return nil, connect.NewError(connect.CodeUnavailable, errors.New("the daemon is stopping"))
	case len(ps.byPID) >= ps.s.cfg.Limits.Processes:
		return nil, connect.NewError(connect.CodeResourceExhausted,
			fmt.Errorf("the daemon runs %d processes, its limit; end one first", len(ps.byPID)))
	}
	var size *ppb.PTY_Size
	if req.Pty != nil {
		size = req.GetPty().GetSize()
		if size == nil {
			size = &ppb.PTY_Size{Cols: 80, Rows: 24}
		}
	}
	if err := p.start(req.GetStdin(), size); err != nil {
		return nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("start %s: %w", cmd.Path, err))
	}
	ps.byPID[p.pid] = p
	go func() {
		<-p.done
		ps.mu.Lock()
		if ps.byPID[p.pid] == p {
			delete(ps.byPID, p.pid)
		}
		ps.mu.Unlock()
	}()
	return p, nil
}

// command builds what config asks to run: its program found on the
// environment's PATH, in its working directory (the home by default),
// with the daemon's environment and the config's variables on top.
func (ps *processes) command(config *ppb.ProcessConfig) (*exec.Cmd, error) {
	s := ps.s
	name := config.GetCmd()
	size := len(name)
	for _, a := range config.GetArgs() {
		size += len(a)
	}
	for k, v := range config.GetEnvs() {
		size += len(k) + len(v)
	}
	switch {
	case name == "":
		return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("cmd is empty"))
	case len(config.GetArgs()) > maxArgs || len(config.GetEnvs()) > maxEnvVars || size > maxArgBytes:
		return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("the command, its arguments and environment are too large"))
	}
	dir, err := s.paths.resolve(config.GetCwd())
	if err != nil {
		return nil, err
	}
	if fi, err := os.Stat(dir); err != nil || !fi.IsDir() {
		return nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("the working directory %s is not a folder", dir))
	}
	env := append(slices.Clone(s.cfg.Env), "PWD="+dir)
	for k, v := range config.GetEnvs() {
		if k == "" || containsAny(k, "=\x00") || containsAny(v, "\x00") {
			return nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("invalid environment variable %q", k))
		}
		env = append(env, k+"="+v)
	}
	cmd := exec.Command(name, config.GetArgs()...)
	cmd.Dir, cmd.Env = dir, env
	if cmd.Err != nil {
		return nil, connect.NewError(connect.CodeInvalidArgument, cmd.Err)
	}
	return cmd, nil
}

func containsAny(s, chars string) bool {
	for i := range len(s) {
		for j := range len(chars) {
			if s[i] == chars[j] {
				return true
			}
		}
	}
	return false
}

// closeAll kills every process the daemon started.
func (ps *processes) closeAll() {
	ps.mu.Lock()
	ps.closed = true
	procs := slices.Collect(maps.Values(ps.byPID))
	ps.mu.Unlock()
	for _, p := range procs {
		_ = p.signal(syscall.SIGKILL)
	}
}

// processService is the process service (process.proto).
type processService struct{ s *Server }

func (ps *processService) List(context.Context, *connect.Request[ppb.ListRequest]) (*connect.Response[ppb.ListResponse], error) {
	return connect.NewResponse(&ppb.ListResponse{Processes: ps.s.procs.list()}), nil
}

// Start starts a process and streams its events: its start (its pid),
// its output, keepalives, its end. The process outlives the stream: a
// client that goes (or whose timeout passes) may connect again.
func (ps *processService) Start(ctx context.Context, req *connect.Request[ppb.StartRequest], stream *connect.ServerStream[ppb.StartResponse]) error {
	if err := ps.s.checkUser(req.Header()); err != nil {
		return err
	}
	sub := newSubscriber()
	p, err := ps.s.procs.start(req.Msg, sub)
	if err != nil {
		return err
	}
	return follow(ctx, p, sub, keepalive(req.Header()), func(ev *ppb.ProcessEvent) error {
		return stream.Send(&ppb.StartResponse{Event: ev})
	})
}

// Connect follows a running process from now on.
func (ps *processService) Connect(ctx context.Context, req *connect.Request[ppb.ConnectRequest], stream *connect.ServerStream[ppb.ConnectResponse]) error {
	p, err := ps.s.procs.find(req.Msg.GetProcess())
	if err != nil {
		return err
	}
	sub := newSubscriber()
	if !p.subscribe(sub) {
		return connect.NewError(connect.CodeNotFound, errNoProcess)
	}
	return follow(ctx, p, sub, keepalive(req.Header()), func(ev *ppb.ProcessEvent) error {
		return stream.Send(&ppb.ConnectResponse{Event: ev})
	})
}

// follow sends a subscribed client p's start, then its events until its
// end, with keepalives, until the client goes.
func follow(ctx context.Context, p *proc, sub *subscriber, every time.Duration, send func(*ppb.ProcessEvent) error) error {
	defer p.unsubscribe(sub)
	if err := send(&ppb.ProcessEvent{Event: &ppb.ProcessEvent_Start{Start: &ppb.ProcessEvent_StartEvent{Pid: p.pid}}}); err != nil {
		return err
	}
	tick := time.NewTicker(every)
	defer tick.Stop()
	for {
		select {
		case ev := <-sub.events:
			if err := send(ev); err != nil {
				return err
			}
			if _, end := ev.GetEvent().(*ppb.ProcessEvent_End); end {
				return nil
			}
		case <-tick.C:
			if err := send(&ppb.ProcessEvent{Event: &ppb.ProcessEvent_Keepalive{Keepalive: &ppb.ProcessEvent_KeepAlive{}}}); err != nil {
				return err
			}
		case <-sub.cut:
			return connect.NewError(connect.CodeResourceExhausted, errCut)
		case <-ctx.Done():
			if errors.Is(ctx.Err(), context.DeadlineExceeded) {
				return connect.NewError(connect.CodeDeadlineExceeded, errors.New("the stream's timeout passed; the process runs on"))
			}
			return nil
		}
	}
}

func (ps *processService) Update(_ context.Context, req *connect.Request[ppb.UpdateRequest]) (*connect.Response[ppb.UpdateResponse], error) {
	p, err := ps.s.procs.find(req.Msg.GetProcess())
	if err != nil {
		return nil, err
	}
	if size := req.Msg.GetPty().GetSize(); size != nil {
		if err := p.resize(size); err != nil {
			return nil, err
		}
	}
	return connect.NewResponse(&ppb.UpdateResponse{}), nil
}

// StreamInput feeds a process from a client stream: a start naming it,
// then data, in order.
func (ps *processService) StreamInput(ctx context.Context, stream *connect.ClientStream[ppb.StreamInputRequest]) (*connect.Response[ppb.StreamInputResponse], error) {
	var p *proc
	for stream.Receive() {
		switch ev := stream.Msg().GetEvent().(type) {
		case *ppb.StreamInputRequest_Start:
			var err error
			if p, err = ps.s.procs.find(ev.Start.GetProcess()); err != nil {
				return nil, err
			}
		case *ppb.StreamInputRequest_Data:
			if p == nil {
				return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("the stream names no process: send its start first"))
			}
			if err := sendInput(ctx, p, ev.Data.GetInput()); err != nil {
				return nil, err
			}
		}
	}
	if err := stream.Err(); err != nil {
		return nil, err
	}
	return connect.NewResponse(&ppb.StreamInputResponse{}), nil
}

func sendInput(ctx context.Context, p *proc, in *ppb.ProcessInput) error {
	switch in.GetInput().(type) {
	case *ppb.ProcessInput_Pty:
		return p.input(ctx, in.GetPty(), true)
	case *ppb.ProcessInput_Stdin:
		return p.input(ctx, in.GetStdin(), false)
	}
	return nil
}

func (ps *processService) SendInput(ctx context.Context, req *connect.Request[ppb.SendInputRequest]) (*connect.Response[ppb.SendInputResponse], error) {
	p, err := ps.s.procs.find(req.Msg.GetProcess())
	if err != nil {
		return nil, err
	}
	if err := sendInput(ctx, p, req.Msg.GetInput()); err != nil {
		return nil, err
	}
	return connect.NewResponse(&ppb.SendInputResponse{}), nil
}

// SendSignal sends SIGTERM or SIGKILL to a process and what it started.
func (ps *processService) SendSignal(_ context.Context, req *connect.Request[ppb.SendSignalRequest]) (*connect.Response[ppb.SendSignalResponse], error) {
	p, err := ps.s.procs.find(req.Msg.GetProcess())
	if err != nil {
		return nil, err
	}
	var sig syscall.Signal
	switch req.Msg.GetSignal() {
	case ppb.Signal_SIGNAL_SIGKILL:
		sig = syscall.SIGKILL
	case ppb.Signal_SIGNAL_SIGTERM:
		sig = syscall.SIGTERM
	default:
		return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("signal must be SIGTERM or SIGKILL"))
	}
	if err := p.signal(sig); err != nil {
		return nil, connect.NewError(connect.CodeInternal, err)
	}
	return connect.NewResponse(&ppb.SendSignalResponse{}), nil
}

func (ps *processService) CloseStdin(_ context.Context, req *connect.Request[ppb.CloseStdinRequest]) (*connect.Response[ppb.CloseStdinResponse], error) {
	p, err := ps.s.procs.find(req.Msg.GetProcess())
	if err != nil {
		return nil, err
	}
	if err := p.closeStdin(); err != nil {
		return nil, err
	}
	return connect.NewResponse(&ppb.CloseStdinResponse{}), nil
}
