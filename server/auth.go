package server

import (
	"crypto/sha256"
	"crypto/subtle"
	"fmt"
	"mime"
	"net/http"
	"slices"
	"strings"
)

// isPublic reports whether path answers without an API key: probes and
// scrapers carry none.
func isPublic(path string) bool { return path == "/health" || path == "/metrics" }

// requireKey wraps next so that every route but /health and /metrics
// needs "Authorization: Bearer <key>"; a request without it, or with
// another key, is answered 401 in the OpenAI error shape. The key is
// compared in constant time (over SHA-256 digests, so its length does not
// leak either). An empty key returns next unchanged. Cost: one SHA-256 of
// the presented key per request.
func requireKey(key string, next http.Handler) http.Handler {
	if key == "" {
		return next
	}
	want := sha256.Sum256([]byte(key))
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if isPublic(r.URL.Path) {
			next.ServeHTTP(w, r)
			return
		}
		scheme, token, _ := strings.Cut(r.Header.Get("Authorization"), " ")
		got := sha256.Sum256([]byte(strings.TrimSpace(token)))
		if !strings.EqualFold(scheme, "Bearer") || subtle.ConstantTimeCompare(got[:], want[:]) != 1 {
			w.Header().Set("WWW-Authenticate", `Bearer realm="deepinfer"`)
			msg := "invalid API key: send the server's key as \"Authorization: Bearer <key>\""
			if r.Header.Get("Authorization") == "" {
				msg = "missing API key: send the server's key as \"Authorization: Bearer <key>\""
			}
			writeError(w, &apiError{status: http.StatusUnauthorized, msg: msg})
			return
		}
		next.ServeHTTP(w, r)
	})
}

// checkJSON refuses a request body that is not declared JSON: its
// Content-Type must be application/json, with or without parameters.
// Browsers send text/plain, form and multipart bodies (and bodies with no
// Content-Type) cross-origin without a CORS preflight, so accepting them
// would let any web page run generations on a server it can reach.
func checkJSON(r *http.Request) *apiError {
	ct := r.Header.Get("Content-Type")
	mt, _, err := mime.ParseMediaType(ct)
	if err == nil && mt == "application/json" {
		return nil
	}
	if ct == "" {
		ct = "none"
	}
	return &apiError{status: http.StatusUnsupportedMediaType, msg: fmt.Sprintf(
		"unsupported Content-Type %q: request bodies must be JSON, sent with \"Content-Type: application/json\"", ct)}
}

// cors answers CORS for the allowed origins (a "*" entry allows any).
type cors struct {
	any     bool
	origins []string
	next    http.Handler
}

// withCORS wraps next so that requests from the allowed origins get the
// Access-Control-* headers and their preflights (OPTIONS with
// Access-Control-Request-Method) are answered 204 without reaching next
// (and without an API key: browsers send none on a preflight). Requests
// from other origins pass through without CORS headers, which browsers
// read as a refusal. No origins returns next unchanged: CORS is off.
// Cost: a scan of the origin list per request that carries an Origin.
func withCORS(origins []string, next http.Handler) http.Handler {
	if len(origins) == 0 {
		return next
	}
	c := &cors{next: next}
	for _, o := range origins {
		if o == "*" {
			c.any = true
		}
		c.origins = append(c.origins, strings.TrimSuffix(o, "/"))
	}
	return c
}

func (c *cors) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	origin := r.Header.Get("Origin")
	h := w.Header()
	if !c.any {
		h.Add("Vary", "Origin")
	}
	if origin == "" || !c.any && !slices.Contains(c.origins, origin) {
		c.next.ServeHTTP(w, r)
		return
	}
	if c.any {
		h.Set("Access-Control-Allow-Origin", "*")
	} else {
		h.Set("Access-Control-Allow-Origin", origin)
	}
	if r.Method == http.MethodOptions && r.Header.Get("Access-Control-Request-Method") != "" {
		h.Add("Vary", "Access-Control-Request-Method")
		h.Add("Vary", "Access-Control-Request-Headers")
		h.Set("Access-Control-Allow-Methods", "GET, POST, OPTIONS")
		if req := r.Header.Get("Access-Control-Request-Headers"); req != "" {
			h.Set("Access-Control-Allow-Headers", req)
		}
		h.Set("Access-Control-Max-Age", "600")
		w.WriteHeader(http.StatusNoContent)
		return
	}
	c.next.ServeHTTP(w, r)
}
