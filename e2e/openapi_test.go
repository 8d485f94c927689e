package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pb33f/libopenapi"
	validator "github.com/pb33f/libopenapi-validator"
	"github.com/pb33f/libopenapi-validator/config"
	"github.com/pb33f/libopenapi-validator/helpers"
	"github.com/pb33f/libopenapi-validator/paths"
	"github.com/pb33f/libopenapi-validator/schema_validation"
	"github.com/pb33f/libopenapi/datamodel/high/base"
	v3 "github.com/pb33f/libopenapi/datamodel/high/v3"

	"github.com/runbox-dev/runbox/internal/api/apiclient"
)

// contract checks every request a client sends and every answer it gets
// against the OpenAPI document the server serves, with a validator that
// did not generate it (pb33f/libopenapi-validator), and notes the
// operations driven.
type contract struct {
	t           *testing.T
	strict, lax validator.Validator
	model       *v3.Document
	schema      func(name string) *base.Schema

	mu     sync.Mutex
	driven map[string]bool // by operationId
}

func (s *service) contract(t *testing.T) *contract {
	t.Helper()
	res, err := http.Get(s.url + "/openapi.json")
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	raw, _ := io.ReadAll(res.Body)
	doc, err := libopenapi.NewDocument(raw)
	if err != nil {
		t.Fatal(err)
	}
	model, errs := doc.BuildV3Model()
	if errs != nil {
		t.Fatal(errs)
	}
	// Strict: a property the document does not declare is an error too,
	// but for maps, whose keys strict mode takes for undeclared properties.
	strict, verrs := validator.NewValidator(doc, config.WithStrictMode())
	if len(verrs) > 0 {
		t.Fatal(verrs)
	}
	lax, verrs := validator.NewValidator(doc)
	if len(verrs) > 0 {
		t.Fatal(verrs)
	}
	return &contract{t: t, strict: strict, lax: lax, model: &model.Model, driven: map[string]bool{},
		schema: func(name string) *base.Schema { return model.Model.Components.Schemas.GetOrZero(name).Schema() }}
}

// unchecked marks a request that breaks the contract on purpose (no
// token): its answer is checked, not the request.
type unchecked struct{}

