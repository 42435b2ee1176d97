package server

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode"

	"github.com/deepinfer/deepinfer-go/engine"
	"github.com/deepinfer/deepinfer-go/engine/tokenizer"
)

// handleChat serves POST /v1/chat/completions.
func (s *Server) handleChat(w http.ResponseWriter, r *http.Request) {
	arrival := time.Now()
	defer s.memory.afterRequest(r.ContentLength)
	var req ChatCompletionRequest
	if e := decodeRequest(w, r, s.opts.MaxBodyBytes, &req); e != nil {
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
			content, calls := parseToolAnswer(rq.tools, string(c.text), newToolCallID)
			ch := ChatChoice{
				Index: i, Message: ChatResponseMessage{Role: "assistant", Content: content, ToolCalls: calls},
				FinishReason: toolFinishReason(c.finishReason, len(calls) > 0), StopReason: stopReason(c, &rq.params),
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
	answers := make([]chatStreamState, rq.params.N)
	for i := range answers {
		answers[i].parser = newToolParser(rq.tools, newToolCallID)
	}
	s.stream(w, r, g, req.StreamOptions, streamHooks{
		start: func(sw *sseWriter) {
			empty := ""
			for i := range rq.params.N {
				sw.event(chunk([]ChatChunkChoice{{Index: i, Delta: ChatDelta{Role: "assistant", Content: &empty}}}, nil))
			}
		},
		output: func(sw *sseWriter, _ *request, c *choiceState, o *engine.RequestOutput, u *Usage) {
			a := &answers[o.Index]
			d := a.next(o.Text, o.Finished)
			if d.content == "" && len(d.calls) == 0 && !o.Finished && len(o.Logprobs) == 0 {
				return
			}
			ch := ChatChunkChoice{Index: o.Index, Delta: ChatDelta{ToolCalls: d.calls}}
			if d.content != "" {
				ch.Delta.Content = &d.content
			}
			if req.Logprobs {
				ch.Logprobs = s.chatLogprobs(o.Logprobs, asIDs)
			}
			if o.Finished {
				ch.FinishReason, ch.StopReason = toolFinishReason(c.finishReason, a.called), stopReason(c, &rq.params)
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
	switch {
	case len(req.Messages) == 0:
		return nil, badRequest("messages", "messages must be a non-empty array")
	case req.Echo:
		return nil, badRequest("echo", "echo is not supported")
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
	params, c, e := s.samplingParams(&req.SamplingFields, logprobs)
	if e != nil {
		if e.param == "logprobs" {
			e.param = "top_logprobs"
			e.msg = strings.Replace(e.msg, "logprobs", "top_logprobs", 1)
		}
		return nil, e
	}
	tools, e := parseTools(req)
	if e != nil {
		return nil, e
	}
	if c, e = withToolConstraint(c, tools); e != nil {
		return nil, e
	}
	if c != nil {
		params.StructuredOutput = c.so
	}
	msgs, e := parseMessages(req.Messages)
	if e != nil {
		return nil, e
	}
	if e := checkRoles(msgs, s.tok.Config()); e != nil {
		return nil, e
	}
	if msgs, e = prepareChat(msgs, s.tok.Config().ChatTemplate, tools); e != nil {
		return nil, e
	}
	// The messages' text alone may prove the prompt too long: refuse it
	// before the template renders it.
	textBytes := 0
	for _, m := range msgs {
		textBytes += len(m.Content) + len(m.Fields)
	}
	textBytes += len(tools.raw)
	if e := s.checkPromptBytes(textBytes, "messages", "the text of your messages"); e != nil {
		return nil, e
	}
	opts := tokenizer.ChatOptions{AddGenerationPrompt: !req.ContinueFinalMessage, Tools: tools.raw}
	if req.AddGenerationPrompt != nil {
		opts.AddGenerationPrompt = *req.AddGenerationPrompt
	}
	if len(req.ChatTemplateKwargs) > 0 {
		opts.Vars = make(map[string]any, len(req.ChatTemplateKwargs))
		for _, k := range slices.Sorted(maps.Keys(req.ChatTemplateKwargs)) {
			if slices.Contains(reservedTemplateVars, k) {
				// transformers refuses these too (a keyword given twice).
				return nil, badRequest("chat_template_kwargs", "chat_template_kwargs: %q is set by the server (from the request's own fields) and cannot be overridden", k)
			}
			opts.Vars[k] = req.ChatTemplateKwargs[k]
		}
	}
	addSpecial := false
	if req.AddSpecialTokens != nil {
		addSpecial = *req.AddSpecialTokens
	}
	ids, e := s.chatPromptIDs(msgs, opts, req.ContinueFinalMessage, addSpecial)
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
	reqs := newRequests(id, [][]int{ids}, []engine.SamplingParams{params}, arrival)
	reqs[0].tools = tools
	if c != nil {
		reqs[0].constraintField = c.field
	}
	return reqs, nil
}

// withToolConstraint adds the constraint of tools' mode to c, the one the
// sampling fields set; both at once answer 400.
func withToolConstraint(c *constraint, tools *toolConfig) (*constraint, *apiError) {
	tc, e := tools.constraint()
	switch {
	case e != nil:
		return nil, e
	case tc == nil:
		return c, nil
	case c != nil:
		choice := `"required"`
		if tools.mode == toolsNamed {
			choice = fmt.Sprintf("naming the function %q", tools.named)
		}
		return nil, badRequest("tool_choice", "tool_choice %s constrains the output, so %s cannot be set with it", choice, c.field)
	}
	return tc, nil
}

// chatStreamState is a streamed choice's tool-call parsing.
type chatStreamState struct {
	parser toolParser // nil: the text is the content
	called bool       // a tool call has been sent
}

// next is what the output text adds to the choice; finished gives out
// what the parser held back.
func (a *chatStreamState) next(text string, finished bool) toolDelta {
	if a.parser == nil {
		return toolDelta{content: text}
	}
	d := a.parser.feed(text)
	if finished {
		f := a.parser.finish()
		d.content += f.content
		d.calls = append(d.calls, f.calls...)
	}
	a.called = a.called || len(d.calls) > 0
	return d
}

// toolFinishReason is the finish_reason of a choice: "tool_calls" when it
// called tools and stopped by itself, the engine's reason otherwise.
func toolFinishReason(r engine.FinishReason, called bool) *string {
	fr := finishReasonOf(r)
	if called && fr != nil && *fr == "stop" {
		s := "tool_calls"
		return &s
	}
	return fr
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
		s, ok := jsonString(v)
		if !ok {
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

// reservedTemplateVars are the chat template's variables that come from
// the request's own fields; chat_template_kwargs may not set them.
var reservedTemplateVars = []string{"messages", "add_generation_prompt", "tools", "documents"}

// baseRoles are the roles every chat request may use; a template may
// name more (checkRoles reads them from its comparisons).
var baseRoles = []string{"system", "user", "assistant", "tool"}

// templateRoleRes find the roles a chat template compares a message's
// role with: role == 'x', role != "x", and role in ['x', 'y'].
var templateRoleRes = struct{ eq, in, quoted *regexp.Regexp }{
	eq:     regexp.MustCompile(`role['"]?\]?\s*(?:==|!=)\s*['"]([^'"]+)['"]`),
	in:     regexp.MustCompile(`role['"]?\]?\s*(?:not\s+)?in\s*[\[(]([^\])]*)[\])]`),
	quoted: regexp.MustCompile(`['"]([^'"]+)['"]`),
}

// checkRoles refuses a message whose role is neither one of baseRoles nor
// one the chat templates of cfg compare against: a role the template does
// not know is rendered wrongly or silently dropped. Cost: nothing for the
// base roles; a scan of the templates' source for a request with another.
func checkRoles(msgs []tokenizer.Message, cfg tokenizer.Config) *apiError {
	var known []string
	for i, m := range msgs {
		if slices.Contains(baseRoles, m.Role) {
			continue
		}
		if known == nil {
			known = templateRoles(cfg)
		}
		if !slices.Contains(known, m.Role) {
			field := fmt.Sprintf("messages[%d].role", i)
			return badRequest(field, "%s: role %q is not supported; use one of %s", field, m.Role, strings.Join(known, ", "))
		}
	}
	return nil
}

// templateRoles is baseRoles and the roles cfg's chat templates name.
func templateRoles(cfg tokenizer.Config) []string {
	roles := slices.Clone(baseRoles)
	add := func(r string) {
		if r != "" && !slices.Contains(roles, r) {
			roles = append(roles, r)
		}
	}
	srcs := []string{cfg.ChatTemplate}
	for _, name := range slices.Sorted(maps.Keys(cfg.ChatTemplates)) {
		srcs = append(srcs, cfg.ChatTemplates[name])
	}
	for _, src := range srcs {
		for _, m := range templateRoleRes.eq.FindAllStringSubmatch(src, -1) {
			add(m[1])
		}
		for _, m := range templateRoleRes.in.FindAllStringSubmatch(src, -1) {
			for _, q := range templateRoleRes.quoted.FindAllStringSubmatch(m[1], -1) {
				add(q[1])
			}
		}
	}
	return roles
}

// chatPromptIDs renders msgs with the chat template and encodes the
// result. With chat.parse_special_tokens_in_content off (the default),
// message contents are encoded as plain text and only the template's own
// text may yield special tokens: the template is rendered with each
// non-empty content replaced by a random sentinel, the rendering is split
// at the sentinels, template parts are encoded normally and contents with
// Tokenizer.EncodePlain. When that split cannot reproduce the template's
// own rendering (a template that rewrites contents beyond trimming them)
// the rendering is encoded whole, as with the switch on.
//
// continueFinal leaves the last message open: the prompt ends right after
// its content (trailing whitespace dropped). The prompt's bytes are
// checked against max_model_len before any encoding, and template parts
// are encoded within the remaining token budget. Cost: two renderings of
// the template and one encoding of the prompt.
func (s *Server) chatPromptIDs(msgs []tokenizer.Message, opts tokenizer.ChatOptions, continueFinal, addSpecial bool) ([]int, *apiError) {
	text, e := s.renderChat(msgs, opts)
	if e != nil {
		return nil, e
	}
	if e := s.checkPromptBytes(len(text), "messages", "your rendered prompt"); e != nil {
		return nil, e
	}
	var segs []chatSegment
	if !s.eng.Config().Chat.ParseSpecialTokensInContent {
		if segs, e = s.splitChat(msgs, opts, text); e != nil {
			return nil, e
		}
	}
	if segs == nil { // special tokens recognized everywhere: one template part
		segs = []chatSegment{{text: text, message: -1}}
	}
	if continueFinal {
		var ok bool
		if segs, ok = cutAfterFinal(segs, msgs); !ok {
			return nil, badRequest("continue_final_message", "continue_final_message: the final message's content is not in the rendered prompt")
		}
	}
	return s.encodeSegments(segs, addSpecial)
}

// chatSegment is a piece of a rendered chat prompt: template text
// (message < 0) or the content of message number message.
type chatSegment struct {
	text    string
	message int
}

// renderChat renders msgs with the chat template.
func (s *Server) renderChat(msgs []tokenizer.Message, opts tokenizer.ChatOptions) (string, *apiError) {
	text, err := s.tok.ApplyChatTemplateWith(msgs, opts)
	if err != nil {
		if errors.Is(err, tokenizer.ErrNoChatTemplate) {
			return "", badRequest("messages", "the model's tokenizer has no chat template; use /v1/completions")
		}
		return "", badRequest("messages", "chat template: %v", err)
	}
	return text, nil
}

// sentinelPad surrounds each sentinel: whether it survives tells whether
// the template trims the content on either side.
const sentinelPad = " \n"

// splitChat renders msgs with each non-empty content replaced by a random
// sentinel and splits the rendering into template parts and contents
// (trimmed where the template trims them). It returns nil, without error,
// when the parts and contents do not add up to want, the rendering with
// the real contents.
func (s *Server) splitChat(msgs []tokenizer.Message, opts tokenizer.ChatOptions, want string) ([]chatSegment, *apiError) {
	var nonce [16]byte
	rand.Read(nonce[:])
	prefix := "chatcontent_" + hex.EncodeToString(nonce[:]) + "_"
	masked := slices.Clone(msgs)
	for i := range masked {
		if masked[i].Content != "" {
			masked[i].Content = sentinelPad + prefix + strconv.Itoa(i) + "_" + sentinelPad
		}
	}
	text, e := s.renderChat(masked, opts)
	if e != nil {
		return nil, e
	}
	var segs []chatSegment
	for {
		i := strings.Index(text, prefix)
		if i < 0 {
			segs = append(segs, chatSegment{text: text, message: -1})
			break
		}
		rest := text[i+len(prefix):]
		j := strings.IndexByte(rest, '_')
		n, err := strconv.Atoi(rest[:max(j, 0)])
		if j < 0 || err != nil || n < 0 || n >= len(msgs) {
			return nil, nil // mangled by the template
		}
		before, after := text[:i], rest[j+1:]
		content := msgs[n].Content
		if b, ok := strings.CutSuffix(before, sentinelPad); ok {
			before = b
		} else {
			content = strings.TrimLeftFunc(content, unicode.IsSpace)
		}
		if a, ok := strings.CutPrefix(after, sentinelPad); ok {
			after = a
		} else {
			content = strings.TrimRightFunc(content, unicode.IsSpace)
		}
		segs = append(segs, chatSegment{text: before, message: -1}, chatSegment{text: content, message: n})
		text = after
	}
	var b strings.Builder
	for _, sg := range segs {
		b.WriteString(sg.text)
	}
	if b.String() != want {
		s.log.Debug("chat template rewrites message contents: contents are tokenized with the template")
		return nil, nil
	}
	return segs, nil
}

// cutAfterFinal keeps segs up to the end of the last message's content,
// its trailing whitespace dropped (the turn stays open); ok is false when
// that content is empty or not in the prompt. With a single template part
// (contents not split out) the content is looked up in its text.
func cutAfterFinal(segs []chatSegment, msgs []tokenizer.Message) (out []chatSegment, ok bool) {
	last := len(msgs) - 1
	want := strings.TrimSpace(msgs[last].Content)
	if want == "" {
		return nil, false
	}
	for i := len(segs) - 1; i >= 0; i-- {
		sg := segs[i]
		if sg.message == last {
			out = slices.Clone(segs[:i+1])
			out[i].text = strings.TrimRightFunc(sg.text, unicode.IsSpace)
			return out, true
		}
		if sg.message < 0 && len(segs) == 1 {
			j := strings.LastIndex(sg.text, want)
			if j < 0 {
				return nil, false
			}
			return []chatSegment{{text: sg.text[:j+len(want)], message: -1}}, true
		}
	}
	return nil, false
}

// encodeSegments encodes template parts with special tokens recognized and
// contents as plain text, within max_model_len tokens; addSpecial adds the
// tokenizer's BOS/EOS template around the whole.
func (s *Server) encodeSegments(segs []chatSegment, addSpecial bool) ([]int, *apiError) {
	var pre, post []int
	if addSpecial {
		var ok bool
		if pre, post, ok = s.specialAffixes(); !ok {
			// Not separable: encode as one text, as before.
			var b strings.Builder
			for _, sg := range segs {
				b.WriteString(sg.text)
			}
			return s.tokenize(promptInput{text: b.String()}, true, "messages")
		}
	}
	ids := slices.Clone(pre)
	for _, sg := range segs {
		if sg.text == "" {
			continue
		}
		if sg.message >= 0 {
			ids = append(ids, s.tok.EncodePlain(sg.text)...)
		} else {
			room := s.maxModelLen - len(ids)
			if room < 1 { // EncodeWithBudget reads a budget of 0 as none
				return nil, promptTooLongTokens("messages", s.maxModelLen)
			}
			part, e := s.encodeBounded(sg.text, false, room, "messages")
			if e != nil {
				return nil, e
			}
			ids = append(ids, part...)
		}
		if len(ids) > s.maxModelLen {
			return nil, promptTooLongTokens("messages", s.maxModelLen)
		}
	}
	ids = append(ids, post...)
	return s.checkIDs(ids, "messages")
}

// specialAffixes are the ids the tokenizer's post-processor puts before
// and after a text when special tokens are added; ok is false when they
// cannot be told apart from the text's own ids.
func (s *Server) specialAffixes() (pre, post []int, ok bool) {
	const probe = "a"
	plain, full := s.tok.Encode(probe, false), s.tok.Encode(probe, true)
	for k := 0; k+len(plain) <= len(full); k++ {
		if slices.Equal(full[k:k+len(plain)], plain) {
			return full[:k], full[k+len(plain):], len(plain) > 0
		}
	}
	return nil, nil, false
}
