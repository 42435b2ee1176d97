package server

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	"github.com/deepinfer/deepinfer-go/engine"
	"github.com/deepinfer/deepinfer-go/engine/tokenizer"
	"github.com/deepinfer/deepinfer-go/llm"
)

// ErrServerClosed is returned by Serve after Shutdown.
var ErrServerClosed = errors.New("server: closed")

// Options tune a Server.
type Options struct {
	// ModelName is the name clients put in "model" and GET /v1/models
	// lists; "" means the base name of the model directory. Requests that
	// leave "model" empty get this model too.
	ModelName string
	// MaxPending bounds the engine requests admitted and not finished (one
	// per prompt of a request; n sequences count once). Past it requests
	// are refused with 503 and Retry-After. 0 means engine.max_num_seqs +
	// engine.max_waiting from the engine's config (unbounded when
	// max_waiting is 0); negative means unbounded. A request with more
	// prompts than this (or than engine.max_num_seqs + engine.max_waiting)
	// could never be admitted: it is refused with 400 instead.
	MaxPending int
	// MaxBodyBytes bounds request bodies (413 past it); 0 or negative
	// means DefaultMaxBodyBytes (8 MiB).
	MaxBodyBytes int64
	// APIKey, when set, is required as "Authorization: Bearer <key>" on
	// every route but /health and /metrics (401 without it).
	APIKey string
	// AllowedOrigins are the origins browsers may call the API from
	// (CORS); "*" allows any. None (the default) sends no CORS headers, so
	// browsers refuse cross-origin calls.
	AllowedOrigins []string
	// ReadHeaderTimeout bounds the reading of a request's headers;
	// BodyReadTimeout bounds the reading of its body (408 past it);
	// IdleTimeout closes keep-alive connections idle that long. 0 means
	// the Default* constant, negative means no limit.
	ReadHeaderTimeout, BodyReadTimeout, IdleTimeout time.Duration
	// MaxConns caps the connections Serve holds at once; connections past
	// it wait in the listen backlog until one closes. 0 means
	// DefaultMaxConns, negative means no cap.
	MaxConns int
	// Logger receives a line per request refused at admission and per
	// generation that fails; nil discards.
	Logger *slog.Logger
}

// Server serves the OpenAI-compatible API over an llm.Engine:
// POST /v1/completions, POST /v1/chat/completions (both streamed as
// server-sent events with "stream": true), GET /v1/models, GET /health and
// GET /metrics (Prometheus).
//
// Each HTTP request becomes one engine request per prompt. The engine's
// outputs are queued per HTTP request without bound and without blocking
// the engine; the handler drains them. A client that disconnects has its
// requests aborted at once, which frees their KV blocks. The Server does not
// own the engine: close the engine after Shutdown.
type Server struct {
	memory      *memoryReturner // hands the heap of large requests back to the OS
	eng         *llm.Engine
	tok         *tokenizer.Tokenizer
	opts        Options
	model       string
	root        string
	maxModelLen int
	vocabSize   int
	maxN        int
	maxPending  int // <= 0: unbounded
	maxPrompts  int // prompts one request may have; <= 0: unbounded
	maxBody     int64
	bodyTimeout time.Duration // <= 0: none
	created     int64
	metrics     *metrics
	mux         *http.ServeMux
	handler     http.Handler // mux behind CORS and the API key
	log         *slog.Logger

	mu         sync.Mutex
	draining   bool
	closed     bool
	numPending int
	live       map[string]*request // engine request id -> request
	httpSrv    *http.Server

	inflight sync.WaitGroup // admitted engine requests not finished
	bg       sync.WaitGroup // abort retries
	closing  chan struct{}  // closed by Shutdown: abort retries stop
	handlers sync.WaitGroup // running API handlers
}

