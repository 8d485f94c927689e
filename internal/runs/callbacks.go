package runs

import (
	"context"
	"time"

	"github.com/runbox-dev/runbox"
)

// callbackWait bounds the checks of a batch's callbacks together: they
// resolve the hosts the callbacks name, which a client's DNS may leave
// unanswered.
const callbackWait = 5 * time.Second

type bodyKey struct{}

// WithBody returns ctx carrying release, which gives back what a
// request's body holds of the api's budget of bodies in memory
// (MCP_HTTP_BODY_BUDGET). A batch calls it once it has been decoded and
// checked, before it waits on the network: the time a client's DNS takes
// to answer is not the body budget's.
func WithBody(ctx context.Context, release func()) context.Context {
	return context.WithValue(ctx, bodyKey{}, release)
}

// ReleaseBody gives back the body's share of the budget (WithBody), if
// ctx carries one.
func ReleaseBody(ctx context.Context) {
	if release, ok := ctx.Value(bodyKey{}).(func()); ok {
		release()
	}
}

// batchCallbacks checks where a batch's webhooks go — each run's
// callback_url, and the batch's own or the client's default — and sets
// them in nb; it returns how many webhooks they may write. The checks
// resolve hosts, so they come after every other check of the batch, its
// body given back to the api's budget, and take callbackWait at most
// together, however many hosts the runs name (the webhooks' side resolves
// each once, a few at a time, and bounds how many).
func (s *Service) batchCallbacks(ctx context.Context, nb *runbox.NewBatch, own string) (int, error) {
	ReleaseBody(ctx)
	ctx, cancel := context.WithTimeout(ctx, callbackWait)
	defer cancel()
	urls, at := callbackURLs(nb, own)
	var cbs []runbox.Callback
	var errs []error
	if len(urls) > 0 {
		if s.Callbacks == nil {
			return 0, runbox.Errorf(runbox.EUnavailable, "callback_url: webhooks are not served here")
		}
		cbs, errs = s.Callbacks.Callbacks(ctx, client(ctx), urls)
	}
	hooks := 0
	for i := range nb.Runs {
		if u := nb.Runs[i].Spec.CallbackURL; u != "" {
			if err := errs[at[u]]; err != nil {
				return 0, atIndex(i, err)
			}
			nb.Runs[i].Callback = cbs[at[u]]
			hooks += webhooksOf(nb.Runs[i].Callback)
		}
	}
	var cb runbox.Callback
	var err error
	if own != "" {
		cb, err = cbs[at[own]], errs[at[own]]
	} else {
		cb, err = s.callback(ctx, "", true) // the client's default
	}
	if err != nil {
		return 0, err
	}
	if nb.Callback = cb.URL; cb.URL != "" {
		hooks++
	}
	return hooks, nil
}

// callbackURLs are the distinct callback URLs of a batch — its runs' and
// its own — and where each is among them.
func callbackURLs(nb *runbox.NewBatch, own string) ([]string, map[string]int) {
	at := map[string]int{}
	var urls []string
	add := func(u string) {
		if _, seen := at[u]; u != "" && !seen {
			at[u] = len(urls)
			urls = append(urls, u)
		}
	}
	for _, r := range nb.Runs {
		add(r.Spec.CallbackURL)
	}
	add(own)
	return urls, at
}
