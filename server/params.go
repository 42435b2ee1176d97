package server

import (
	"bytes"
	"encoding/json"
	"errors"
	"math"
	"net/http"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/deepinfer/deepinfer-go/engine"
	"github.com/deepinfer/deepinfer-go/engine/tokenizer"
)

// samplingParams turns the sampling fields into engine parameters and
// checks them against the engine's ranges. logprobs is the number of top
// log-probabilities per generated token (nil: none); maxTokens the
// requested output bound (nil: the endpoint's default, resolved later).
// The structured-output constraint the fields set, if any, is in
// p.StructuredOutput and returned with the field that set it.
func (s *Server) samplingParams(f *SamplingFields, logprobs *int) (engine.SamplingParams, *constraint, *apiError) {
	p := engine.DefaultSamplingParams()
	set := func(dst *float32, src *float32) {
		if src != nil {
			*dst = *src
		}
	}
	set(&p.Temperature, f.Temperature)
	set(&p.TopP, f.TopP)
	set(&p.MinP, f.MinP)
	set(&p.PresencePenalty, f.PresencePenalty)
	set(&p.FrequencyPenalty, f.FrequencyPenalty)
	set(&p.RepetitionPenalty, f.RepetitionPenalty)
	if f.TopK != nil {
		p.TopK = *f.TopK
	}
	if f.N != nil {
		p.N = *f.N
	}
	if f.Seed != nil {
		seed := *f.Seed
		p.Seed = &seed
	}
	if f.SkipSpecialTokens != nil {
		p.SkipSpecialTokens = *f.SkipSpecialTokens
	}
	p.IgnoreEOS = f.IgnoreEOS
	p.MinTokens = f.MinTokens
	p.Stop = append([]string(nil), f.Stop...)
	p.StopTokenIDs = append([]int(nil), f.StopTokenIDs...)
	if len(f.LogitBias) > 0 {
		p.LogitBias = make(map[int]float32, len(f.LogitBias))
		for k, v := range f.LogitBias {
			id, err := strconv.Atoi(strings.TrimSpace(k))
			if err != nil {
				return p, nil, badRequest("logit_bias", "logit_bias: key %q is not a token id", k)
			}
			p.LogitBias[id] = v
		}
	}
	if logprobs != nil {
		n := *logprobs
		p.Logprobs = &n
	}
	if f.PromptLogprobs != nil {
		n := *f.PromptLogprobs
		p.PromptLogprobs = &n
	}
	switch {
	case f.IncludeStopStrInOutput:
		return p, nil, badRequest("include_stop_str_in_output", "include_stop_str_in_output is not supported: stop strings are never part of the output")
	case f.Priority != 0:
		return p, nil, badRequest("priority", "priority scheduling is not supported; priority must be 0")
	case f.TruncatePromptTokens != nil:
		return p, nil, badRequest("truncate_prompt_tokens", "truncate_prompt_tokens is not supported")
	case p.N > s.maxN:
		return p, nil, badRequest("n", "n = %d exceeds the engine's max_num_seqs (%d)", p.N, s.maxN)
	}
	c, e := structuredOutput(f)
	if e != nil {
		return p, nil, e
	}
	if c != nil {
		if err := c.so.Validate(); err != nil {
			return p, nil, badRequest(c.field, "%s: %s", c.field, strings.TrimPrefix(err.Error(), engine.ErrInvalidRequest.Error()+": "))
		}
		p.StructuredOutput = c.so
	}
	// MaxTokens is checked by the caller once known; validate the rest now.
	probe := p
	probe.MaxTokens = max(1, p.MinTokens)
	if err := probe.Validate(s.vocabSize); err != nil {
		return p, nil, badRequest(paramOf(err), "%s", strings.TrimPrefix(err.Error(), engine.ErrInvalidRequest.Error()+": sampling params: "))
	}
	return p, c, nil
}