// New returns a Server for eng.
func New(eng *llm.Engine, opts Options) (*Server, error) {
	if eng == nil {
		return nil, errors.New("server: nil engine")
	}
	cfg := eng.Config()
	mcfg := eng.Model().Config()
	s := &Server{
		memory: newMemoryReturner(),
		eng:    eng, tok: eng.Tokenizer(), opts: opts,
		model: opts.ModelName, root: cfg.Model,
		maxModelLen: cfg.Engine.MaxModelLen, vocabSize: mcfg.VocabSize,
		maxN:    cfg.Engine.MaxNumSeqs,
		created: time.Now().Unix(),
		live:    map[string]*request{},
		closing: make(chan struct{}),
		log:     opts.Logger,
	}
	if s.model == "" {
		s.model = filepath.Base(filepath.Clean(cfg.Model))
	}
	if s.maxModelLen == 0 {
		s.maxModelLen = mcfg.MaxPositionEmbeddings
	}
	if n := cfg.Cache.NumStateSlots; n > 0 {
		s.maxN = min(s.maxN, n)
	}
	switch {
	case opts.MaxPending > 0:
		s.maxPending = opts.MaxPending
	case opts.MaxPending == 0 && cfg.Engine.MaxWaiting > 0:
		s.maxPending = cfg.Engine.MaxNumSeqs + cfg.Engine.MaxWaiting
	}
	s.maxPrompts = s.maxPending
	if cfg.Engine.MaxWaiting > 0 {
		if hold := cfg.Engine.MaxNumSeqs + cfg.Engine.MaxWaiting; s.maxPrompts <= 0 || hold < s.maxPrompts {
			s.maxPrompts = hold
		}
	}
	if s.opts.MaxBodyBytes <= 0 {
		s.opts.MaxBodyBytes = DefaultMaxBodyBytes
	}
	s.maxBody = s.opts.MaxBodyBytes
	s.bodyTimeout = orDefault(opts.BodyReadTimeout, DefaultBodyReadTimeout)
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	s.metrics = newMetrics(s.model, s.maxModelLen, eng, func() float64 {
		s.mu.Lock()
		defer s.mu.Unlock()
		return float64(s.numPending)
	})
	s.mux = http.NewServeMux()
	s.mux.HandleFunc("/v1/completions", s.api(http.MethodPost, true, s.handleCompletions))
	s.mux.HandleFunc("/v1/chat/completions", s.api(http.MethodPost, true, s.handleChat))
	s.mux.HandleFunc("/v1/models", s.api(http.MethodGet, false, s.handleModels))
	s.mux.HandleFunc("/v1/models/", s.api(http.MethodGet, false, s.handleModel))
	s.mux.HandleFunc("/tokenize", s.api(http.MethodPost, false, s.handleTokenize))
	s.mux.HandleFunc("/detokenize", s.api(http.MethodPost, false, s.handleDetokenize))
	s.mux.HandleFunc("/version", s.api(http.MethodGet, false, s.handleVersion))
	s.mux.HandleFunc("/health", s.api(http.MethodGet, false, s.handleHealth))
	s.mux.Handle("/metrics", s.metrics.handler())
	s.mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, &apiError{status: http.StatusNotFound, msg: fmt.Sprintf("no route for %s %s", r.Method, r.URL.Path)})
	})
	s.handler = withCORS(opts.AllowedOrigins, requireKey(opts.APIKey, s.mux))
	return s, nil
}

// ModelName is the served model's name.
func (s *Server) ModelName() string { return s.model }

// Handler returns the server's HTTP handler (for tests and custom
// servers), with CORS and the API key check; the timeouts and the
// connection cap are Serve's and apply only there.
func (s *Server) Handler() http.Handler { return s.handler }

// NumPending is the number of admitted engine requests not finished.
func (s *Server) NumPending() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.numPending
}

// Serve accepts connections on ln until Shutdown; it returns
// ErrServerClosed after Shutdown, or the listener's error. It holds at
// most Options.MaxConns connections at once and applies the header and
// idle timeouts (the body read timeout applies to Handler too).
func (s *Server) Serve(ln net.Listener) error {
	s.mu.Lock()
	if s.closed || s.draining || s.httpSrv != nil {
		s.mu.Unlock()
		return fmt.Errorf("server: serve %s: %w", ln.Addr(), ErrServerClosed)
	}
	ln = newLimitListener(ln, orDefault(s.opts.MaxConns, DefaultMaxConns))
	s.httpSrv = &http.Server{
		Handler:           s.handler,
		ReadHeaderTimeout: orDefault(s.opts.ReadHeaderTimeout, DefaultReadHeaderTimeout),
		IdleTimeout:       orDefault(s.opts.IdleTimeout, DefaultIdleTimeout),
	}
	srv := s.httpSrv
	s.mu.Unlock()
	err := srv.Serve(ln)
	if errors.Is(err, http.ErrServerClosed) {
		return ErrServerClosed
	}
	return err
}

