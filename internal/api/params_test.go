package api

import (
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/labstack/echo/v4"

	"github.com/runbox-dev/runbox"
)

func TestBind(t *testing.T) {
	e := echo.New()
	ctx := func(target string, header http.Header, names, values []string) echo.Context {
		req := httptest.NewRequest(http.MethodGet, target, nil)
		for k, v := range header {
			req.Header[k] = v
		}
		c := e.NewContext(req, httptest.NewRecorder())
		c.SetParamNames(names...)
		c.SetParamValues(values...)
		return c
	}
	t.Run("path, query and header, in embedded structs too", func(t *testing.T) {
		var p eventsParams
		c := ctx("/?after=4", http.Header{"Last-Event-Id": {"7"}}, []string{"id"}, []string{"run_1"})
		if err := bind(c, &p); err != nil || p.ID != "run_1" || p.After != "4" || p.LastEventID != "7" {
			t.Errorf("%+v %v", p, err)
		}
		var u uploadParams
		c = ctx("/?overwrite=true", nil, []string{"cid", "name"}, []string{"c1", "a.txt"})
		if err := bind(c, &u); err != nil || u.CID != "c1" || u.Name != "a.txt" || !u.Overwrite {
			t.Errorf("%+v %v", u, err)
		}
	})
	t.Run("absent parameters leave their fields alone", func(t *testing.T) {
		p := createRunParams{IdempotencyKey: "k"}
		if err := bind(ctx("/", nil, nil, nil), &p); err != nil || p.Wait || p.IdempotencyKey != "k" {
			t.Errorf("%+v %v", p, err)
		}
	})
	t.Run("a bool that is not one is invalid", func(t *testing.T) {
		var p createRunParams
		err := bind(ctx("/?wait=yes", nil, nil, nil), &p)
		if runbox.ErrorCode(err) != runbox.EInvalid || runbox.ErrorMessage(err) != "wait must be true or false" {
			t.Errorf("%v", err)
		}
	})
}
