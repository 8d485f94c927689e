package api

import (
	"strconv"

	"github.com/labstack/echo/v4"
	"github.com/prometheus/client_golang/prometheus"
)

// requestCounter counts requests by route and status.
func requestCounter(reg prometheus.Registerer) echo.MiddlewareFunc {
	requests := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "runbox_http_requests_total", Help: "HTTP requests, by route and status.",
	}, []string{"route", "code"})
	reg.MustRegister(requests)
	return func(next echo.HandlerFunc) echo.HandlerFunc {
		return func(c echo.Context) error {
			err := next(c)
			if err != nil {
				c.Error(err)
			}
			requests.WithLabelValues(c.Path(), strconv.Itoa(c.Response().Status)).Inc()
			return nil
		}
	}
}
