// Package stream follows runs' events as they happen. Each event is
// appended to its run's log and published on the run's channel by one
// script (package store's), which also gives it its seq; a Watch
// subscribes, then reads the log, then follows the live messages, filling
// any gap from the log, so that it yields every event once and in order
// however late it joins or often the connection drops. One Hub, over one
// pub/sub connection, serves every watch of a process.
package stream

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/runbox-dev/runbox"
	"github.com/runbox-dev/runbox/internal/store"
	"github.com/runbox-dev/runbox/internal/store/internal/keys"
)

const (
	// pollInterval is how long a watch waits for a live event before it
	// reads the log anyway: pub/sub drops messages while reconnecting, and
	// the log is the truth.
	pollInterval = 2 * time.Second
	// liveBuffer bounds the live events a slow watch holds; past it the
	// watch reads the log instead.
	liveBuffer = 1024
	// subscribeWait bounds the wait for Redis to confirm a subscription;
	// after it the watch still works, by polling.
	subscribeWait = 5 * time.Second
)

// Log reads a run's event log: its events with seq greater than after, in
// order, the done event with the run's result (store.Runs).
type Log interface {
	Events(ctx context.Context, id string, after int64) ([]runbox.Event, error)
}

// Hub relays runs' events from Redis pub/sub to local watches, over one
// connection for the whole process.
type Hub struct {
	events Log
	log    *slog.Logger
	ps     *redis.PubSub

	mu   sync.Mutex
	subs map[string]*subscription // by channel

	stop context.CancelFunc
	done chan struct{}
}

type subscription struct {
	watches map[*Watch]struct{}
	pending int           // SUBSCRIBE commands Redis has not confirmed yet
	ready   chan struct{} // closed once pending reaches 0
}

// NewHub starts a hub on conn, whose watches read the logs from events.
// Close it to stop its connection.
func NewHub(conn *store.Conn, events Log, log *slog.Logger) *Hub {
	ctx, stop := context.WithCancel(context.Background())
	h := &Hub{
		events: events,
		log:    log,
		ps:     conn.Redis().Subscribe(ctx),
		subs:   map[string]*subscription{},
		stop:   stop,
		done:   make(chan struct{}),
	}
	go h.receive(ctx)
	return h
}

// Close stops the hub. Open watches keep working by polling the log.
func (h *Hub) Close() error {
	h.stop()
	err := h.ps.Close()
	<-h.done
	return err
}

func (h *Hub) receive(ctx context.Context) {
	defer close(h.done)
	for {
		msg, err := h.ps.Receive(ctx)
		if err != nil {
			if ctx.Err() != nil || errors.Is(err, redis.ErrClosed) {
				return
			}
			h.log.Debug("event relay: receive", "err", err)
			select {
			case <-ctx.Done():
				return
			case <-time.After(100 * time.Millisecond):
			}
			continue
		}
		switch m := msg.(type) {
		case *redis.Subscription:
			if m.Kind == "subscribe" {
				h.confirmed(ctx, m.Channel)
			}
		case *redis.Message:
			var ev runbox.Event
			if err := json.Unmarshal([]byte(m.Payload), &ev); err != nil {
				h.log.Warn("event relay: malformed event", "channel", m.Channel, "err", err)
				continue
			}
			h.mu.Lock()
			if sub := h.subs[m.Channel]; sub != nil {
				for w := range sub.watches {
					w.deliver(ev)
				}
			}
			h.mu.Unlock()
		}
	}
}

func (h *Hub) confirmed(ctx context.Context, ch string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	sub := h.subs[ch]
	if sub == nil || sub.pending == 0 {
		return // a resubscription after a reconnect
	}
	sub.pending--
	if sub.pending > 0 {
		return
	}
	close(sub.ready)
	if len(sub.watches) == 0 {
		h.unsubscribeLocked(ctx, ch)
	}
}

// unsubscribeLocked drops a channel nobody watches. Subscribe and
// unsubscribe are sent under h.mu so that Redis sees them in the order the
// map changed.
func (h *Hub) unsubscribeLocked(ctx context.Context, ch string) {
	delete(h.subs, ch)
	if err := h.ps.Unsubscribe(ctx, ch); err != nil {
		h.log.Debug("event relay: unsubscribe", "channel", ch, "err", err)
	}
}

