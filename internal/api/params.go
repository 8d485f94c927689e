package api

import (
	"fmt"
	"reflect"
	"strconv"

	"github.com/labstack/echo/v4"

	"github.com/runbox-dev/runbox"
)

// bind reads a request's parameters into p, a pointer to a struct whose
// fields (string, bool or int, in embedded structs too) are tagged path, query
// or header: the tags the OpenAPI document reads them by, so that a
// handler reads no parameter the document does not name. (Echo's binder
// reads path parameters by another tag.) A parameter that is absent
// leaves its field alone; a bool or a number that is not one is
// invalid_argument.
func bind(c echo.Context, p any) error {
	return bindStruct(c, reflect.ValueOf(p).Elem())
}

func bindStruct(c echo.Context, v reflect.Value) error {
	for i := range v.NumField() {
		f, field := v.Type().Field(i), v.Field(i)
		if f.Anonymous && f.Type.Kind() == reflect.Struct {
			if err := bindStruct(c, field); err != nil {
				return err
			}
			continue
		}
		name, raw := "", ""
		switch {
		case f.Tag.Get("path") != "":
			name = f.Tag.Get("path")
			raw = c.Param(name)
		case f.Tag.Get("query") != "":
			name = f.Tag.Get("query")
			raw = c.QueryParam(name)
		case f.Tag.Get("header") != "":
			name = f.Tag.Get("header")
			raw = c.Request().Header.Get(name)
		default:
			continue
		}
		if raw == "" {
			continue
		}
		switch field.Kind() {
		case reflect.String:
			field.SetString(raw)
		case reflect.Bool:
			b, err := strconv.ParseBool(raw)
			if err != nil {
				return runbox.Errorf(runbox.EInvalid, "%s must be true or false", name)
			}
			field.SetBool(b)
		case reflect.Int:
			n, err := strconv.Atoi(raw)
			if err != nil {
				return runbox.Errorf(runbox.EInvalid, "%s must be a whole number", name)
			}
			field.SetInt(int64(n))
		default:
			panic(fmt.Sprintf("api: parameter %s has a type bind does not read: %s", name, field.Type()))
		}
	}
	return nil
}
