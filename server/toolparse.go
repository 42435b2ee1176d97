package server

import (
	"encoding/json"
	"strings"
	"unicode"
)

// toolDelta is what a piece of generated text adds to a choice's answer:
// content text and tool-call deltas (see ToolCall).
type toolDelta struct {
	content string
	calls   []ToolCall
}

// toolParser turns a choice's generated text, fed piece by piece, into
// content and tool calls. Feeding the whole text at once and feeding it
// in pieces give the same content and calls.
type toolParser interface {
	// feed adds the next piece of text.
	feed(text string) toolDelta
	// finish ends the text: what was held back is given out.
	finish() toolDelta
}

// newToolParser returns the parser of cfg's mode, or nil for "none" (and
// a nil cfg). newID makes the calls' ids.
func newToolParser(cfg *toolConfig, newID func() string) toolParser {
	if cfg == nil {
		return nil
	}
	switch cfg.mode {
	case toolsAuto:
		return &hermesParser{single: !cfg.parallel, newID: newID}
	case toolsRequired:
		return &arrayParser{start: -1, single: !cfg.parallel, newID: newID}
	case toolsNamed:
		return &namedParser{name: cfg.named, newID: newID}
	}
	return nil
}

// newToolCallID is a tool call's id, as vLLM spells them.
func newToolCallID() string { return newID("chatcmpl-tool-") }

// callDelta is a tool-call delta: the first of a call has its id (then
// also its type and name), later ones only arguments.
func callDelta(index int, id, name, args string) ToolCall {
	c := ToolCall{Index: &index, ID: id, Function: ToolCallFunction{Name: name, Arguments: args}}
	if id != "" {
		c.Type = "function"
	}
	return c
}

// mergeDeltas adds d's calls to calls: a delta with an id starts a call,
// one without appends its arguments to the call of its index. The result's
// calls have no index (the message form).
func mergeDeltas(calls []ToolCall, d []ToolCall) []ToolCall {
	for _, c := range d {
		if c.ID != "" {
			c.Index = nil
			calls = append(calls, c)
			continue
		}
		if i := *c.Index; i < len(calls) {
			calls[i].Function.Arguments += c.Function.Arguments
		}
	}
	return calls
}

// parseToolAnswer runs the whole text of a choice through a parser of cfg:
// the message's content (nil when there are calls and no other text) and
// calls. With mode "none" the text is the content.
func parseToolAnswer(cfg *toolConfig, text string, newID func() string) (content *string, calls []ToolCall) {
	p := newToolParser(cfg, newID)
	if p == nil {
		return &text, nil
	}
	var b strings.Builder
	for _, d := range []toolDelta{p.feed(text), p.finish()} {
		b.WriteString(d.content)
		calls = mergeDeltas(calls, d.calls)
	}
	s := b.String()
	if len(calls) > 0 && s == "" {
		return nil, calls
	}
	return &s, calls
}

// trimmer passes text on without its leading and trailing whitespace:
// whitespace is held back until more text follows it. The pieces it
// returns add up to strings.TrimSpace of what it was given.
type trimmer struct {
	started bool
	held    string
}

// push adds s and returns what can be given out.
func (t *trimmer) push(s string) string {
	s = t.held + s
	if !t.started {
		s = strings.TrimLeftFunc(s, unicode.IsSpace)
	}
	body := strings.TrimRightFunc(s, unicode.IsSpace)
	t.held = s[len(body):]
	if body != "" {
		t.started = true
	}
	return body
}

// blockText gives out the text around tool-call blocks: verbatim, but
// for the whitespace next to a block (the whitespace between two pieces of
// text separated by blocks is kept once). Trailing whitespace is held
// until it is known whether a block follows it.
type blockText struct {
	held       string // trailing whitespace not given out
	started    bool   // some text has been given out
	afterBlock bool   // a block came after the last text
}

// push adds text outside blocks and returns what can be given out.
func (b *blockText) push(s string) string {
	if b.afterBlock {
		if s = strings.TrimLeftFunc(s, unicode.IsSpace); s == "" {
			return ""
		}
		b.afterBlock = false
	}
	s = b.held + s
	body := strings.TrimRightFunc(s, unicode.IsSpace)
	b.held = s[len(body):]
	b.started = b.started || body != ""
	return body
}

// block notes a block: the whitespace held before it separates it from
// later text, or goes when no text came before it.
func (b *blockText) block() {
	b.afterBlock = true
	if !b.started {
		b.held = ""
	}
}

// flush ends the text: the held whitespace, unless a block came last.
func (b *blockText) flush() string {
	s := b.held
	b.held = ""
	if b.afterBlock {
		return ""
	}
	return s
}

// hermesParser reads the Hermes format of tool_choice "auto": each
// <tool_call>{"name": ..., "arguments": {...}}</tool_call> block is a
// call (a last block left open counts too); the text outside the blocks
// is content (see blockText: without calls, the text as generated), and
// so is a block that does not parse. A partial "<tool_call>" at the end
// of the text so far is held back.
type hermesParser struct {
	buf     string // text not yet given out
	inCall  bool   // buf is inside a block
	content blockText
	calls   int
	single  bool // only the first call counts
	newID   func() string
}

