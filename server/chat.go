package server

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/deepinfer/deepinfer-go/engine"
	"github.com/deepinfer/deepinfer-go/engine/tokenizer"
)

// handleChat serves POST /v1/chat/completions.
func (s *Server) handleChat(w http.ResponseWriter, r *http.Request) {
	arrival := time.Now()
	var req ChatCompletionRequest
	if e := decodeBody(http.MaxBytesReader(w, r.Body, s.opts.MaxBodyBytes), &req); e != nil {
		writeError(w, e)
		return
	}
	id := newID("chatcmpl-")
	reqs, e := s.chatRequests(&req, id, arrival)
	if e != nil {
		writeError(w, e)
		return
	}
	g, e := s.submit(reqs)
	if e != nil {
		writeError(w, e)
		return
	}
	rq := reqs[0]
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
		resp := ChatCompletionResponse{ID: id, Object: "chat.completion", Created: created, Model: s.model, Usage: g.usage()}
		for i := range rq.choices {
			c := &rq.choices[i]
			text := string(c.text)
			ch := ChatChoice{
				Index: i, Message: ChatResponseMessage{Role: "assistant", Content: &text},
				FinishReason: finishReasonOf(c.finishReason), StopReason: stopReason(c, &rq.params),
			}
			if req.Logprobs {
				ch.Logprobs = s.chatLogprobs(c.logprobs, asIDs)
			}
			resp.Choices = append(resp.Choices, ch)
		}
		writeJSON(w, http.StatusOK, resp)
		return
	}
	chunk := func(choices []ChatChunkChoice, u *Usage) ChatCompletionChunk {
		return ChatCompletionChunk{ID: id, Object: "chat.completion.chunk", Created: created, Model: s.model, Choices: choices, Usage: u}
	}
	s.stream(w, r, g, req.StreamOptions, streamHooks{
		start: func(sw *sseWriter) {
			empty := ""
			for i := range rq.params.N {
				sw.event(chunk([]ChatChunkChoice{{Index: i, Delta: ChatResponseMessage{Role: "assistant", Content: &empty}}}, nil))
			}
		},
		output: func(sw *sseWriter, _ *request, c *choiceState, o *engine.RequestOutput, u *Usage) {
			if o.Text == "" && !o.Finished && len(o.Logprobs) == 0 {
				return
			}
			ch := ChatChunkChoice{Index: o.Index}
			if o.Text != "" {
				text := o.Text
				ch.Delta.Content = &text
			}
			if req.Logprobs {
				ch.Logprobs = s.chatLogprobs(o.Logprobs, asIDs)
			}
			if o.Finished {
				ch.FinishReason, ch.StopReason = finishReasonOf(c.finishReason), stopReason(c, &rq.params)
			}
			sw.event(chunk([]ChatChunkChoice{ch}, u))
		},
		usage: func(sw *sseWriter, u *Usage) { sw.event(chunk([]ChatChunkChoice{}, u)) },
	})
}

// chatRequests validates a chat request, renders its messages with the
// chat template and builds its engine request.
func (s *Server) chatRequests(req *ChatCompletionRequest, id string, arrival time.Time) ([]*request, *apiError) {
	if e := s.checkModel(req.Model); e != nil {
		return nil, e
	}
	toolChoice := strings.Trim(string(bytes.TrimSpace(req.ToolChoice)), `"`)
	switch {
	case len(req.Messages) == 0:
		return nil, badRequest("messages", "messages must be a non-empty array")
	case req.Echo:
		return nil, badRequest("echo", "echo is not supported")
	case present(req.Tools) && toolChoice != "none":
		return nil, badRequest("tools", "tool calling is not supported; send no tools or tool_choice \"none\"")
	case present(req.ToolChoice) && toolChoice != "none" && toolChoice != "auto":
		return nil, badRequest("tool_choice", "tool_choice %s is not supported", compact(req.ToolChoice))
	case req.StreamOptions != nil && !req.Stream:
		return nil, badRequest("stream_options", "stream_options can only be set when stream is true")
	case req.PromptLogprobs != nil:
		return nil, badRequest("prompt_logprobs", "prompt_logprobs is served by /v1/completions only")
	case req.TopLogprobs != nil && !req.Logprobs:
		return nil, badRequest("top_logprobs", "top_logprobs needs logprobs set to true")
	case req.ContinueFinalMessage && req.AddGenerationPrompt != nil && *req.AddGenerationPrompt:
		return nil, badRequest("continue_final_message", "continue_final_message and add_generation_prompt cannot both be true")
	case s.tok == nil:
		return nil, badRequest("messages", "the model has no tokenizer: chat completions need one; use /v1/completions with token ids")
	}
	var logprobs *int
	if req.Logprobs {
		n := 0
		if req.TopLogprobs != nil {
			n = *req.TopLogprobs
		}
		logprobs = &n
	}
	params, e := s.samplingParams(&req.SamplingFields, logprobs)
	if e != nil {
		if e.param == "logprobs" {
			e.param = "top_logprobs"
			e.msg = strings.Replace(e.msg, "logprobs", "top_logprobs", 1)
		}
		return nil, e
	}
	msgs, e := parseMessages(req.Messages)
	if e != nil {
		return nil, e
	}
	opts := tokenizer.ChatOptions{AddGenerationPrompt: !req.ContinueFinalMessage}
	if req.AddGenerationPrompt != nil {
		opts.AddGenerationPrompt = *req.AddGenerationPrompt
	}
	if len(req.ChatTemplateKwargs) > 0 {
		opts.Vars = make(map[string]any, len(req.ChatTemplateKwargs))
		for k, v := range req.ChatTemplateKwargs {
			opts.Vars[k] = v
		}
	}
	text, err := s.tok.ApplyChatTemplateWith(msgs, opts)
	if err != nil {
		if errors.Is(err, tokenizer.ErrNoChatTemplate) {
			return nil, badRequest("messages", "the model's tokenizer has no chat template; use /v1/completions")
		}
		return nil, badRequest("messages", "chat template: %v", err)
	}
	if req.ContinueFinalMessage {
		last := strings.TrimSpace(msgs[len(msgs)-1].Content)
		i := strings.LastIndex(text, last)
		if last == "" || i < 0 {
			return nil, badRequest("continue_final_message", "continue_final_message: the final message's content is not in the rendered prompt")
		}
		text = text[:i+len(last)]
	}
	addSpecial := false
	if req.AddSpecialTokens != nil {
		addSpecial = *req.AddSpecialTokens
	}
	ids, e := s.tokenize(promptInput{text: text}, addSpecial, "messages")
	if e != nil {
		return nil, e
	}
	maxTokens := req.MaxCompletionTokens
	field := "max_completion_tokens"
	if maxTokens == nil {
		maxTokens, field = req.MaxTokens, "max_tokens"
	}
	if e := s.setMaxTokens(&params, maxTokens, -1, len(ids), field, "messages"); e != nil {
		return nil, e
	}
	return newRequests(id, [][]int{ids}, []engine.SamplingParams{params}, arrival), nil
}

