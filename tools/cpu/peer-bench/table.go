package main

import (
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"

	"github.com/deepinfer/deepinfer-go/engine/gguf"
)

// runResult is one generate run of one side, as peer.mjs and the engine
// child print it.
type runResult struct {
	PromptIDs   []int32 `json:"prompt_ids"`
	IDs         []int32 `json:"ids"`
	PrefillTokS float64 `json:"prefill_tok_s"`
	DecodeTokS  float64 `json:"decode_tok_s"`
	// Backend names the SIMD path: the engine's backend name, or
	// llama.cpp's system info (the features of the CPU library it loaded).
	Backend string `json:"backend"`
	// Format is the engine's weight format (empty for llama.cpp).
	Format string `json:"format"`
	// ReadBps is the read bandwidth probed right before and right after
	// the run (their mean; set by the parent, not the child): the roofline
	// of this run's own window on a machine whose bandwidth drifts.
	ReadBps float64 `json:"-"`
}

// median is the middle value of xs (the mean of the two middle ones for an
// even count), 0 for none.
func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// decodeBytesPerToken is the weight bytes one decode step reads: every
// tensor once, except the token embedding, of which one row is read, unless
// no output.weight exists (tied embeddings: it is also the LM head).
func decodeBytesPerToken(tensors []gguf.TensorInfo) int64 {
	tied := !slices.ContainsFunc(tensors, func(t gguf.TensorInfo) bool { return t.Name == "output.weight" })
	var n int64
	for _, t := range tensors {
		if t.Name == "token_embd.weight" && !tied {
			rows := int64(1)
			if len(t.Dims) > 1 {
				rows = t.Dims[len(t.Dims)-1]
			}
			n += t.Size / max(rows, 1)
			continue
		}
		n += t.Size
	}
	return n
}

// rooflineShare is decode tok/s as a share of the rate at which the
// bandwidth bytesPerSec streams bytesPerToken once per token.
func rooflineShare(tokS float64, bytesPerToken int64, bytesPerSec float64) float64 {
	if bytesPerToken <= 0 || bytesPerSec <= 0 {
		return 0
	}
	return tokS / (bytesPerSec / float64(bytesPerToken))
}

// ratio is a/b, 0 when b is 0.
func ratio(a, b float64) float64 {
	if b == 0 {
		return 0
	}
	return a / b
}

// side is one engine's runs of one format.
type side struct {
	name string // "llama.cpp", "engine auto", "engine llama_cpp", ...
	acts string // the engine's cpu.activation_rounding; "" for llama.cpp
	runs []runResult
	// kvBytes is the K/V cache bytes a decode token reads on this side, on
	// average over the run (kvBytesPerToken at its cache's element size).
	kvBytes int64
}

// kvShape is what sizes a GQA model's K/V cache.
type kvShape struct {
	Layers  int `json:"num_hidden_layers"`
	KVHeads int `json:"num_key_value_heads"`
	HeadDim int `json:"head_dim"`
	Heads   int `json:"num_attention_heads"`
	Hidden  int `json:"hidden_size"`
}

// kvBytesPerToken is the K/V cache bytes one decode token reads on average
// over a run of gen tokens after a prompt of prompt tokens, at elem bytes a
// value: every layer's keys and values of the tokens before it (decode step
// j, making token j+1 of gen, attends prompt+j of them), prompt + gen/2 on
// average.
func kvBytesPerToken(m kvShape, prompt, gen, elem int) int64 {
	headDim := m.HeadDim
	if headDim == 0 && m.Heads > 0 {
		headDim = m.Hidden / m.Heads
	}
	kvHeads := m.KVHeads
	if kvHeads == 0 {
		kvHeads = m.Heads
	}
	perKey := int64(m.Layers) * 2 * int64(kvHeads) * int64(headDim) * int64(elem)
	return perKey * int64(2*prompt+gen) / 2
}

func (s *side) prefill() float64 {
	return median(collect(s.runs, func(r runResult) float64 { return r.PrefillTokS }))
}

func (s *side) decode() float64 {
	return median(collect(s.runs, func(r runResult) float64 { return r.DecodeTokS }))
}