// Shutdown stops the server gracefully. While in-flight generations run
// to their end (until ctx is done) the listener stays open: new
// generation requests are answered 503 with Retry-After, /health answers
// 503, and keep-alive is off so clients reconnect elsewhere. Once they
// have finished, the listener and idle connections close; at ctx's end
// the rest are aborted and their handlers answer with what they have
// (finish_reason "abort"). It returns once every handler has returned,
// with ctx's error when the deadline forced aborts. The engine stays
// open.
func (s *Server) Shutdown(ctx context.Context) error {
	s.mu.Lock()
	s.draining = true
	srv := s.httpSrv
	s.mu.Unlock()

	if srv != nil {
		srv.SetKeepAlivesEnabled(false) // also closes idle connections
	}
	idle := make(chan struct{})
	go func() { s.inflight.Wait(); close(idle) }()
	// No handler is added once draining is set (under mu), so this Wait
	// never races an Add from zero.
	done := make(chan struct{})
	go func() { s.handlers.Wait(); close(done) }()
	var err error
	select {
	case <-done:
		if srv != nil {
			err = srv.Shutdown(ctx) // closes the listener and idle connections, waits for active ones
		}
	case <-ctx.Done():
		err = ctx.Err()
	}
	if err != nil {
		// Out of time: abort what runs; handlers answer with what they have.
		s.abortAll()
		select {
		case <-done:
		case <-time.After(time.Second): // a client that does not read
		}
		if srv != nil {
			// Let finished answers flush, briefly, then cut what is left.
			fctx, cancel := context.WithTimeout(context.Background(), time.Second)
			if srv.Shutdown(fctx) != nil {
				srv.Close()
			}
			cancel()
		}
		<-done
	}
	// Every handler has returned: what is still live has no client.
	s.abortAll()
	select {
	case <-idle:
	case <-time.After(time.Second):
	}
	s.mu.Lock()
	if !s.closed {
		s.closed = true
		close(s.closing)
	}
	s.mu.Unlock()
	s.bg.Wait()
	return err
}

// abortAll aborts every live request.
func (s *Server) abortAll() {
	s.mu.Lock()
	reqs := make([]*request, 0, len(s.live))
	for _, r := range s.live {
		reqs = append(reqs, r)
	}
	s.mu.Unlock()
	s.abort(reqs)
}

// api wraps a handler with its method check and handler accounting;
// generation handlers (gen) are refused once Shutdown has begun. A POST
// handler runs only for a body declared JSON (415 otherwise) whose
// declared length fits the size cap (413), under the body read timeout:
// see limitBody.
func (s *Server) api(method string, gen bool, h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if r.Method != method {
			w.Header().Set("Allow", method)
			writeError(w, &apiError{status: http.StatusMethodNotAllowed, msg: fmt.Sprintf("%s %s: method not allowed, use %s", r.Method, r.URL.Path, method)})
			return
		}
		if method == http.MethodPost {
			if e := checkJSON(r); e != nil {
				writeError(w, e)
				return
			}
		}
		if gen {
			s.mu.Lock()
			if s.draining {
				s.mu.Unlock()
				s.metrics.rejected.WithLabelValues("shutdown").Inc()
				writeError(w, &apiError{status: http.StatusServiceUnavailable, msg: "the server is shutting down"})
				return
			}
			s.handlers.Add(1) // under mu: never concurrent with Shutdown's Wait
			s.mu.Unlock()
			defer s.handlers.Done()
		}
		if method == http.MethodPost && !s.limitBody(w, r) {
			return
		}
		h(w, r)
	}
}

func (s *Server) handleModels(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, ModelList{Object: "list", Data: []ModelCard{s.modelCard()}})
}

// modelCard is the served model's entry in /v1/models.
func (s *Server) modelCard() ModelCard {
	return ModelCard{ID: s.model, Object: "model", Created: s.created, OwnedBy: "deepinfer", Root: s.model,
		MaxModelLen: s.maxModelLen, VocabSize: s.vocabSize}
}