// parseMessages reads chat messages: a role, a content (a string, null, or
// an array of text parts, joined with newlines) and any further fields,
// kept in order for the template.
func parseMessages(raw []ChatMessage) ([]tokenizer.Message, *apiError) {
	out := make([]tokenizer.Message, len(raw))
	for i, m := range raw {
		field := fmt.Sprintf("messages[%d]", i)
		dec := json.NewDecoder(bytes.NewReader(m))
		if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
			return nil, badRequest(field, "%s must be an object with a role and a content", field)
		}
		var extra bytes.Buffer
		var role *string
		for dec.More() {
			tok, err := dec.Token()
			if err != nil {
				return nil, badRequest(field, "%s: %v", field, err)
			}
			key, _ := tok.(string)
			var v json.RawMessage
			if err := dec.Decode(&v); err != nil {
				return nil, badRequest(field, "%s: %v", field, err)
			}
			switch key {
			case "role":
				var s string
				if json.Unmarshal(v, &s) != nil {
					return nil, badRequest(field+".role", "%s.role must be a string", field)
				}
				role = &s
			case "content":
				content, e := messageContent(v, field)
				if e != nil {
					return nil, e
				}
				out[i].Content = content
			default:
				if extra.Len() == 0 {
					extra.WriteByte('{')
				} else {
					extra.WriteByte(',')
				}
				k, _ := json.Marshal(key)
				extra.Write(k)
				extra.WriteByte(':')
				extra.Write(v)
			}
		}
		if role == nil || *role == "" {
			return nil, badRequest(field+".role", "%s needs a role", field)
		}
		out[i].Role = *role
		if extra.Len() > 0 {
			extra.WriteByte('}')
			out[i].Fields = json.RawMessage(extra.Bytes())
		}
	}
	return out, nil
}

// messageContent reads a message's content: a string, null, or an array
// of {"type": "text", "text": ...} parts.
func messageContent(v json.RawMessage, field string) (string, *apiError) {
	v = bytes.TrimSpace(v)
	switch {
	case string(v) == "null":
		return "", nil
	case len(v) > 0 && v[0] == '"':
		var s string
		if json.Unmarshal(v, &s) != nil {
			return "", badRequest(field+".content", "%s.content is not a valid string", field)
		}
		return s, nil
	case len(v) > 0 && v[0] == '[':
		var parts []struct {
			Type string  `json:"type"`
			Text *string `json:"text"`
		}
		if json.Unmarshal(v, &parts) != nil {
			return "", badRequest(field+".content", "%s.content must be a string or an array of content parts", field)
		}
		texts := make([]string, 0, len(parts))
		for j, p := range parts {
			if p.Type != "text" || p.Text == nil {
				return "", badRequest(field+".content", "%s.content[%d]: content part type %q is not supported (text only)", field, j, p.Type)
			}
			texts = append(texts, *p.Text)
		}
		return strings.Join(texts, "\n"), nil
	}
	return "", badRequest(field+".content", "%s.content must be a string or an array of content parts", field)
}
