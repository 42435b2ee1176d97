package server

import (
	"context"
	"encoding/json"
	"math"
	"net/http"
	"strconv"
	"unicode/utf8"

	"github.com/deepinfer/deepinfer-go/engine"
)

// sseWriter writes server-sent events; the first write error sticks and
// later writes do nothing.
type sseWriter struct {
	w   http.ResponseWriter
	rc  *http.ResponseController
	err error
}

func newSSEWriter(w http.ResponseWriter) *sseWriter {
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	h.Set("Connection", "keep-alive")
	h.Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	return &sseWriter{w: w, rc: http.NewResponseController(w)}
}

// event writes one "data:" event with v as JSON.
func (s *sseWriter) event(v any) {
	if s.err != nil {
		return
	}
	data, err := json.Marshal(v)
	if err != nil {
		s.err = err
		return
	}
	buf := make([]byte, 0, len(data)+8)
	buf = append(buf, "data: "...)
	buf = append(buf, data...)
	buf = append(buf, "\n\n"...)
	_, s.err = s.w.Write(buf)
}

func (s *sseWriter) done() {
	if s.err == nil {
		_, s.err = s.w.Write([]byte("data: [DONE]\n\n"))
	}
}

func (s *sseWriter) flush() {
	if s.err == nil {
		s.err = s.rc.Flush()
	}
}

// collect waits until every choice of g has finished, applying outputs as
// they come. It returns false (after aborting g) when ctx ends first: the
// client is gone.
func (s *Server) collect(ctx context.Context, g *group) bool {
	finished := 0
	for finished < g.numChoices {
		outs, ok := g.next(ctx)
		if !ok {
			s.abort(g.reqs)
			return false
		}
		for i := range outs {
			g.apply(&outs[i])
			if outs[i].Finished {
				finished++
			}
		}
	}
	return true
}

// streamHooks format one endpoint's stream.
type streamHooks struct {
	// start writes the events that open the stream (may be nil).
	start func(sw *sseWriter)
	// output writes the event(s) of one output, already applied to c.
	output func(sw *sseWriter, r *request, c *choiceState, o *engine.RequestOutput, u *Usage)
	// usage writes the closing usage event.
	usage func(sw *sseWriter, u *Usage)
}

// stream answers g as server-sent events. It waits for the first outputs
// before committing to 200, so that a request the engine refuses is still
// answered with its status; then it writes every output as it comes, an
// error event if a sequence fails, the usage event when includeUsage, and
// [DONE]. A client that disconnects (or a failed write) aborts g.
func (s *Server) stream(w http.ResponseWriter, r *http.Request, g *group, opts *StreamOptions, h streamHooks) {
	ctx := r.Context()
	outs, ok := g.next(ctx)
	if !ok {
		s.abort(g.reqs)
		return
	}
	for i := range outs {
		if o := &outs[i]; o.Finished && o.FinishReason == engine.FinishError && len(o.TokenIDs) == 0 && isRequestError(o.Err) {
			s.abort(g.reqs)
			writeError(w, s.failed(g.byID[o.RequestID], o.Err))
			return
		}
	}
	includeUsage := opts != nil && opts.IncludeUsage
	continuous := opts != nil && opts.ContinuousUsageStats
	sw := newSSEWriter(w)
	if h.start != nil {
		h.start(sw)
	}
	finished, failed := 0, false
	for {
		for i := range outs {
			o := &outs[i]
			req, c := g.apply(o)
			if o.Finished {
				finished++
			}
			if o.Finished && o.FinishReason == engine.FinishError {
				if !failed {
					sw.event(s.failed(req, o.Err).response())
				}
				failed = true
				continue
			}
			var u *Usage
			if continuous {
				u = g.usage()
			}
			h.output(sw, req, c, o, u)
		}
		sw.flush()
		if sw.err != nil {
			s.abort(g.reqs)
			return
		}
		if failed || finished == g.numChoices {
			break
		}
		if outs, ok = g.next(ctx); !ok {
			s.abort(g.reqs)
			return
		}
	}
	if failed {
		s.abort(g.reqs)
	} else if includeUsage {
		h.usage(sw, g.usage())
	}
	sw.done()
	sw.flush()
}

