package api

import (
	"cmp"
	"context"
	"net/http"

	"github.com/labstack/echo/v4"

	"github.com/runbox-dev/runbox"
	"github.com/runbox-dev/runbox/internal/runs"
)

// maxBatchBody bounds POST /v1/batches: up to runbox.MaxBatchRuns runs.
const maxBatchBody = runbox.MaxBatchBytes

// tagBatches groups the batches' routes in the document.
const tagBatches = "batches"

// Webhooks is what the routes of deliveries need of internal/webhooks.
type Webhooks interface {
	Deliveries(ctx context.Context, subject string, batch bool) ([]runbox.Delivery, error)
	Redeliver(ctx context.Context, subject string, batch bool) (runbox.Webhook, error)
}

// Redelivery is the answer to POST …/deliveries: the webhook delivered
// again, and its state (pending).
type Redelivery struct {
	WebhookID string `json:"webhook_id"`
	Type      string `json:"type"`
	State     string `json:"state"`
}

// batchParams name a batch.
type batchParams struct {
	ID string `path:"id" jsonschema:"the batch's batch_id"`
}

// createBatchParams are the parameters of POST /v1/batches.
type createBatchParams struct {
	IdempotencyKey string `header:"Idempotency-Key" jsonschema:"as the body's idempotency_key, which wins when both are given"`
}

// batchPageParams are the parameters of GET and DELETE /v1/batches/{id}.
type batchPageParams struct {
	batchParams
	Cursor string `query:"cursor" jsonschema:"the next_cursor of the page before; omit for the first page"`
	Limit  int    `query:"limit" jsonschema:"runs per page: 1 to 200 (default 100)"`
}

func (s *Server) batchRoutes() []route {
	return []route{
		{method: "POST", path: "/v1/batches", id: "createBatch", tag: tagBatches, access: bearer,
			summary: "Start up to 1000 runs (each as POST /v1/runs takes it), checked as a whole and enqueued at once",
			params:  createBatchParams{}, body: runs.BatchRequest{},
			answers: []answer{{status: s201, body: runs.BatchCreated{}, description: "The batch's id and its runs', in the order given"}},
			errors:  []int{s400, s507}, handler: s.createBatch},
		{method: "GET", path: "/v1/batches/{id}", id: "getBatch", tag: tagBatches, access: bearer,
			summary: "A batch's counts by state and a page of its runs, with their results once done", params: batchPageParams{},
			answers: []answer{{status: s200, body: runs.BatchPage{}}}, errors: []int{s400, s404}, handler: s.getBatch},
		{method: "DELETE", path: "/v1/batches/{id}", id: "cancelBatch", tag: tagBatches, access: bearer,
			summary: "Cancel what has not ended of a batch; answers as GET", params: batchPageParams{},
			answers: []answer{{status: s200, body: runs.BatchPage{}}}, errors: []int{s400, s404}, handler: s.cancelBatch},
		{method: "GET", path: "/v1/batches/{id}/deliveries", id: "listBatchDeliveries", tag: tagBatches, access: bearer,
			summary: "The attempts to deliver the batch's webhook, oldest first", params: batchParams{},
			answers: []answer{{status: s200, body: []runbox.Delivery{}}}, errors: []int{s404}, handler: s.deliveries(true)},
		{method: "POST", path: "/v1/batches/{id}/deliveries", id: "redeliverBatch", tag: tagBatches, access: bearer,
			summary: "Deliver the batch's webhook again, with its webhook-id", params: batchParams{},
			answers: []answer{{status: s202, body: Redelivery{}}}, errors: []int{s404}, handler: s.redeliver(true)},
	}
}

// deliveryRoutes are a run's webhooks' routes.
func (s *Server) deliveryRoutes() []route {
	return []route{
		{method: "GET", path: "/v1/runs/{id}/deliveries", id: "listRunDeliveries", tag: tagRuns, access: bearer,
			summary: "The attempts to deliver the run's webhooks (its end's, and its start's when asked), oldest first",
			params:  runParams{}, answers: []answer{{status: s200, body: []runbox.Delivery{}}}, errors: []int{s404},
			handler: s.deliveries(false)},
		{method: "POST", path: "/v1/runs/{id}/deliveries", id: "redeliverRun", tag: tagRuns, access: bearer,
			summary: "Deliver the webhook of the run's end again, with its webhook-id", params: runParams{},
			answers: []answer{{status: s202, body: Redelivery{}}}, errors: []int{s404}, handler: s.redeliver(false)},
	}
}

func (s *Server) createBatch(c echo.Context) error {
	var p createBatchParams
	if err := bind(c, &p); err != nil {
		return err
	}
	var req runs.BatchRequest
	if err := decodeJSON(c, maxBatchBody, &req); err != nil {
		return err
	}
	req.IdempotencyKey = cmp.Or(p.IdempotencyKey, req.IdempotencyKey)
	created, err := s.opts.Runs.SubmitBatch(c.Request().Context(), req)
	if err != nil {
		return err
	}
	return c.JSON(http.StatusCreated, created)
}

func (s *Server) getBatch(c echo.Context) error {
	var p batchPageParams
	if err := bind(c, &p); err != nil {
		return err
	}
	page, err := s.opts.Runs.GetBatch(c.Request().Context(), p.ID, p.Cursor, p.Limit)
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, page)
}

func (s *Server) cancelBatch(c echo.Context) error {
	var p batchPageParams
	if err := bind(c, &p); err != nil {
		return err
	}
	ctx := c.Request().Context()
	if _, err := s.opts.Runs.CancelBatch(ctx, p.ID); err != nil {
		return err
	}
	page, err := s.opts.Runs.GetBatch(ctx, p.ID, p.Cursor, p.Limit)
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, page)
}

// deliveries answers GET /v1/runs/{id}/deliveries and
// /v1/batches/{id}/deliveries: every recorded attempt to deliver their
// webhooks, oldest first.
func (s *Server) deliveries(batch bool) echo.HandlerFunc {
	return func(c echo.Context) error {
		id, err := s.ownSubject(c, batch)
		if err != nil {
			return err
		}
		ds, err := s.opts.Webhooks.Deliveries(c.Request().Context(), id, batch)
		if err != nil {
			return err
		}
		return c.JSON(http.StatusOK, ds)
	}
}

// redeliver answers POST /v1/runs/{id}/deliveries and
// /v1/batches/{id}/deliveries: the webhook of its end, delivered again.
func (s *Server) redeliver(batch bool) echo.HandlerFunc {
	return func(c echo.Context) error {
		id, err := s.ownSubject(c, batch)
		if err != nil {
			return err
		}
		w, err := s.opts.Webhooks.Redeliver(c.Request().Context(), id, batch)
		if err != nil {
			return err
		}
		return c.JSON(http.StatusAccepted, Redelivery{WebhookID: w.ID, Type: w.Type, State: w.State})
	}
}

// ownSubject returns the route's run (or batch), once it is known to be
// the caller's.
func (s *Server) ownSubject(c echo.Context, batch bool) (string, error) {
	if s.opts.Webhooks == nil {
		return "", runbox.Errorf(runbox.EUnavailable, "webhooks are not served here")
	}
	var p batchParams // the same path parameter as a run's
	if err := bind(c, &p); err != nil {
		return "", err
	}
	var err error
	if batch {
		_, err = s.opts.Runs.Batch(c.Request().Context(), p.ID)
	} else {
		_, err = s.opts.Runs.Get(c.Request().Context(), p.ID)
	}
	return p.ID, err
}
