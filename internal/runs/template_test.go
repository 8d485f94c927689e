package runs

import (
	"context"
	"testing"
	"time"

	"github.com/runbox-dev/runbox"
	"github.com/runbox-dev/runbox/internal/auth"
	"github.com/runbox-dev/runbox/internal/clients"
)

// TestBackground: a background run detaches, and is bounded by what its
// client's tier has left of its run-seconds — those its runs under way
// reserve taken off — not by a run's time limit.
func TestBackground(t *testing.T) {
	s, st, _ := newService(t)
	ctx := context.Background()
	st.Heartbeat(ctx, runbox.ExecutorInfo{ID: "ex", Runners: []runbox.Runner{{Language: "python"}},
		Templates: []runbox.Template{{Name: "react", Port: 3000}}}, time.Minute)
	free := func(name string) context.Context {
		return auth.WithClient(ctx, clients.Client{Name: name, Tier: clients.Tier{RunSecondsPerDay: 100, MaxTimeoutSeconds: 5}})
	}
	for _, tc := range []struct {
		name    string
		ctx     context.Context
		timeout int
		want    int
		code    string
	}{
		{"unlimited", ctx, 0, int(MaxBackground / time.Second), ""},
		{"asked for", ctx, 7200, 7200, ""},
		{"past a day", ctx, int(MaxBackground/time.Second) + 1, 0, runbox.EInvalid},
		{"the tier's run-seconds", free("a"), 0, 100, ""},
		{"less than the tier's", free("b"), 30, 30, ""},
		{"what the first left", free("b"), 0, 70, ""},
		{"none left", free("b"), 0, 0, runbox.EQuotaExceeded},
		{"more than the tier's", free("c"), 3600, 100, ""},
	} {
		run, err := s.Submit(tc.ctx, runbox.Spec{Language: "python", Code: "x", Background: true, TimeoutSeconds: tc.timeout}, "")
		if tc.code != "" {
			if runbox.ErrorCode(err) != tc.code {
				t.Errorf("%s: %v, want %s", tc.name, err, tc.code)
			}
			continue
		}
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		spec, err := st.Spec(ctx, run.ID)
		if err != nil || spec.TimeoutSeconds != tc.want || !spec.Detach || !spec.Background {
			t.Errorf("%s: spec %+v, %v; want timeout %d, detached", tc.name, spec, err, tc.want)
		}
	}
	if _, err := s.Submit(ctx, runbox.Spec{Language: "python", Code: "x", Background: true, KeepState: true}, ""); runbox.ErrorCode(err) != runbox.EInvalid {
		t.Errorf("background with keep_state: %v", err)
	}
	// A template's language is no client's to ask for.
	if _, err := s.Submit(ctx, runbox.Spec{Language: runbox.TemplateLanguage("react"), Code: "x"}, ""); runbox.ErrorCode(err) != runbox.EUnknownLanguage {
		t.Errorf("a template's language: %v", err)
	}
	run, err := s.SubmitTemplate(free("trial"), "~trial~p1", runbox.Template{Name: "react", Port: 3000}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	spec, _ := st.Spec(ctx, run.ID)
	if spec.Language != "@react" || spec.Code != TemplateStart || spec.TimeoutSeconds != 100 || !spec.Detach || !spec.Background {
		t.Errorf("a project's run: %+v", spec)
	}
	if _, err := s.SubmitTemplate(free("trial"), "~other~p1", runbox.Template{Name: "react"}, time.Hour); runbox.ErrorCode(err) != runbox.ENotFound {
		t.Errorf("a template run in another client's conversation: %v", err)
	}
}