// Watch follows the events of run id that come after seq after. The
// caller must Close it.
func (h *Hub) Watch(ctx context.Context, id string, after int64) *Watch {
	w := &Watch{hub: h, id: id, last: after, notify: make(chan struct{}, 1), poll: true}
	ch := keys.Channel(id)
	h.mu.Lock()
	sub := h.subs[ch]
	if sub == nil {
		sub = &subscription{watches: map[*Watch]struct{}{}, pending: 1, ready: make(chan struct{})}
		h.subs[ch] = sub
		if err := h.ps.Subscribe(ctx, ch); err != nil {
			h.log.Debug("event relay: subscribe", "channel", ch, "err", err)
		}
	}
	sub.watches[w] = struct{}{}
	ready := sub.ready
	h.mu.Unlock()

	// Read the log only once Redis confirmed the subscription, or an event
	// published in between would be missed until the next poll.
	t := time.NewTimer(subscribeWait)
	defer t.Stop()
	select {
	case <-ready:
	case <-ctx.Done():
	case <-t.C:
	}
	return w
}

func (h *Hub) release(w *Watch) {
	ch := keys.Channel(w.id)
	h.mu.Lock()
	defer h.mu.Unlock()
	sub := h.subs[ch]
	if sub == nil {
		return
	}
	delete(sub.watches, w)
	if len(sub.watches) == 0 && sub.pending == 0 {
		h.unsubscribeLocked(context.Background(), ch)
	}
}

// Watch yields a run's events in order, each once, until done.
type Watch struct {
	hub    *Hub
	id     string
	last   int64 // seq of the last event returned
	ended  bool
	poll   bool           // read the log before waiting
	log    []runbox.Event // read from the log, contiguous after last
	notify chan struct{}

	mu       sync.Mutex
	live     []runbox.Event // from pub/sub, in seq order
	overflow bool
	closed   bool
}

func (w *Watch) deliver(ev runbox.Event) {
	w.mu.Lock()
	if len(w.live) < liveBuffer {
		w.live = append(w.live, ev)
	} else {
		w.overflow = true
	}
	w.mu.Unlock()
	select {
	case w.notify <- struct{}{}:
	default:
	}
}

// Last returns the seq of the last event Next returned.
func (w *Watch) Last() int64 { return w.last }

// Next returns the run's next event. After the done event it returns
// io.EOF.
func (w *Watch) Next(ctx context.Context) (runbox.Event, error) {
	timer := time.NewTimer(pollInterval)
	defer timer.Stop()
	for {
		if w.ended {
			return runbox.Event{}, io.EOF
		}
		if len(w.log) > 0 {
			ev := w.log[0]
			w.log = w.log[1:]
			return w.emit(ev), nil
		}
		w.mu.Lock()
		for len(w.live) > 0 && w.live[0].Seq <= w.last {
			w.live = w.live[1:]
		}
		var next *runbox.Event
		gap := w.overflow
		if len(w.live) > 0 {
			// The done event is published without the run's result, which
			// only its record holds: the log's reader puts it back.
			if ev := w.live[0]; ev.Seq == w.last+1 && (ev.Type != runbox.EventDone || ev.Result != nil) {
				next = &w.live[0]
				w.live = w.live[1:]
			} else {
				gap = true
			}
		}
		w.overflow = false
		w.mu.Unlock()
		if next != nil {
			return w.emit(*next), nil
		}
		if gap || w.poll {
			w.poll = false
			evs, err := w.hub.events.Events(ctx, w.id, w.last)
			if err != nil {
				return runbox.Event{}, err
			}
			for i, ev := range evs {
				if ev.Seq != w.last+int64(i)+1 {
					evs = evs[:i]
					break
				}
			}
			if len(evs) > 0 {
				w.log = evs
				continue
			}
		}
		select {
		case <-w.notify:
		case <-ctx.Done():
			return runbox.Event{}, ctx.Err()
		case <-timer.C:
			w.poll = true
			timer.Reset(pollInterval)
		}
	}
}

func (w *Watch) emit(ev runbox.Event) runbox.Event {
	w.last = ev.Seq
	if ev.Type == runbox.EventDone {
		w.ended = true
	}
	return ev
}

// Close stops the watch.
func (w *Watch) Close() {
	w.mu.Lock()
	closed := w.closed
	w.closed = true
	w.mu.Unlock()
	if !closed {
		w.hub.release(w)
	}
}