func (p *hermesParser) feed(text string) toolDelta {
	p.buf += text
	var d toolDelta
	for {
		if !p.inCall {
			i := strings.Index(p.buf, toolCallOpen)
			if i < 0 {
				keep := partialSuffix(p.buf, toolCallOpen)
				d.content += p.content.push(p.buf[:len(p.buf)-keep])
				p.buf = p.buf[len(p.buf)-keep:]
				return d
			}
			d.content += p.content.push(p.buf[:i])
			p.buf, p.inCall = p.buf[i+len(toolCallOpen):], true
		}
		j := strings.Index(p.buf, toolCallClose)
		if j < 0 {
			return d
		}
		p.block(&d, p.buf[:j], toolCallClose)
		p.buf, p.inCall = p.buf[j+len(toolCallClose):], false
	}
}

func (p *hermesParser) finish() toolDelta {
	var d toolDelta
	if p.inCall {
		p.block(&d, p.buf, "")
	} else {
		d.content += p.content.push(p.buf)
	}
	d.content += p.content.flush()
	p.buf, p.inCall = "", false
	return d
}

// block adds the block with body to d: a call, or content (the block as
// written, closed by end) when body is not a call.
func (p *hermesParser) block(d *toolDelta, body, end string) {
	name, args, ok := readCall(body, "arguments")
	if !ok {
		d.content += p.content.push(toolCallOpen + body + end)
		return
	}
	p.content.block()
	if p.single && p.calls > 0 {
		return
	}
	d.calls = append(d.calls, callDelta(p.calls, p.newID(), name, args))
	p.calls++
}

// readCall reads a call object {"name": ..., argsKey: ...}: the name and
// the arguments as compact JSON text (an arguments string is taken as
// written; missing arguments are "{}"). The other of "arguments" and
// "parameters" is accepted too.
func readCall(text, argsKey string) (name, args string, ok bool) {
	obj, err := parseObject(json.RawMessage(strings.TrimSpace(text)))
	if err != nil || json.Unmarshal(obj.get("name"), &name) != nil || name == "" {
		return "", "", false
	}
	raw := obj.get(argsKey)
	if raw == nil {
		raw = obj.get(map[string]string{"arguments": "parameters", "parameters": "arguments"}[argsKey])
	}
	switch kind := jsonKindOf(raw); {
	case raw == nil || kind == "null":
		return name, "{}", true
	case kind == "a string":
		err = json.Unmarshal(raw, &args)
	default:
		args, err = compactJSON(raw)
	}
	return name, args, err == nil
}

// partialSuffix is the length of the longest suffix of s that is a proper
// prefix of tag.
func partialSuffix(s, tag string) int {
	for n := min(len(s), len(tag)-1); n > 0; n-- {
		if strings.HasSuffix(s, tag[:n]) {
			return n
		}
	}
	return 0
}

// arrayParser reads the output of tool_choice "required": a JSON array of
// {"name": ..., "parameters": {...}} objects. Each element is a call as
// soon as it is complete. When the text holds no call at all (it does not
// parse, or ends before the first element does), the whole text, trimmed,
// is content.
type arrayParser struct {
	text     strings.Builder
	scanned  int  // bytes of text scanned
	depth    int  // nesting of arrays and objects at scanned
	inString bool // scanned is inside a string
	escaped  bool // the byte before scanned is an escaping backslash
	start    int  // offset of the element being read; -1 when none
	failed   bool // an element did not parse: stop reading
	calls    int
	single   bool // only the first call counts
	newID    func() string
}

func (p *arrayParser) feed(text string) toolDelta {
	p.text.WriteString(text)
	var d toolDelta
	all := p.text.String()
	for ; p.scanned < len(all) && !p.failed; p.scanned++ {
		c := all[p.scanned]
		switch {
		case p.inString:
			switch {
			case p.escaped:
				p.escaped = false
			case c == '\\':
				p.escaped = true
			case c == '"':
				p.inString = false
			}
		case c == '"':
			p.inString = true
		case c == '[' || c == '{':
			if p.depth == 1 {
				p.start = p.scanned
			}
			p.depth++
		case c == ']' || c == '}':
			p.depth--
			if p.depth == 1 && p.start >= 0 {
				p.element(&d, all[p.start:p.scanned+1])
				p.start = -1
			}
		}
	}
	return d
}

// element adds the array element text to d as a call.
func (p *arrayParser) element(d *toolDelta, text string) {
	name, args, ok := readCall(text, "parameters")
	if !ok {
		p.failed = true
		return
	}
	if p.single && p.calls > 0 {
		return
	}
	d.calls = append(d.calls, callDelta(p.calls, p.newID(), name, args))
	p.calls++
}

func (p *arrayParser) finish() toolDelta {
	if p.calls > 0 {
		return toolDelta{}
	}
	return toolDelta{content: strings.TrimSpace(p.text.String())}
}

// namedParser reads the output of a named tool_choice: the whole text,
// trimmed, is the arguments of one call of that function, given out as it
// comes.
type namedParser struct {
	name    string
	args    trimmer
	started bool
	newID   func() string
}

func (p *namedParser) feed(text string) toolDelta {
	args := p.args.push(text)
	if args == "" {
		return toolDelta{}
	}
	return toolDelta{calls: []ToolCall{p.delta(args)}}
}

func (p *namedParser) finish() toolDelta {
	if p.started {
		return toolDelta{}
	}
	return toolDelta{calls: []ToolCall{p.delta("")}}
}

// delta is the call's next arguments; the first delta opens the call.
func (p *namedParser) delta(args string) ToolCall {
	if p.started {
		return callDelta(0, "", "", args)
	}
	p.started = true
	return callDelta(0, p.newID(), p.name, args)
}
