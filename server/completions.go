package server

import (
	"net/http"
	"time"

	"github.com/deepinfer/deepinfer-go/engine"
)

// defaultCompletionMaxTokens is max_tokens when a completion request sets
// none (OpenAI's and vLLM's default).
const defaultCompletionMaxTokens = 16

// handleCompletions serves POST /v1/completions.
func (s *Server) handleCompletions(w http.ResponseWriter, r *http.Request) {
	arrival := time.Now()
	defer s.memory.afterRequest(r.ContentLength)
	var req CompletionRequest
	if e := decodeRequest(w, r, s.opts.MaxBodyBytes, &req); e != nil {
		writeError(w, e)
		return
	}
	id := newID("cmpl-")
	reqs, e := s.completionRequests(&req, id, arrival)
	if e != nil {
		writeError(w, e)
		return
	}
	g, e := s.submit(reqs)
	if e != nil {
		writeError(w, e)
		return
	}
	created := time.Now().Unix()
	asIDs := req.ReturnTokensAsTokenIDs
	if !req.Stream {
		if !s.collect(r.Context(), g) {
			return
		}
		if e := g.firstError(); e != nil {
			writeError(w, e)
			return
		}
		resp := CompletionResponse{ID: id, Object: "text_completion", Created: created, Model: s.model, Usage: g.usage()}
		for _, rq := range g.reqs {
			for i := range rq.choices {
				c := &rq.choices[i]
				ch := CompletionChoice{
					Index: rq.prompt*rq.params.N + i, Text: string(c.text),
					FinishReason: finishReasonOf(c.finishReason), StopReason: stopReason(c, &rq.params),
				}
				if rq.params.Logprobs != nil {
					off := 0
					ch.Logprobs = s.completionLogprobs(c.logprobs, &off, asIDs)
				}
				if rq.params.PromptLogprobs != nil {
					ch.PromptLogprobs = s.promptLogprobs(rq.promptTokenIDs, rq.promptLogprobs, asIDs)
				}
				resp.Choices = append(resp.Choices, ch)
			}
		}
		writeJSON(w, http.StatusOK, resp)
		return
	}
	chunk := func(choices []CompletionChoice, u *Usage) CompletionResponse {
		return CompletionResponse{ID: id, Object: "text_completion", Created: created, Model: s.model, Choices: choices, Usage: u}
	}
	s.stream(w, r, g, req.StreamOptions, streamHooks{
		output: func(sw *sseWriter, rq *request, c *choiceState, o *engine.RequestOutput, u *Usage) {
			if o.Text == "" && !o.Finished && len(o.Logprobs) == 0 {
				return // a token that adds no text yet (a held-back stop prefix)
			}
			ch := CompletionChoice{Index: rq.prompt*rq.params.N + o.Index, Text: o.Text}
			if rq.params.Logprobs != nil {
				ch.Logprobs = s.completionLogprobs(o.Logprobs, &c.textOffset, asIDs)
			}
			if o.Finished {
				ch.FinishReason, ch.StopReason = finishReasonOf(c.finishReason), stopReason(c, &rq.params)
			}
			sw.event(chunk([]CompletionChoice{ch}, u))
		},
		usage: func(sw *sseWriter, u *Usage) { sw.event(chunk([]CompletionChoice{}, u)) },
	})
}

// completionRequests validates a completion request and builds its
// engine requests, one per prompt.
func (s *Server) completionRequests(req *CompletionRequest, id string, arrival time.Time) ([]*request, *apiError) {
	if e := s.checkModel(req.Model); e != nil {
		return nil, e
	}
	switch {
	case req.Echo:
		return nil, badRequest("echo", "echo is not supported")
	case req.Suffix != nil && *req.Suffix != "":
		return nil, badRequest("suffix", "suffix is not supported")
	case req.BestOf != nil && (req.N == nil && *req.BestOf != 1 || req.N != nil && *req.BestOf != *req.N):
		return nil, badRequest("best_of", "best_of is not supported; leave it unset or equal to n")
	case req.StreamOptions != nil && !req.Stream:
		return nil, badRequest("stream_options", "stream_options can only be set when stream is true")
	case req.Stream && req.PromptLogprobs != nil:
		return nil, badRequest("prompt_logprobs", "prompt_logprobs is not available with stream")
	}
	prompts, e := parsePrompt(req.Prompt)
	if e != nil {
		return nil, e
	}
	params, c, e := s.samplingParams(&req.SamplingFields, req.Logprobs)
	if e != nil {
		return nil, e
	}
	addSpecial := true
	if req.AddSpecialTokens != nil {
		addSpecial = *req.AddSpecialTokens
	}
	ids := make([][]int, len(prompts))
	perPrompt := make([]engine.SamplingParams, len(prompts))
	for i, p := range prompts {
		if ids[i], e = s.tokenize(p, addSpecial, "prompt"); e != nil {
			return nil, e
		}
		perPrompt[i] = params
		if e = s.setMaxTokens(&perPrompt[i], req.MaxTokens, defaultCompletionMaxTokens, len(ids[i]), "max_tokens", "prompt"); e != nil {
			return nil, e
		}
	}
	reqs := newRequests(id, ids, perPrompt, arrival)
	if c != nil {
		for _, r := range reqs {
			r.constraintField = c.field
		}
	}
	return reqs, nil
}