// tokenText is how a token is spelled in logprobs: its decoded text, or
// "token_id:N" when asked (or when the model has no tokenizer).
func (s *Server) tokenText(id int, asIDs bool) string {
	if asIDs || s.tok == nil {
		return "token_id:" + strconv.Itoa(id)
	}
	return s.tok.Decode([]int{id}, false)
}

// clampLogprob replaces -Inf and NaN, which JSON cannot carry, by -9999 as vLLM does.
func clampLogprob(x float32) float32 {
	if math.IsInf(float64(x), 0) || math.IsNaN(float64(x)) || x < -9999 {
		return -9999
	}
	return x
}

// completionLogprobs renders lps in the legacy completions shape; offset
// is the text offset (in characters) of the first token and is advanced.
func (s *Server) completionLogprobs(lps []engine.TokenLogprobs, offset *int, asIDs bool) *CompletionLogprobs {
	out := &CompletionLogprobs{
		TextOffset: make([]int, len(lps)), TokenLogprobs: make([]float32, len(lps)),
		Tokens: make([]string, len(lps)), TopLogprobs: make([]map[string]float32, len(lps)),
	}
	for i, lp := range lps {
		text := s.tokenText(lp.TokenID, asIDs)
		out.TextOffset[i] = *offset
		*offset += utf8.RuneCountInString(text)
		out.Tokens[i] = text
		out.TokenLogprobs[i] = clampLogprob(lp.Logprob)
		top := make(map[string]float32, len(lp.Top)+1)
		for _, t := range lp.Top {
			tt := s.tokenText(t.TokenID, asIDs)
			if _, dup := top[tt]; !dup {
				top[tt] = clampLogprob(t.Logprob)
			}
		}
		if _, ok := top[text]; !ok {
			top[text] = clampLogprob(lp.Logprob)
		}
		out.TopLogprobs[i] = top
	}
	return out
}

// chatLogprobs renders lps in the chat shape.
func (s *Server) chatLogprobs(lps []engine.TokenLogprobs, asIDs bool) *ChatLogprobs {
	out := &ChatLogprobs{Content: make([]ChatTokenLogprob, len(lps))}
	for i, lp := range lps {
		text := s.tokenText(lp.TokenID, asIDs)
		e := ChatTokenLogprob{Token: text, Logprob: clampLogprob(lp.Logprob), Bytes: bytesOf(text), TopLogprobs: make([]TopLogprob, len(lp.Top))}
		for j, t := range lp.Top {
			tt := s.tokenText(t.TokenID, asIDs)
			e.TopLogprobs[j] = TopLogprob{Token: tt, Logprob: clampLogprob(t.Logprob), Bytes: bytesOf(tt)}
		}
		out.Content[i] = e
	}
	return out
}

func bytesOf(s string) []int {
	out := make([]int, len(s))
	for i := 0; i < len(s); i++ {
		out[i] = int(s[i])
	}
	return out
}

// promptLogprobs renders the prompt's log-probabilities as vLLM does: one
// entry per prompt token, the first null, each a map from token id to its
// logprob, rank (1-based among the top candidates; null when the prompt
// token is not among them) and text.
func (s *Server) promptLogprobs(ids []int, lps []engine.TokenLogprobs, asIDs bool) []map[string]PromptLogprob {
	out := make([]map[string]PromptLogprob, len(ids))
	for i := 1; i < len(ids) && i-1 < len(lps); i++ {
		lp := lps[i-1]
		m := make(map[string]PromptLogprob, len(lp.Top)+1)
		var ownRank *int
		for j, t := range lp.Top {
			rank := j + 1
			m[strconv.Itoa(t.TokenID)] = PromptLogprob{Logprob: clampLogprob(t.Logprob), Rank: &rank, DecodedToken: s.tokenText(t.TokenID, asIDs)}
			if t.TokenID == lp.TokenID {
				ownRank = &rank
			}
		}
		m[strconv.Itoa(lp.TokenID)] = PromptLogprob{Logprob: clampLogprob(lp.Logprob), Rank: ownRank, DecodedToken: s.tokenText(lp.TokenID, asIDs)}
		out[i] = m
	}
	return out
}