func (s *Server) handleHealth(w http.ResponseWriter, _ *http.Request) {
	s.mu.Lock()
	draining := s.draining
	s.mu.Unlock()
	if draining {
		writeError(w, &apiError{status: http.StatusServiceUnavailable, msg: "the server is shutting down"})
		return
	}
	select {
	case <-s.eng.Done():
		msg := "the engine's step loop has stopped"
		if err := s.eng.Err(); err != nil {
			msg += ": " + err.Error()
		}
		writeError(w, &apiError{status: http.StatusServiceUnavailable, msg: msg})
		return
	default:
	}
	w.WriteHeader(http.StatusOK)
}

// checkModel accepts the served model's name or "".
func (s *Server) checkModel(name string) *apiError {
	if name == "" || name == s.model {
		return nil
	}
	return &apiError{status: http.StatusNotFound, param: "model", msg: fmt.Sprintf("The model `%s` does not exist. This server serves `%s`.", name, s.model)}
}

// newID returns prefix + 24 random hex digits.
func newID(prefix string) string {
	var b [12]byte
	rand.Read(b[:])
	return prefix + hex.EncodeToString(b[:])
}

// request is one engine request: one prompt of an HTTP request with its n
// sequences.
type request struct {
	id             string
	prompt         int // index of the prompt in the HTTP request
	promptTokenIDs []int
	params         engine.SamplingParams
	arrival        time.Time
	// constraintField is the request field that set the structured-output
	// constraint ("" when none): a constraint that does not compile is
	// answered 400 naming it.
	constraintField string
	// tools is a chat request's tool use (nil for completions): how the
	// answer's text becomes content and tool calls.
	tools *toolConfig
	g     *group
	// abortMu orders the engine's AddRequest and the server's abort of one
	// request: an abort that comes first is carried out right after the
	// request is added, so nothing needs to be retried.
	abortMu         sync.Mutex
	added           bool // the engine has the request
	aborting        bool // the server aborted it
	choices         []choiceState
	numCachedTokens int
	promptLogprobs  []engine.TokenLogprobs

	// Guarded by g.mu: per-sequence bookkeeping of onOutput.
	seqDone     []bool
	left        int
	sawToken    bool
	lastToken   []time.Time
	numGen      int
	firstReason engine.FinishReason
}

// choiceState accumulates one output sequence in the handler.
type choiceState struct {
	text         []byte
	numTokens    int
	logprobs     []engine.TokenLogprobs
	tokenIDs     []int
	finished     bool
	finishReason engine.FinishReason
	stopReason   string
	err          error
	textOffset   int // runes of text so far (completion logprobs)
}

// group is the engine requests of one HTTP request and their output
// queue: unbounded, filled by the engine's goroutines, drained by the
// handler.
type group struct {
	s          *Server
	reqs       []*request
	byID       map[string]*request
	numChoices int

	mu      sync.Mutex
	pending []engine.RequestOutput
	notify  chan struct{} // capacity 1: "pending is non-empty"
}

func (s *Server) newGroup(reqs []*request) *group {
	g := &group{s: s, reqs: reqs, byID: make(map[string]*request, len(reqs)), notify: make(chan struct{}, 1)}
	for _, r := range reqs {
		r.g = g
		n := r.params.N
		r.seqDone = make([]bool, n)
		r.lastToken = make([]time.Time, n)
		r.left = n
		r.choices = make([]choiceState, n)
		g.byID[r.id] = r
		g.numChoices += n
	}
	return g
}

