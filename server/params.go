package server

import (
	"bytes"
	"encoding/json"
	"errors"
	"strconv"
	"strings"

	"github.com/deepinfer/deepinfer-go/engine"
)

// samplingParams turns the sampling fields into engine parameters and
// checks them against the engine's ranges. logprobs is the number of top
// log-probabilities per generated token (nil: none); maxTokens the
// requested output bound (nil: the endpoint's default, resolved later).
func (s *Server) samplingParams(f *SamplingFields, logprobs *int) (engine.SamplingParams, *apiError) {
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
				return p, badRequest("logit_bias", "logit_bias: key %q is not a token id", k)
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
		return p, badRequest("include_stop_str_in_output", "include_stop_str_in_output is not supported: stop strings are never part of the output")
	case f.Priority != 0:
		return p, badRequest("priority", "priority scheduling is not supported; priority must be 0")
	case f.TruncatePromptTokens != nil:
		return p, badRequest("truncate_prompt_tokens", "truncate_prompt_tokens is not supported")
	case present(f.ResponseFormat) && !isTextFormat(f.ResponseFormat):
		return p, badRequest("response_format", "structured output (response_format %s) is not supported by this server yet", compact(f.ResponseFormat))
	case present(f.GuidedJSON), present(f.GuidedRegex), present(f.GuidedChoice), present(f.GuidedGrammar), present(f.StructuredOutputs):
		return p, badRequest("structured_outputs", "structured output (guided_* and structured_outputs) is not supported by this server yet")
	case p.N > s.maxN:
		return p, badRequest("n", "n = %d exceeds the engine's max_num_seqs (%d)", p.N, s.maxN)
	}
	// MaxTokens is checked by the caller once known; validate the rest now.
	probe := p
	probe.MaxTokens = max(1, p.MinTokens)
	if err := probe.Validate(s.vocabSize); err != nil {
		return p, badRequest(paramOf(err), "%s", strings.TrimPrefix(err.Error(), engine.ErrInvalidRequest.Error()+": sampling params: "))
	}
	return p, nil
}

// setMaxTokens resolves max_tokens against the prompt length and the
// model's context: requested nil takes def (a negative def means "the
// rest of the context", as vLLM's chat default). A request that does not
// fit is refused with vLLM's message.
func (s *Server) setMaxTokens(p *engine.SamplingParams, requested *int, def, numPromptTokens int, field, promptField string) *apiError {
	room := s.maxModelLen - numPromptTokens
	if room <= 0 {
		return badRequest(promptField, "This model's maximum context length is %d tokens. However, your prompt has %d tokens. Please reduce the length of the prompt.", s.maxModelLen, numPromptTokens)
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
	if numPromptTokens+p.MaxTokens > s.maxModelLen {
		return badRequest(field, "This model's maximum context length is %d tokens. However, you requested %d tokens (%d in the prompt, %d in the completion). Please reduce the length of the prompt or completion.",
			s.maxModelLen, numPromptTokens+p.MaxTokens, numPromptTokens, p.MaxTokens)
	}
	if p.MinTokens > p.MaxTokens {
		return badRequest("min_tokens", "min_tokens must be <= max_tokens (%d), got %d", p.MaxTokens, p.MinTokens)
	}
	return nil
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

func isTextFormat(raw json.RawMessage) bool {
	var f struct {
		Type string `json:"type"`
	}
	return json.Unmarshal(raw, &f) == nil && f.Type == "text"
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
		var s string
		if json.Unmarshal(raw, &s) != nil {
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

// tokenize turns a prompt into validated token ids.
func (s *Server) tokenize(p promptInput, addSpecial bool, field string) ([]int, *apiError) {
	ids := p.ids
	if !p.isIDs {
		if s.tok == nil {
			return nil, badRequest(field, "the model has no tokenizer: give the prompt as token ids")
		}
		ids = s.tok.Encode(p.text, addSpecial)
	}
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
// 400 when the engine refused the request, 500 otherwise.
func errorOf(err error) *apiError {
	if err == nil {
		err = errors.New("generation failed")
	}
	if errors.Is(err, engine.ErrInvalidRequest) {
		return badRequest("", "%v", err)
	}
	return &apiError{status: 500, msg: err.Error()}
}