// Do sends a request of the generated client and checks both sides.
func (c *contract) Do(req *http.Request) (*http.Response, error) {
	var body []byte
	if req.Body != nil {
		body, _ = io.ReadAll(req.Body)
		req.Body = io.NopCloser(bytes.NewReader(body))
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	sent := req.Clone(context.WithoutCancel(req.Context()))
	sent.Body = io.NopCloser(bytes.NewReader(body))
	got := *res
	if strings.HasPrefix(res.Header.Get("Content-Type"), "text/event-stream") {
		got.Body = http.NoBody // the caller reads the stream and checks its events
	} else {
		b, _ := io.ReadAll(res.Body)
		res.Body.Close()
		res.Body, got.Body = io.NopCloser(bytes.NewReader(b)), io.NopCloser(bytes.NewReader(b))
	}
	op := c.operation(req)
	v := c.strict
	if slices.Contains(mapAnswers, op) {
		v = c.lax
	}
	if sent.Context().Value(unchecked{}) == nil {
		if ok, errs := v.ValidateHttpRequest(sent); !ok {
			for _, e := range errs {
				c.t.Errorf("%s %s: the request breaks the document: %s (%s)", req.Method, req.URL.Path, e.Message, e.Reason)
			}
		}
		sent.Body = io.NopCloser(bytes.NewReader(body))
	}
	if ok, errs := v.ValidateHttpResponse(sent, &got); !ok {
		for _, e := range errs {
			c.t.Errorf("%s %s → %d: the answer breaks the document: %s (%s)", req.Method, req.URL.Path, res.StatusCode, e.Message, e.Reason)
			for _, se := range e.SchemaValidationErrors {
				c.t.Errorf("  %s at %s", se.Reason, se.FieldPath)
			}
		}
	}
	c.mu.Lock()
	c.driven[op] = true
	c.mu.Unlock()
	return res, nil
}

// mapAnswers are the operations whose answers are maps.
var mapAnswers = []string{"ready", "openAPI"}

// operation is the operationId of the document's operation a request
// calls ("" if none).
func (c *contract) operation(req *http.Request) string {
	item, errs, _ := paths.FindPath(req, c.model, nil)
	if len(errs) > 0 {
		return ""
	}
	if op := helpers.ExtractOperation(req, item); op != nil {
		return op.OperationId
	}
	return ""
}

// events reads a run's event stream to its done event, checking each
// event against the document's Event schema.
func (c *contract) events(res *http.Response, err error) []apiclient.Event {
	c.t.Helper()
	if err != nil || res.StatusCode != http.StatusOK {
		c.t.Fatalf("events: %v %v", res, err)
	}
	defer res.Body.Close()
	var evs []apiclient.Event
	sv := schema_validation.NewSchemaValidator()
	sc := bufio.NewScanner(res.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		data, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok {
			continue
		}
		if ok, errs := sv.ValidateSchemaString(c.schema("Event"), data); !ok {
			c.t.Errorf("event %s breaks the document: %v", data, errs[0].Reason)
		}
		var ev apiclient.Event
		if err := json.Unmarshal([]byte(data), &ev); err != nil {
			c.t.Fatal(err)
		}
		if evs = append(evs, ev); ev.Type == "done" {
			return evs
		}
	}
	c.t.Fatalf("the stream ended before done, after %d events", len(evs))
	return nil
}

// TestOpenAPIClient drives the REST API through the client generated from
// the OpenAPI document (internal/api/apiclient), against the real api and
// executor, checking every request and answer against the document the
// server serves; each operation of the document must be driven here, so
// that a route that is added or changes without its document, client and
// a test fails the build.
func TestOpenAPIClient(t *testing.T) {
	// Webhooks go to a receiver on loopback, so that deliveries are
	// driven with attempts to check.
	rcv := newHookReceiver(t, 0)
	s := start(t, options{env: webhookEnv(rcv)})
	c := s.contract(t)
	withToken := func(_ context.Context, req *http.Request) error {
		if req.Context().Value(unchecked{}) == nil {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		return nil
	}
	client, err := apiclient.NewClientWithResponses(s.url, apiclient.WithHTTPClient(c), apiclient.WithRequestEditorFn(withToken))
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()

	t.Run("runs", func(t *testing.T) { openAPIRuns(ctx, t, c, client) })
	t.Run("run control", func(t *testing.T) { openAPIRunControl(ctx, t, c, client) })
	t.Run("files", func(t *testing.T) { openAPIFiles(ctx, t, client) })
	t.Run("service", func(t *testing.T) { openAPIService(ctx, t, client) })
	t.Run("batches and deliveries", func(t *testing.T) { openAPIBatches(ctx, t, client, rcv) })

	for _, item := range c.model.Paths.PathItems.FromOldest() {
		for _, op := range item.GetOperations().FromOldest() {
			if !c.driven[op.OperationId] {
				t.Errorf("operation %s is not driven by TestOpenAPIClient: add it there", op.OperationId)
			}
		}
	}
}

func openAPIRuns(ctx context.Context, t *testing.T, c *contract, client *apiclient.ClientWithResponses) {
	cid := "openapi-runs"
	wait := true
	res, err := client.CreateRunWithResponse(ctx, &apiclient.CreateRunParams{Wait: &wait},
		apiclient.RunsStartRequest{Language: "python", Code: "print(2+2)", ConversationId: &cid})
	if err != nil || res.JSON200 == nil {
		t.Fatalf("run and wait: %v %s", err, body(res))
	}
	if r, err := res.JSON200.AsResult(); err != nil || r.Stdout != "4\n" || !r.Success || r.ConversationId != cid {
		t.Errorf("result %+v %v", r, err)
	}

	// Queued, followed by its event stream, replayed from Last-Event-ID.
	acc, err := client.CreateRunWithResponse(ctx, nil, apiclient.RunsStartRequest{Language: "bash",
		Code: "for i in 1 2 3; do echo line$i; sleep 0.2; done", ConversationId: &cid})
	if err != nil || acc.JSON202 == nil || acc.JSON202.Status != "queued" || acc.JSON202.EventsUrl == "" {
		t.Fatalf("start: %v %s", err, body(acc))
	}
	id := acc.JSON202.RunId
	all := c.events(client.StreamRunEvents(ctx, id, nil))
	if all[0].Type != "queued" || all[len(all)-1].Result == nil || all[len(all)-1].Result.Stdout != "line1\nline2\nline3\n" {
		t.Errorf("events %+v", all)
	}
	three := "3"
	if rest := c.events(client.StreamRunEvents(ctx, id, &apiclient.StreamRunEventsParams{LastEventID: &three})); len(rest) != len(all)-3 {
		t.Errorf("replay after 3: %d events, want %d", len(rest), len(all)-3)
	}
	run, err := client.GetRunWithResponse(ctx, id)
	if err != nil || run.JSON200 == nil || run.JSON200.Status != "succeeded" || run.JSON200.Result == nil {
		t.Errorf("get: %v %s", err, body(run))
	}
	list, err := client.ListRunsWithResponse(ctx, &apiclient.ListRunsParams{ConversationId: &cid})
	if err != nil || list.JSON200 == nil || list.JSON200.Runs == nil ||
		!slices.ContainsFunc(*list.JSON200.Runs, func(r apiclient.Run) bool { return r.RunId == id }) {
		t.Errorf("list: %v %s", err, body(list))
	}
}

// openAPIRunControl drives a run's input, a background run and its
// cancel, and errors.
func openAPIRunControl(ctx context.Context, t *testing.T, c *contract, client *apiclient.ClientWithResponses) {
	cid := "openapi-runs"
	wait := true
	interactive := true
	acc, err := client.CreateRunWithResponse(ctx, nil, apiclient.RunsStartRequest{Language: "python", Interactive: &interactive,
		Code: "print('hello', input())", ConversationId: &cid})
	if err != nil || acc.JSON202 == nil {
		t.Fatalf("start interactive: %v %s", err, body(acc))
	}
	data, eof := "alice\n", true
	if in, err := client.SendStdinWithResponse(ctx, acc.JSON202.RunId, apiclient.StdinBody{Data: &data, Eof: &eof}); err != nil ||
		in.JSON200 == nil || !in.JSON200.Ok {
		t.Errorf("stdin: %v %s", err, body(in))
	}
	evs := c.events(client.StreamRunEvents(ctx, acc.JSON202.RunId, nil))
	if r := evs[len(evs)-1].Result; r == nil || r.Stdout != "hello alice\n" {
		t.Errorf("interactive result %+v", r)
	}

	// A server in the background: wait answers with its Run once it has
	// started; cancel ends it.
	background := true
	res, err := client.CreateRunWithResponse(ctx, &apiclient.CreateRunParams{Wait: &wait}, apiclient.RunsStartRequest{Language: "bash",
		Background: &background, Code: "echo up; sleep 300", ConversationId: &cid})
	if err != nil || res.JSON200 == nil {
		t.Fatalf("background: %v %s", err, body(res))
	}
	bg, err := res.JSON200.AsRun()
	if err != nil || bg.Status != "running" {
		t.Fatalf("background run %+v %v", bg, err)
	}
	if cancelled, err := client.CancelRunWithResponse(ctx, bg.RunId); err != nil || cancelled.JSON200 == nil || cancelled.JSON200.RunId != bg.RunId {
		t.Errorf("cancel: %v %s", err, body(cancelled))
	}
	evs = c.events(client.StreamRunEvents(ctx, bg.RunId, nil))
	if r := evs[len(evs)-1].Result; r == nil || r.Cancelled == nil || !*r.Cancelled {
		t.Errorf("cancelled run ended %+v", r)
	}

	// Errors are answers of the document too.
	if nope, err := client.GetRunWithResponse(ctx, "run_nope"); err != nil || nope.JSON404 == nil || nope.JSON404.Error != "not_found" {
		t.Errorf("unknown run: %v %s", err, body(nope))
	}
	if bad, err := client.CreateRunWithResponse(ctx, nil, apiclient.RunsStartRequest{Language: "cobol", Code: "x"}); err != nil ||
		bad.JSON400 == nil || bad.JSON400.Error != "unknown_language" {
		t.Errorf("unknown language: %v %s", err, body(bad))
	}
	if anon, err := client.ListRunnersWithResponse(context.WithValue(ctx, unchecked{}, true)); err != nil || anon.JSON401 == nil {
		t.Errorf("no token: %v %s", err, body(anon))
	}
	runners, err := client.ListRunnersWithResponse(ctx)
	if err != nil || runners.JSON200 == nil || runners.JSON200.Languages == nil || len(*runners.JSON200.Languages) < len(allLanguages) {
		t.Errorf("runners: %v %s", err, body(runners))
	}
}

func openAPIFiles(ctx context.Context, t *testing.T, client *apiclient.ClientWithResponses) {
	cid := "openapi-files"
	up, err := client.UploadFileWithBodyWithResponse(ctx, cid, "notes.txt", nil, "application/octet-stream", strings.NewReader("first"))
	if err != nil || up.JSON201 == nil || up.JSON201.Name != "notes.txt" || up.JSON201.SizeBytes != 5 {
		t.Fatalf("upload: %v %s", err, body(up))
	}
	if again, err := client.UploadFileWithBodyWithResponse(ctx, cid, "notes.txt", nil, "application/octet-stream", strings.NewReader("x")); err != nil ||
		again.JSON409 == nil || again.JSON409.Error != "file_exists" {
		t.Errorf("upload again: %v %s", err, body(again))
	}
	overwrite := true
	if _, err := client.UploadFileWithBodyWithResponse(ctx, cid, "notes.txt", &apiclient.UploadFileParams{Overwrite: &overwrite},
		"application/octet-stream", strings.NewReader("second")); err != nil {
		t.Fatal(err)
	}
	wait := true
	if res, err := client.CreateRunWithResponse(ctx, &apiclient.CreateRunParams{Wait: &wait}, apiclient.RunsStartRequest{Language: "bash",
		Code: "mkdir -p /data/sub && cat /data/notes.txt > /data/sub/copy.txt", ConversationId: &cid}); err != nil || res.JSON200 == nil {
		t.Fatalf("run: %v %s", err, body(res))
	}
	list, err := client.ListFilesWithResponse(ctx, cid)
	if err != nil || list.JSON200 == nil || list.JSON200.Files == nil {
		t.Fatalf("list: %v %s", err, body(list))
	}
	var link string
	for _, f := range *list.JSON200.Files {
		if f.Name == "sub/copy.txt" {
			link = f.Url
		}
	}
	if file, err := client.GetFileWithResponse(ctx, cid, "sub/copy.txt"); err != nil || string(file.Body) != "second" {
		t.Errorf("get file: %v %s", err, body(file))
	}
	if none, err := client.GetFileWithResponse(ctx, cid, "missing.txt"); err != nil || none.JSON404 == nil {
		t.Errorf("missing file: %v %s", err, body(none))
	}

	openAPIDownload(ctx, t, client, link)

	two := 2
	if forked, err := client.ForkConversationWithResponse(ctx, cid, apiclient.ForkBody{Count: &two}); err != nil ||
		forked.JSON201 == nil || forked.JSON201.Conversations == nil || len(*forked.JSON201.Conversations) != 2 {
		t.Errorf("fork: %v %s", err, body(forked))
	}
	if taken, err := client.ForkConversationWithResponse(ctx, cid, apiclient.ForkBody{NewConversationId: &cid}); err != nil ||
		taken.JSON409 == nil || taken.JSON409.Error != "conversation_exists" {
		t.Errorf("fork onto itself: %v %s", err, body(taken))
	}
	if none, err := client.ForkConversationWithResponse(ctx, "openapi-never", apiclient.ForkBody{}); err != nil || none.JSON404 == nil {
		t.Errorf("fork of nothing: %v %s", err, body(none))
	}

	// The conversation holds no kept interpreter: nothing to pause, and
	// nothing to bring back.
	if paused, err := client.PauseConversationWithResponse(ctx, cid); err != nil ||
		paused.JSON200 == nil || paused.JSON200.Paused {
		t.Errorf("pause: %v %s", err, body(paused))
	}
	if resumed, err := client.ResumeConversationWithResponse(ctx, cid); err != nil ||
		resumed.JSON200 == nil || resumed.JSON200.StateRestored {
		t.Errorf("resume: %v %s", err, body(resumed))
	}

	port := 8001 // nothing listens there
	if pv, err := client.CreatePreviewWithResponse(ctx, cid, apiclient.PreviewBody{Port: port}); err != nil ||
		pv.JSON409 == nil || pv.JSON409.Error != "not_listening" {
		t.Errorf("preview: %v %s", err, body(pv))
	}
	if closed, err := client.CloseConversationWithResponse(ctx, cid); err != nil || closed.JSON200 == nil || closed.JSON200.Status != "closed" {
		t.Errorf("close: %v %s", err, body(closed))
	}
	if again, err := client.CloseConversationWithResponse(ctx, cid); err != nil || again.JSON404 == nil {
		t.Errorf("close again: %v %s", err, body(again))
	}
}

// openAPIDownload downloads a file by a listing's signed URL, taken apart
// into the operation's parameters.
func openAPIDownload(ctx context.Context, t *testing.T, client *apiclient.ClientWithResponses, link string) {
	u, err := url.Parse(link)
	if err != nil || !strings.HasPrefix(u.Path, "/files/") {
		t.Fatalf("download URL %q", link)
	}
	signed := &apiclient.DownloadFileParams{Exp: u.Query().Get("exp"), Sig: u.Query().Get("sig")}
	path := strings.TrimPrefix(u.Path, "/files/")
	if dl, err := client.DownloadFileWithResponse(ctx, path, signed); err != nil || string(dl.Body) != "second" {
		t.Errorf("download: %v %s", err, body(dl))
	}
	if head, err := client.HeadFileWithResponse(ctx, path, (*apiclient.HeadFileParams)(signed)); err != nil || head.StatusCode() != http.StatusOK {
		t.Errorf("head: %v %s", err, body(head))
	}
	forged := &apiclient.DownloadFileParams{Exp: signed.Exp, Sig: strings.Repeat("0", len(signed.Sig))}
	if dl, err := client.DownloadFileWithResponse(ctx, path, forged); err != nil || dl.JSON403 == nil {
		t.Errorf("forged download: %v %s", err, body(dl))
	}
}

func openAPIService(ctx context.Context, t *testing.T, client *apiclient.ClientWithResponses) {
	if h, err := client.HealthWithResponse(ctx); err != nil || h.JSON200 == nil || h.JSON200.Status != "ok" {
		t.Errorf("health: %v %s", err, body(h))
	}
	if r, err := client.ReadyWithResponse(ctx); err != nil || r.JSON200 == nil || (*r.JSON200)["redis"] != "ok" {
		t.Errorf("ready: %v %s", err, body(r))
	}
	if m, err := client.MetricsWithResponse(ctx); err != nil || !strings.Contains(string(m.Body), "runbox_http_requests_total") {
		t.Errorf("metrics: %v %s", err, body(m))
	}
	if p, err := client.PlaygroundWithResponse(ctx); err != nil || !strings.Contains(string(p.Body), `href="reference"`) {
		t.Errorf("the playground does not link the reference: %v %s", err, body(p))
	}
	doc, err := client.OpenAPIWithResponse(ctx)
	if err != nil || doc.JSON200 == nil || (*doc.JSON200)["openapi"] != "3.1.0" {
		t.Errorf("openapi.json: %v %s", err, body(doc))
	}
	if ref, err := client.ReferenceWithResponse(ctx); err != nil || !strings.Contains(string(ref.Body), `id="op-createRun"`) {
		t.Errorf("reference: %v %s", err, body(ref))
	}
}

// openAPIBatches drives a batch (submitted, paged, cancelled, refused)
// and the deliveries of its webhook and of a run's.
func openAPIBatches(ctx context.Context, t *testing.T, client *apiclient.ClientWithResponses, rcv *hookReceiver) {
	echo := func(i int) apiclient.RunsStartRequest {
		return apiclient.RunsStartRequest{Language: "bash", Code: fmt.Sprintf("echo %d", i)}
	}
	runs := []apiclient.RunsStartRequest{echo(0), echo(1)}
	callback := "http://recv.test:" + rcv.port() + "/openapi"
	created, err := client.CreateBatchWithResponse(ctx, nil, apiclient.RunsBatchRequest{Runs: &runs, CallbackUrl: &callback})
	if err != nil || created.JSON201 == nil || created.JSON201.RunIds == nil || len(*created.JSON201.RunIds) != 2 {
		t.Fatalf("create batch: %v %s", err, body(created))
	}
	id, ids := created.JSON201.BatchId, *created.JSON201.RunIds
	limit := 1
	var page *apiclient.RunsBatchPage
	waitFor(t, func() bool {
		res, err := client.GetBatchWithResponse(ctx, id, &apiclient.GetBatchParams{Limit: &limit})
		if err != nil || res.JSON200 == nil {
			t.Fatalf("get batch: %v %s", err, body(res))
		}
		page = res.JSON200
		return page.Succeeded == 2
	})
	if page.NextCursor == nil || page.Runs == nil || len(*page.Runs) != 1 || (*page.Runs)[0].RunId != ids[0] {
		t.Errorf("first page %+v", page)
	}
	// Cancelling an ended batch changes nothing; it answers as GET.
	cancelled, err := client.CancelBatchWithResponse(ctx, id, &apiclient.CancelBatchParams{Cursor: page.NextCursor})
	if err != nil || cancelled.JSON200 == nil || cancelled.JSON200.Succeeded != 2 || cancelled.JSON200.Runs == nil ||
		(*cancelled.JSON200.Runs)[0].RunId != ids[1] {
		t.Errorf("cancel batch: %v %s", err, body(cancelled))
	}
	bad := []apiclient.RunsStartRequest{echo(0), {Language: "cobol", Code: "x"}}
	if refused, err := client.CreateBatchWithResponse(ctx, nil, apiclient.RunsBatchRequest{Runs: &bad}); err != nil ||
		refused.JSON400 == nil || !strings.HasPrefix(refused.JSON400.Message, "runs[1]: ") {
		t.Errorf("a batch with a bad run: %v %s", err, body(refused))
	}
	if none, err := client.GetBatchWithResponse(ctx, "batch_000000000000000000000000", nil); err != nil || none.JSON404 == nil {
		t.Errorf("no batch: %v %s", err, body(none))
	}

	// The batch's webhook, its attempt, and a delivery asked for again.
	rcv.accepted(t, "msg_"+id+"_completed", time.Minute)
	waitFor(t, func() bool {
		ds, err := client.ListBatchDeliveriesWithResponse(ctx, id)
		if err != nil || ds.JSON200 == nil {
			t.Fatalf("batch deliveries: %v %s", err, body(ds))
		}
		return len(*ds.JSON200) == 1 && (*ds.JSON200)[0].StatusCode != nil && *(*ds.JSON200)[0].StatusCode == http.StatusOK
	})
	if re, err := client.RedeliverBatchWithResponse(ctx, id); err != nil || re.JSON202 == nil || re.JSON202.WebhookId != "msg_"+id+"_completed" {
		t.Errorf("redeliver batch: %v %s", err, body(re))
	}
	// Its runs asked for none of their own.
	if ds, err := client.ListRunDeliveriesWithResponse(ctx, ids[0]); err != nil || ds.JSON200 == nil || len(*ds.JSON200) != 0 {
		t.Errorf("run deliveries: %v %s", err, body(ds))
	}
	if re, err := client.RedeliverRunWithResponse(ctx, ids[0]); err != nil || re.JSON404 == nil {
		t.Errorf("redeliver a run without webhooks: %v %s", err, body(re))
	}
}

// body is what an answer of the generated client said, for a failure's
// message.
func body(res any) string {
	v := reflect.ValueOf(res)
	if v.Kind() != reflect.Pointer || v.IsNil() {
		return "no answer"
	}
	status := 0
	if hr, _ := v.Elem().FieldByName("HTTPResponse").Interface().(*http.Response); hr != nil {
		status = hr.StatusCode
	}
	return fmt.Sprintf("%d %s", status, v.Elem().FieldByName("Body").Bytes())
}