// onOutput is the engine's callback: it records metrics, queues o and
// wakes the handler. It never blocks on the handler. Outputs of a sequence
// after its finish (an abort racing the last step) are dropped.
func (g *group) onOutput(r *request, o engine.RequestOutput) {
	now := time.Now()
	m := g.s.metrics
	g.mu.Lock()
	if o.Index < 0 || o.Index >= len(r.seqDone) || r.seqDone[o.Index] {
		g.mu.Unlock()
		return
	}
	if n := len(o.TokenIDs); n > 0 {
		if !r.sawToken {
			r.sawToken = true
			first := o.FirstTokenTime
			if first.IsZero() {
				first = now
			}
			m.ttft.Observe(first.Sub(r.arrival).Seconds())
			if !o.ScheduledTime.IsZero() {
				m.queue.Observe(max(0, o.ScheduledTime.Sub(r.arrival).Seconds()))
			}
			m.promptTokens.Add(float64(len(r.promptTokenIDs)))
		}
		if last := r.lastToken[o.Index]; !last.IsZero() {
			m.itl.Observe(now.Sub(last).Seconds())
		}
		r.lastToken[o.Index] = now
		r.numGen += n
		m.genTokens.Add(float64(n))
	}
	if o.Finished {
		r.seqDone[o.Index] = true
		r.left--
		if o.Index == 0 {
			r.firstReason = o.FinishReason
		}
	}
	done := o.Finished && r.left == 0
	g.s.observeOutput(r, &o, now, done) // metrics.go: phase histograms, log lines
	// A finished request is counted and released before its last output
	// is queued: a client that reads /metrics after its answer sees it.
	// (Lock order: g.mu, then the server's; never the other way.)
	if done {
		m.e2e.Observe(now.Sub(r.arrival).Seconds())
		m.promptTokensHist.Observe(float64(len(r.promptTokenIDs)))
		m.genTokensHist.Observe(float64(r.numGen))
		m.success.WithLabelValues(r.firstReason.String()).Inc()
		g.s.release(r)
	}
	g.pending = append(g.pending, o)
	g.mu.Unlock()
	select {
	case g.notify <- struct{}{}:
	default:
	}
}

// next waits for queued outputs and returns them; ok is false when ctx
// ended first.
func (g *group) next(ctx context.Context) (outs []engine.RequestOutput, ok bool) {
	for {
		g.mu.Lock()
		outs, g.pending = g.pending, nil
		g.mu.Unlock()
		if len(outs) > 0 {
			return outs, true
		}
		select {
		case <-g.notify:
		case <-ctx.Done():
			return nil, false
		}
	}
}

// apply adds o to its choice and returns the request and choice.
func (g *group) apply(o *engine.RequestOutput) (*request, *choiceState) {
	r := g.byID[o.RequestID]
	c := &r.choices[o.Index]
	if o.PromptTokenIDs != nil && o.PromptLogprobs != nil {
		r.promptLogprobs = o.PromptLogprobs
	}
	if o.NumCachedTokens > 0 {
		r.numCachedTokens = o.NumCachedTokens
	}
	c.text = append(c.text, o.Text...)
	c.numTokens += len(o.TokenIDs)
	c.tokenIDs = append(c.tokenIDs, o.TokenIDs...)
	c.logprobs = append(c.logprobs, o.Logprobs...)
	if o.Finished {
		c.finished, c.finishReason, c.stopReason, c.err = true, o.FinishReason, o.StopReason, o.Err
	}
	return r, c
}

// usage counts the group's tokens so far.
func (g *group) usage() *Usage {
	u := &Usage{}
	cached := 0
	for _, r := range g.reqs {
		u.PromptTokens += len(r.promptTokenIDs)
		cached += r.numCachedTokens
		for i := range r.choices {
			u.CompletionTokens += r.choices[i].numTokens
		}
	}
	u.TotalTokens = u.PromptTokens + u.CompletionTokens
	if cached > 0 {
		u.PromptTokensDetails = &PromptTokensDetails{CachedTokens: cached}
	}
	return u
}

// firstError returns the error of the first choice that failed, if any,
// and logs it.
func (g *group) firstError() *apiError {
	for _, r := range g.reqs {
		for i := range r.choices {
			if c := &r.choices[i]; c.finished && c.finishReason == engine.FinishError {
				return g.s.failed(r, c.err)
			}
		}
	}
	return nil
}

// failed logs a generation of r that failed and returns its API error.
func (s *Server) failed(r *request, err error) *apiError {
	e := errorOf(err, r.constraintField)
	s.log.Warn("generation failed", "request", r.id, "status", e.status, "error", e.msg)
	return e
}

