package tokenizer

import "fmt"

// postProcessor adds the special tokens of a single sequence (BOS/EOS
// templates). Pairs are not supported: the engine encodes one text at a time.
type postProcessor interface {
	// process returns ids with the special tokens added; it may reuse ids.
	process(ids []int) []int
	// numAdded is how many ids process adds.
	numAdded() int
}

// templateProcessor is HF's TemplateProcessing for a single sequence: a list of
// special-token runs and the place of the sequence ($A) between them.
type templateProcessor struct {
	before, after []int
}

func (p *templateProcessor) numAdded() int { return len(p.before) + len(p.after) }

// process works in place when ids has room for the added tokens (Encode
// reserves it), else it allocates.
func (p *templateProcessor) process(ids []int) []int {
	n := len(ids)
	total := n + p.numAdded()
	var out []int
	if cap(ids) >= total {
		out = ids[:total]
	} else {
		out = make([]int, total)
	}
	copy(out[len(p.before):], ids) // copy moves overlapping ranges correctly
	copy(out, p.before)
	copy(out[len(p.before)+n:], p.after)
	return out
}

type sequenceProcessor []postProcessor

func (q sequenceProcessor) numAdded() int {
	n := 0
	for _, p := range q {
		n += p.numAdded()
	}
	return n
}

func (q sequenceProcessor) process(ids []int) []int {
	for _, p := range q {
		ids = p.process(ids)
	}
	return ids
}

// identityProcessor is the ByteLevel post-processor: it only trims offsets,
// which this package does not produce.
type identityProcessor struct{}

func (identityProcessor) numAdded() int           { return 0 }
func (identityProcessor) process(ids []int) []int { return ids }

func buildPostProcessor(c componentSpec) (postProcessor, error) {
	switch c.Type {
	case "ByteLevel":
		return identityProcessor{}, nil
	case "TemplateProcessing":
		p := &templateProcessor{}
		seen := false
		for i, item := range c.Single {
			switch {
			case item.Sequence != nil:
				if seen {
					return nil, fmt.Errorf("TemplateProcessing: single[%d]: second sequence", i)
				}
				seen = true
			case item.SpecialToken != nil:
				st, ok := c.SpecialTokens[item.SpecialToken.ID]
				if !ok {
					return nil, fmt.Errorf("TemplateProcessing: single[%d]: special token %q not in special_tokens", i, item.SpecialToken.ID)
				}
				if seen {
					p.after = append(p.after, st.IDs...)
				} else {
					p.before = append(p.before, st.IDs...)
				}
			default:
				return nil, fmt.Errorf("TemplateProcessing: single[%d]: neither Sequence nor SpecialToken", i)
			}
		}
		if !seen {
			return nil, fmt.Errorf("TemplateProcessing: single has no sequence")
		}
		return p, nil
	case "Sequence":
		var q sequenceProcessor
		for i, raw := range c.Processors {
			sub, ok, err := parseComponent(raw)
			if err != nil {
				return nil, fmt.Errorf("Sequence[%d]: %w", i, err)
			}
			if !ok {
				continue
			}
			p, err := buildPostProcessor(sub)
			if err != nil {
				return nil, fmt.Errorf("Sequence[%d]: %w", i, err)
			}
			q = append(q, p)
		}
		return q, nil
	}
	return nil, fmt.Errorf("%w: post-processor %q", ErrUnsupported, c.Type)
}
