package server

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"

	"github.com/prometheus/client_golang/prometheus"
)

// The admin API of engines.go:
//
//	GET    /v1/engines        {"engines": [EngineInfo...]}
//	POST   /v1/engines        an EngineConfig (the JSON of one "engines" entry):
//	                          201 {"engine": EngineInfo, "added": true}, or 200 with
//	                          "added": false when the API already serves that very
//	                          engine (a retry)
//	DELETE /v1/engines/{key}  200 {"removed": key, "workers": [...]} once its workers
//	                          have left the index; a key with '/' (an endpoint) is
//	                          percent-encoded: /v1/engines/tcp:%2F%2F10.0.0.7:5557
//
// Errors: 400 bad_json, bad_engine (invalid, or conflicting with a served engine's
// worker ids, endpoints or model block size); 404 unknown_engine; 409 engine_exists
// (the key is served with another spec or by another source), engine_source (DELETE of
// an engine the configuration or discovery owns); 503 shutting_down.

// enginesReply is the body of GET /v1/engines.
type enginesReply struct {
	Engines []EngineInfo `json:"engines"`
}

// engineAdded is the body of a successful POST /v1/engines.
type engineAdded struct {
	Engine EngineInfo `json:"engine"`
	Added  bool       `json:"added"`
}

// engineRemoved is the body of a successful DELETE /v1/engines/{key}.
type engineRemoved struct {
	Removed string   `json:"removed"`
	Workers []string `json:"workers"`
}

func (s *Server) handleEngines(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		writeJSON(w, http.StatusOK, enginesReply{Engines: s.Engines()})
		return
	}
	var body bytes.Buffer
	if !s.readBody(w, r, &body) {
		return
	}
	var e EngineConfig
	if err := decodeStrict(body.Bytes(), &e); err != nil {
		writeError(w, http.StatusBadRequest, "bad_json", "invalid engine: %v", err)
		return
	}
	workers, added, err := s.AddEngine(e)
	if err != nil {
		s.engineError(w, err)
		return
	}
	status := http.StatusOK
	if added {
		status = http.StatusCreated
	}
	writeJSON(w, status, engineAdded{Added: added,
		Engine: EngineInfo{Key: engineKey(e), Source: SourceAPI, Workers: workers, Engine: s.normalize(e)}})
}

func (s *Server) handleEngine(w http.ResponseWriter, r *http.Request) {
	key := r.PathValue("key")
	workers, err := s.RemoveEngine(key)
	if err != nil {
		s.engineError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, engineRemoved{Removed: key, Workers: workers})
}

// engineError answers a failed engine change.
func (s *Server) engineError(w http.ResponseWriter, err error) {
	switch {
	case errors.Is(err, ErrServerState):
		writeError(w, http.StatusServiceUnavailable, "shutting_down", "%v", err)
	case errors.Is(err, ErrUnknownEngine):
		writeError(w, http.StatusNotFound, "unknown_engine", "%v", err)
	case errors.Is(err, ErrEngineExists):
		writeError(w, http.StatusConflict, "engine_exists", "%v", err)
	case errors.Is(err, ErrEngineSource):
		writeError(w, http.StatusConflict, "engine_source", "%v", err)
	case errors.Is(err, ErrConfig):
		writeError(w, http.StatusBadRequest, "bad_engine", "%v", err)
	default:
		writeError(w, http.StatusInternalServerError, "internal", "%v", err)
	}
}

// decodeStrict decodes one JSON value into v as the request readers do: an unknown
// field, a key given twice in an object, a wrong type or trailing data is an error.
func decodeStrict(b []byte, v any) error {
	if len(bytes.TrimSpace(b)) == 0 {
		return errors.New("empty request body")
	}
	if err := checkDuplicateKeys(b); err != nil {
		return err
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return jsonError(err)
	}
	if _, err := dec.Token(); err == nil {
		return errors.New("trailing data after the JSON value")
	}
	return nil
}

// maxJSONDepth bounds the nesting checkDuplicateKeys follows (a hostile body of
// nested brackets costs a frame each).
const maxJSONDepth = 64

// checkDuplicateKeys reports the first object key given twice in the JSON value b.
func checkDuplicateKeys(b []byte) error {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	var walk func(depth int) error
	walk = func(depth int) error {
		if depth > maxJSONDepth {
			return fmt.Errorf("nested deeper than %d", maxJSONDepth)
		}
		t, err := dec.Token()
		if err != nil {
			return err
		}
		switch t {
		case json.Delim('{'):
			seen := map[string]bool{}
			for dec.More() {
				k, err := dec.Token()
				if err != nil {
					return err
				}
				key, _ := k.(string)
				if seen[key] {
					return fmt.Errorf("key %q given twice", key)
				}
				seen[key] = true
				if err := walk(depth + 1); err != nil {
					return err
				}
			}
			_, err = dec.Token()
			return err
		case json.Delim('['):
			for dec.More() {
				if err := walk(depth + 1); err != nil {
					return err
				}
			}
			_, err = dec.Token()
			return err
		}
		return nil
	}
	return walk(0)
}

// engineCollector exports the engines per source at scrape time (kvindex_engines).
type engineCollector struct {
	s    *Server
	desc *prometheus.Desc
}

func newEngineCollector(s *Server) *engineCollector {
	return &engineCollector{s: s, desc: prometheus.NewDesc("kvindex_engines",
		"Engines served, by source (config, api, a discovery source).", []string{"source"}, nil)}
}

func (c *engineCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

func (c *engineCollector) Collect(ch chan<- prometheus.Metric) {
	if n := c.s.engineCount.Load(); n != nil {
		for src, v := range *n {
			ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, float64(v), src)
		}
	}
}