// mark records that the engine has r (added) and that the server aborted
// it (aborting), whichever this call learns, and reports whether both now
// hold: the caller that makes both true aborts r in the engine, once.
func (r *request) mark(added, aborting bool) bool {
	r.abortMu.Lock()
	defer r.abortMu.Unlock()
	before := r.added && r.aborting
	r.added = r.added || added
	r.aborting = r.aborting || aborting
	return !before && r.added && r.aborting
}

// abort aborts reqs in the engine: at once for a request the engine has,
// right after it is added for one still being submitted.
func (s *Server) abort(reqs []*request) {
	for _, r := range reqs {
		if r.mark(false, true) {
			s.eng.Abort(r.id)
		}
	}
}

// background runs f on a goroutine that Shutdown waits for; after
// Shutdown it does nothing.
func (s *Server) background(f func()) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return
	}
	s.bg.Add(1)
	go func() {
		defer s.bg.Done()
		f()
	}()
}

// submit admits reqs (all or none) and adds them to the engine.
func (s *Server) submit(reqs []*request) (*group, *apiError) {
	if s.maxPrompts > 0 && len(reqs) > s.maxPrompts {
		return nil, badRequest("prompt", "the request has %d prompts and this server holds at most %d at once "+
			"(the smaller of --max-pending and engine.max_num_seqs + engine.max_waiting): send at most %d per request",
			len(reqs), s.maxPrompts, s.maxPrompts)
	}
	g := s.newGroup(reqs)
	s.mu.Lock()
	switch {
	case s.draining:
		s.mu.Unlock()
		s.metrics.rejected.WithLabelValues("shutdown").Inc()
		return nil, &apiError{status: http.StatusServiceUnavailable, msg: "the server is shutting down"}
	case s.maxPending > 0 && s.numPending+len(reqs) > s.maxPending:
		pending := s.numPending
		s.mu.Unlock()
		s.metrics.rejected.WithLabelValues("queue_full").Inc()
		s.log.Warn("request refused: queue full", "pending", pending, "limit", s.maxPending)
		return nil, &apiError{status: http.StatusServiceUnavailable, msg: fmt.Sprintf(
			"the server is at capacity: %d requests in flight (limit %d, engine.max_num_seqs + engine.max_waiting); retry later", pending, s.maxPending)}
	}
	s.numPending += len(reqs)
	s.inflight.Add(len(reqs))
	for _, r := range reqs {
		s.live[r.id] = r
	}
	s.mu.Unlock()
	for i, r := range reqs {
		er := &engine.Request{
			ID: r.id, PromptTokenIDs: r.promptTokenIDs, Params: r.params, Arrival: r.arrival,
			OnOutput: func(o engine.RequestOutput) { g.onOutput(r, o) },
		}
		err := s.eng.AddRequest(er)
		if err == nil {
			if r.mark(true, false) { // the server aborted it on the way in
				s.eng.Abort(r.id)
			}
			continue
		}
		for _, never := range reqs[i:] {
			s.release(never)
		}
		s.abort(reqs[:i])
		reason, msg := "queue_full", err.Error()
		switch {
		case errors.Is(err, engine.ErrInvalidRequest):
			return nil, badRequest("", "%v", err) // the server's own checks let it through
		case errors.Is(err, llm.ErrClosed):
			reason, msg = "shutdown", "the engine is shutting down"
		}
		s.metrics.rejected.WithLabelValues(reason).Inc()
		return nil, &apiError{status: http.StatusServiceUnavailable, msg: msg}
	}
	return g, nil
}

// release forgets a request that has ended (or never started).
func (s *Server) release(r *request) {
	s.mu.Lock()
	if _, ok := s.live[r.id]; !ok {
		s.mu.Unlock()
		return
	}
	delete(s.live, r.id)
	s.numPending--
	s.mu.Unlock()
	s.inflight.Done()
}

// newRequests builds one request per prompt with fresh ids.
func newRequests(idBase string, prompts [][]int, params []engine.SamplingParams, arrival time.Time) []*request {
	reqs := make([]*request, len(prompts))
	for i, ids := range prompts {
		reqs[i] = &request{id: idBase + "-" + strconv.Itoa(i), prompt: i, promptTokenIDs: ids, params: params[i], arrival: arrival}
	}
	return reqs
}