// setMaxTokens resolves max_tokens against the prompt length and the
// model's context: requested nil takes def (a negative def means "the
// rest of the context", as vLLM's chat default). A request whose prompt
// plus max_tokens exceeds max_model_len is refused with vLLM's message,
// never cut; the check cannot overflow, whatever max_tokens is.
func (s *Server) setMaxTokens(p *engine.SamplingParams, requested *int, def, numPromptTokens int, field, promptField string) *apiError {
	room := s.maxModelLen - numPromptTokens
	if room <= 0 {
		return promptTooLong(promptField, s.maxModelLen, numPromptTokens)
	}
	if e := s.checkKVFit(numPromptTokens, promptField); e != nil {
		return e
	}
	switch {
	case requested != nil:
		if *requested < 1 {
			return badRequest(field, "%s must be at least 1, got %d", field, *requested)
		}
		p.MaxTokens = *requested
	case def > 0:
		p.MaxTokens = min(def, room)
	default:
		p.MaxTokens = room
	}
	if p.MaxTokens > room { // not numPromptTokens+MaxTokens: that may overflow
		total := uint64(numPromptTokens) + uint64(p.MaxTokens) // both in [0, MaxInt]: no overflow
		return badRequest(field, "This model's maximum context length is %d tokens. However, you requested %d tokens (%d in the prompt, %d in the completion). Please reduce the length of the prompt or completion.",
			s.maxModelLen, total, numPromptTokens, p.MaxTokens)
	}
	if p.MinTokens > p.MaxTokens {
		return badRequest("min_tokens", "min_tokens must be <= max_tokens (%d), got %d", p.MaxTokens, p.MinTokens)
	}
	return nil
}

// decodeRequest decodes a request body into v (see decodeBody) and names
// the field at fault by its JSON path: encoding/json puts the Go name of
// an embedded struct in the paths it reports ("SamplingFields.temperature"),
// a level the client never wrote. Cost: one decode of the body.
func decodeRequest(w http.ResponseWriter, r *http.Request, limit int64, v any) *apiError {
	e := decodeBody(http.MaxBytesReader(w, r.Body, limit), v)
	if e != nil && e.param != "" {
		if p := jsonFieldPath(e.param); p != e.param {
			e.msg = strings.ReplaceAll(e.msg, e.param, p)
			e.param = p
		}
	}
	return e
}

// Returning memory after large requests.
const (
	// largeBodyBytes is the body size past which a request's buffers are
	// worth handing back to the OS once it is answered.
	largeBodyBytes = 1 << 20
	// memoryReturnDelay lets the request's buffers become garbage (the
	// HTTP server drops the request after the handler returns) before the
	// collection that frees them; requests answered meanwhile share it.
	memoryReturnDelay = time.Second
	// memoryReturnGap is the least time between two returns: each is a
	// forced full collection.
	memoryReturnGap = 5 * time.Second
)

// memoryReturner hands freed heap memory back to the OS after large
// requests, at most once per memoryReturnGap. Without it the runtime
// keeps the pages of a burst of large bodies (hundreds of megabytes of
// RSS) and returns them only gradually. Safe for concurrent use.
type memoryReturner struct {
	mu      sync.Mutex
	pending bool      // a return is scheduled
	last    time.Time // when the last return ran
	free    func()    // debug.FreeOSMemory; replaced in tests
}

// newMemoryReturner returns a returner over debug.FreeOSMemory. Each
// Server has its own; debug.FreeOSMemory acts on the whole process, so
// several servers in one process may each run it at their own rate.
func newMemoryReturner() *memoryReturner { return &memoryReturner{free: debug.FreeOSMemory} }