// ownRoofShare is the median over the runs of each run's decode as a share
// of the read roofline its own probes measured (0 without probes).
func (s *side) ownRoofShare(bytesPerToken int64) float64 {
	return median(collect(s.runs, func(r runResult) float64 { return rooflineShare(r.DecodeTokS, bytesPerToken, r.ReadBps) }))
}

func collect(rs []runResult, f func(runResult) float64) []float64 {
	out := make([]float64, len(rs))
	for i, r := range rs {
		out[i] = f(r)
	}
	return out
}

// formatRuns is everything measured for one GGUF file.
type formatRuns struct {
	typ           string // preset: f32, bf16, q8_0, q4_k_m
	bytesPerToken int64
	peer          side
	engines       []side // one per -acts setting
}

// matched is the number of leading tokens a and b share.
func matched(a, b []int32) int {
	k := 0
	for k < len(a) && k < len(b) && a[k] == b[k] {
		k++
	}
	return k
}

// writeTable prints the per-format table: medians of the rounds, ratios
// engine/llama.cpp, decode as a share of the copy- and read-bandwidth
// rooflines of the whole benchmark (copyBW, readBW), the median of each
// run's share of the read roofline probed around it ("own read roof"),
// and the tokens both sides agreed on (first round).
func writeTable(w io.Writer, fs []formatRuns, copyBW, readBW float64, n int) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "format\tside\tprefill tok/s\tx llama.cpp\tdecode tok/s\tx llama.cpp\tdecode / copy roof\tdecode / read roof\t+ K/V\town read roof\tsame tokens\tweights\t")
	for _, f := range fs {
		rows := append([]side{f.peer}, f.engines...)
		for i, s := range rows {
			pre, dec := s.prefill(), s.decode()
			xp, xd, same, wf := "", "", "", ""
			if i > 0 {
				xp = fmt.Sprintf("%.2f", ratio(pre, f.peer.prefill()))
				xd = fmt.Sprintf("%.2f", ratio(dec, f.peer.decode()))
				if len(s.runs) > 0 && len(f.peer.runs) > 0 {
					same = fmt.Sprintf("%d/%d", matched(s.runs[0].IDs, f.peer.runs[0].IDs), n)
				}
				if len(s.runs) > 0 {
					wf = s.runs[0].Format
				}
			}
			fmt.Fprintf(tw, "%s\t%s\t%.1f\t%s\t%.2f\t%s\t%.0f%%\t%.0f%%\t%.0f%%\t%.0f%%\t%s\t%s\t\n", f.typ, s.name, pre, xp, dec, xd,
				100*rooflineShare(dec, f.bytesPerToken, copyBW), 100*rooflineShare(dec, f.bytesPerToken, readBW),
				100*rooflineShare(dec, f.bytesPerToken+s.kvBytes, readBW), 100*s.ownRoofShare(f.bytesPerToken), same, wf)
		}
	}
	tw.Flush()
}

// writeRoofs prints each format's weight bytes per decode token, the
// decode rates the measured bandwidths allow, and each side's K/V cache
// bytes per decode token (the "+ K/V" column of writeTable adds them).
func writeRoofs(w io.Writer, fs []formatRuns, copyBW, readBW float64) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "format\tMB read per decode token\troof tok/s (copy)\troof tok/s (read)\tK/V MB per decode token: llama.cpp\tengine\t")
	for _, f := range fs {
		mb := float64(f.bytesPerToken) / 1e6
		var eng int64
		if len(f.engines) > 0 {
			eng = f.engines[0].kvBytes
		}
		fmt.Fprintf(tw, "%s\t%.1f\t%.1f\t%.1f\t%.1f\t%.1f\t\n", f.typ, mb, copyBW/float64(f.bytesPerToken), readBW/float64(f.bytesPerToken),
			float64(f.peer.kvBytes)/1e6, float64(eng)/1e6)
	}
	tw.Flush()
}

// backends lists the distinct SIMD paths each side reported.
func backends(fs []formatRuns) map[string][]string {
	out := map[string][]string{}
	for _, f := range fs {
		for _, s := range append([]side{f.peer}, f.engines...) {
			name := s.name
			if strings.HasPrefix(name, "engine") {
				name = "engine"
			}
			for _, r := range s.runs {
				if r.Backend != "" && !slices.Contains(out[name], r.Backend) {
					out[name] = append(out[name], r.Backend)
				}
			}
		}
	}
	return out
}
