package server

import (
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strings"
)

// jsonError rewrites encoding/json's errors in the words of the API: a field of the
// wrong type is named by its JSON path and the JSON type it takes ("dp_rank: a string
// where an integer goes"), never by the Go type behind it, and the "json: " prefix goes.
// Every endpoint decoding strictly (decodeStrict: Mooncake's, /v1/engines) answers
// with it, so their 400s read as /v1/match's do.
func jsonError(err error) error {
	var te *json.UnmarshalTypeError
	if errors.As(err, &te) {
		field := te.Field
		if field == "" {
			field = "the request"
		}
		return fmt.Errorf("%s: %s where %s goes", field, jsonValue(te.Value), jsonType(te.Type))
	}
	msg := strings.TrimPrefix(err.Error(), "json: ")
	if msg == err.Error() {
		return err
	}
	return errors.New(msg)
}

// jsonValue names the kind of value json found ("string", "number -1", ...).
func jsonValue(v string) string {
	switch {
	case v == "object" || v == "array":
		return "an " + v
	case v == "":
		return "a value"
	}
	return "a " + v
}

// jsonType names the JSON a Go type takes.
func jsonType(t reflect.Type) string {
	if t == nil {
		return "another value"
	}
	switch t.Kind() {
	case reflect.Pointer:
		return jsonType(t.Elem())
	case reflect.Bool:
		return "a boolean"
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return "an integer"
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return "a non-negative integer of " + fmt.Sprint(t.Bits()) + " bits"
	case reflect.Float32, reflect.Float64:
		return "a number"
	case reflect.String:
		return "a string"
	case reflect.Slice, reflect.Array:
		return "an array"
	case reflect.Map, reflect.Struct:
		return "an object"
	}
	return "another value"
}