// afterRequest notes a request of bodyBytes that has been answered; past
// largeBodyBytes it schedules a return (memoryReturnDelay from now, or
// memoryReturnGap after the last one), unless one is already scheduled.
// Cost: a lock; the return runs on its own goroutine.
func (m *memoryReturner) afterRequest(bodyBytes int64) {
	if bodyBytes <= largeBodyBytes {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.pending {
		return
	}
	m.pending = true
	wait := memoryReturnDelay
	if next := time.Until(m.last.Add(memoryReturnGap)); next > wait {
		wait = next
	}
	time.AfterFunc(wait, func() {
		m.free()
		m.mu.Lock()
		m.pending, m.last = false, time.Now()
		m.mu.Unlock()
	})
}

// embeddedName is the Go name of the struct embedded in the request
// bodies, which encoding/json lists in field paths.
const embeddedName = "SamplingFields"

// jsonFieldPath drops the embedded struct's Go name from a dotted field
// path.
func jsonFieldPath(path string) string {
	parts := strings.Split(path, ".")
	parts = slices.DeleteFunc(parts, func(p string) bool { return p == embeddedName })
	return strings.Join(parts, ".")
}

// paramOf extracts the field name a sampling-params error starts with.
func paramOf(err error) string {
	msg := err.Error()
	if i := strings.Index(msg, "sampling params: "); i >= 0 {
		msg = msg[i+len("sampling params: "):]
	}
	name, _, _ := strings.Cut(msg, " ")
	name, _, _ = strings.Cut(name, "[")
	return name
}

func present(raw json.RawMessage) bool {
	t := bytes.TrimSpace(raw)
	return len(t) > 0 && string(t) != "null"
}

func compact(raw json.RawMessage) string {
	var b bytes.Buffer
	if json.Compact(&b, raw) != nil {
		return string(raw)
	}
	if b.Len() > 200 {
		return b.String()[:200] + "..."
	}
	return b.String()
}

// jsonString decodes a JSON string literal that the request's decoder
// has already validated. A literal without escapes whose bytes are valid
// UTF-8 is copied as it is, one pass instead of encoding/json's scan and
// unquote (a prompt may be tens of megabytes); any other literal takes
// json.Unmarshal. ok is false when raw is not a string.
func jsonString(raw json.RawMessage) (s string, ok bool) {
	if n := len(raw); n >= 2 && raw[0] == '"' && raw[n-1] == '"' {
		body := raw[1 : n-1]
		if bytes.IndexByte(body, '\\') < 0 && bytes.IndexByte(body, '"') < 0 && utf8.Valid(body) && !hasControl(body) {
			return string(body), true
		}
	}
	return s, json.Unmarshal(raw, &s) == nil
}

// hasControl reports whether b holds a byte below 0x20, which a JSON
// string cannot hold unescaped.
func hasControl(b []byte) bool {
	for _, c := range b {
		if c < 0x20 {
			return true
		}
	}
	return false
}

// prompts are the prompts of a completion request, as text or token ids.
type promptInput struct {
	text  string
	ids   []int
	isIDs bool
}

// parsePrompt reads the completions "prompt" field: a string, an array of
// strings, an array of token ids, or an array of arrays of token ids.
func parsePrompt(raw json.RawMessage) ([]promptInput, *apiError) {
	raw = bytes.TrimSpace(raw)
	if !present(raw) {
		return nil, badRequest("prompt", "prompt is required")
	}
	bad := badRequest("prompt", "prompt must be a string, an array of strings, an array of token ids or an array of arrays of token ids")
	switch raw[0] {
	case '"':
		s, ok := jsonString(raw)
		if !ok {
			return nil, bad
		}
		return []promptInput{{text: s}}, nil
	case '[':
	default:
		return nil, bad
	}
	var items []json.RawMessage
	if json.Unmarshal(raw, &items) != nil {
		return nil, bad
	}
	if len(items) == 0 {
		return nil, badRequest("prompt", "prompt must not be an empty array")
	}
	first := bytes.TrimSpace(items[0])
	switch {
	case len(first) > 0 && first[0] == '"':
		var ss []string
		if json.Unmarshal(raw, &ss) != nil {
			return nil, bad
		}
		out := make([]promptInput, len(ss))
		for i, s := range ss {
			out[i] = promptInput{text: s}
		}
		return out, nil
	case len(first) > 0 && first[0] == '[':
		var idss [][]int
		if json.Unmarshal(raw, &idss) != nil {
			return nil, bad
		}
		out := make([]promptInput, len(idss))
		for i, ids := range idss {
			out[i] = promptInput{ids: ids, isIDs: true}
		}
		return out, nil
	default:
		var ids []int
		if json.Unmarshal(raw, &ids) != nil {
			return nil, bad
		}
		return []promptInput{{ids: ids, isIDs: true}}, nil
	}
}

// checkKVFit refuses a prompt of n tokens that needs more KV blocks than
// the whole cache has: it could never be scheduled. (The engine refuses it
// too; here the answer names the field.) Cost: O(1).
func (s *Server) checkKVFit(n int, field string) *apiError {
	blocks, size := s.eng.MemoryPlan().KVBlocks, s.eng.Config().Cache.BlockSize
	if blocks <= 0 || size <= 0 {
		return nil
	}
	if need := (n + size - 1) / size; need > blocks {
		return badRequest(field, "Your prompt has %d tokens and needs %d KV cache blocks of %d tokens, but the whole cache has %d blocks (%d tokens). Please reduce the length of the prompt, or give the server a larger KV cache.",
			n, need, size, blocks, blocks*size)
	}
	return nil
}

// promptTooLong is vLLM's answer to a prompt of n tokens that leaves no
// room in a context of maxModelLen tokens.
func promptTooLong(field string, maxModelLen, n int) *apiError {
	return badRequest(field, "This model's maximum context length is %d tokens. However, your prompt has %d tokens. Please reduce the length of the prompt.", maxModelLen, n)
}

// promptTooLongTokens answers a text whose tokenization stopped past
// max_model_len tokens: its exact count was never computed.
func promptTooLongTokens(field string, maxModelLen int) *apiError {
	return badRequest(field, "This model's maximum context length is %d tokens. However, your prompt has more than %d tokens. Please reduce the length of the prompt.", maxModelLen, maxModelLen)
}

// maxPromptBytes is the longest text, in bytes, that may encode to at
// most max_model_len tokens: no token is longer than the tokenizer's
// longest one. It saturates instead of overflowing.
func (s *Server) maxPromptBytes() int {
	b := max(s.tok.MaxTokenBytes(), 1)
	if s.maxModelLen > math.MaxInt/b {
		return math.MaxInt
	}
	return s.maxModelLen * b
}

// checkPromptBytes refuses, before any tokenization, a text of n bytes
// that cannot fit max_model_len tokens; what names the text in the
// message ("your prompt"). Cost: O(1).
func (s *Server) checkPromptBytes(n int, field, what string) *apiError {
	if limit := s.maxPromptBytes(); n > limit {
		return badRequest(field, "This model's maximum context length is %d tokens. However, %s is %d bytes long, and %d tokens of at most %d bytes each hold at most %d bytes. Please reduce the length of the prompt.",
			s.maxModelLen, what, n, s.maxModelLen, s.tok.MaxTokenBytes(), limit)
	}
	return nil
}

// encodeBounded encodes text, stopping as soon as it proves longer than
// budget tokens (then the answer is a 400 naming field). Cost: O(bytes
// read before stopping).
func (s *Server) encodeBounded(text string, addSpecial bool, budget int, field string) ([]int, *apiError) {
	ids, err := s.tok.EncodeWithBudget(text, addSpecial, budget)
	switch {
	case errors.Is(err, tokenizer.ErrTooManyTokens):
		return nil, promptTooLongTokens(field, s.maxModelLen)
	case err != nil:
		return nil, badRequest(field, "tokenizing the prompt: %v", err)
	}
	return ids, nil
}

// tokenize turns a prompt into validated token ids. The work is bounded
// by max_model_len, not by the body: a text longer in bytes than
// max_model_len tokens of the tokenizer's longest token is refused before
// it is tokenized, and tokenization stops as soon as the text proves
// longer than max_model_len tokens.
func (s *Server) tokenize(p promptInput, addSpecial bool, field string) ([]int, *apiError) {
	ids := p.ids
	if !p.isIDs {
		if s.tok == nil {
			return nil, badRequest(field, "the model has no tokenizer: give the prompt as token ids")
		}
		if e := s.checkPromptBytes(len(p.text), field, "your prompt"); e != nil {
			return nil, e
		}
		var e *apiError
		if ids, e = s.encodeBounded(p.text, addSpecial, s.maxModelLen, field); e != nil {
			return nil, e
		}
	}
	return s.checkIDs(ids, field)
}

// checkIDs refuses an empty prompt and ids outside the vocabulary.
func (s *Server) checkIDs(ids []int, field string) ([]int, *apiError) {
	if len(ids) == 0 {
		return nil, badRequest(field, "the prompt is empty")
	}
	for i, id := range ids {
		if id < 0 || id >= s.vocabSize {
			return nil, badRequest(field, "prompt token %d is %d, outside the vocabulary [0, %d)", i, id, s.vocabSize)
		}
	}
	return ids, nil
}

// stopReason is the choice's stop_reason: the stop string, or the stop
// token id when a stop_token_ids entry ended it, nil otherwise (EOS,
// length, abort).
func stopReason(o *choiceState, p *engine.SamplingParams) any {
	if o.finishReason != engine.FinishStop || o.stopReason == "" {
		return nil
	}
	for _, s := range p.Stop {
		if s == o.stopReason {
			return s
		}
	}
	if id, err := strconv.Atoi(o.stopReason); err == nil {
		for _, t := range p.StopTokenIDs {
			if t == id {
				return id
			}
		}
	}
	return nil
}

// finishReasonOf is the OpenAI finish_reason of an engine reason.
func finishReasonOf(r engine.FinishReason) *string {
	var s string
	switch r {
	case engine.FinishNone:
		return nil
	case engine.FinishStop:
		s = "stop"
	case engine.FinishLength:
		s = "length"
	case engine.FinishAbort:
		s = "abort"
	default:
		s = "error"
	}
	return &s
}

// errorOf turns a sequence that finished with an error into an API error:
// 400 when the engine refused the request or could not compile its
// structured-output constraint (which constraintField set), 500 otherwise.
func errorOf(err error, constraintField string) *apiError {
	if err == nil {
		err = errors.New("generation failed")
	}
	if isConstraintError(err) {
		return constraintError(err, constraintField)
	}
	if errors.Is(err, engine.ErrInvalidRequest) {
		return badRequest("", "%v", err)
	}
	return &apiError{status: 500, msg: err.Error()}
}

// isRequestError reports whether err is the engine's refusal of the
// request itself (answered 400), not a failure of generation.
func isRequestError(err error) bool {
	return errors.Is(err, engine.ErrInvalidRequest) || isConstraintError(err)
}
