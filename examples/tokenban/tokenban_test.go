package tokenban_test

import (
	"fmt"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/deepinfer/deepinfer-go/engine"
	"github.com/deepinfer/deepinfer-go/examples/internal/exampletest"
	"github.com/deepinfer/deepinfer-go/examples/tokenban"
	"github.com/deepinfer/deepinfer-go/pipeline"
	"github.com/deepinfer/deepinfer-go/server/servertest"
)

// registry returns a clone of the default registry (the built-in stages)
// with the ban stage added: each test gets its own, and the process-wide
// registry is never changed.
func registry() *pipeline.Registry {
	reg := pipeline.DefaultRegistry().Clone()
	tokenban.Register(reg)
	return reg
}

// insert is the pipeline section that inserts the stage with options (a
// YAML flow mapping).
func insert(options string) string {
	return "{insert: [{after: forward, stage: ban-tokens, options: " + options + "}]}"
}

// idList writes ids as a YAML flow sequence.
func idList(ids []int) string {
	s := make([]string, len(ids))
	for i, id := range ids {
		s[i] = strconv.Itoa(id)
	}
	return "[" + strings.Join(s, ", ") + "]"
}

// used returns the distinct tokens of outputs, sorted.
func used(outputs [][]int) []int {
	var ids []int
	for _, o := range outputs {
		ids = append(ids, o...)
	}
	slices.Sort(ids)
	return slices.Compact(ids)
}

func TestOptionsValidate(t *testing.T) {
	tests := []struct {
		o       tokenban.Options
		wantErr string
	}{
		{tokenban.Options{}, ""},
		{tokenban.Options{IDs: []int{0, 5}, Strings: []string{"a"}}, ""},
		{tokenban.Options{IDs: []int{3, -1}}, "ids: -1 is negative"},
		{tokenban.Options{Strings: []string{"a", ""}}, "strings[1] is empty"},
	}
	for _, tc := range tests {
		err := tc.o.Validate()
		if tc.wantErr == "" && err != nil || tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)) {
			t.Errorf("%+v: Validate() = %v, want %q", tc.o, err, tc.wantErr)
		}
	}
}

// TestBuildErrors wants options that cannot fit the model refused when the
// engine is built, with the option at fault named.
func TestBuildErrors(t *testing.T) {
	reg := registry()
	dir := exampletest.Model(t)
	all := make([]int, servertest.Model.Vocab)
	for i := range all {
		all[i] = i
	}
	tests := []struct {
		name, options, wantErr string
	}{
		{"id outside", "{ids: [5, 128]}", "ids: 128 is outside the vocabulary [0, 128)"},
		{"unknown string", `{strings: ["e", "no such token"]}`, `strings: no token of the vocabulary is the text "no such token"`},
		{"everything", "{ids: " + idList(all) + "}", "ban all 128 tokens"},
		{"negative id", "{ids: [-2]}", "ids: -2 is negative"},
		{"unknown option", "{ids: [1], words: [a]}", "field words not found"},
		{"valid", `{ids: [5], strings: ["e", "the", "</s>"]}`, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := exampletest.StartErr(t, exampletest.Config(t, dir, insert(tc.options), false), reg)
			if tc.wantErr == "" && err != nil || tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)) {
				t.Errorf("build: %v, want %q", err, tc.wantErr)
			}
		})
	}
}

// TestSameAsNoBan runs requests without the stage and with it where it
// bans nothing that matters, zero-overhead scheduling off and on, and
// wants identical tokens. Why each case is an equivalence:
//   - empty lists: the stage passes each step on untouched;
//   - ids that greedy decoding never picked without the stage: at every
//     step the argmax was another token, and setting tokens that are not
//     the argmax to -Inf leaves the argmax (the float32 round trip of the
//     other logits through the host is exact), so by induction over the
//     steps every context and every token is the same.
func TestSameAsNoBan(t *testing.T) {
	reg := registry()
	dir := exampletest.Model(t)
	greedy, sampled := exampletest.Params(12, 0, 1), exampletest.Params(12, 1, 5)
	for _, zos := range []bool{false, true} {
		base := exampletest.Tokens(exampletest.Generate(t, exampletest.Config(t, dir, "", zos), reg, exampletest.Prompts(), greedy))
		var unused []int
		for id := range servertest.Model.Vocab {
			if !slices.Contains(used(base), id) {
				unused = append(unused, id)
			}
		}
		tests := []struct {
			name, pipeline string
			params         engine.SamplingParams
		}{
			{"empty lists, greedy", insert("{ids: [], strings: []}"), greedy},
			{"empty lists, sampled", insert("{}"), sampled},
			{"ids greedy never picks", insert("{ids: " + idList(unused) + "}"), greedy},
		}
		for _, tc := range tests {
			t.Run(fmt.Sprintf("zos=%v/%s", zos, tc.name), func(t *testing.T) {
				want := exampletest.Tokens(exampletest.Generate(t, exampletest.Config(t, dir, "", zos), reg, exampletest.Prompts(), tc.params))
				got := exampletest.Tokens(exampletest.Generate(t, exampletest.Config(t, dir, tc.pipeline, zos), reg, exampletest.Prompts(), tc.params))
				if !reflect.DeepEqual(got, want) {
					t.Errorf("tokens with the stage %v, without %v", got, want)
				}
			})
		}
	}
}

// TestBanActs bans the tokens a run without the stage generated and wants
// none of them back, greedy and sampled, zero-overhead scheduling off and
// on; banning by strings (each a token's text: in this vocabulary a text
// belongs to one token) must generate what banning the same ids does.
func TestBanActs(t *testing.T) {
	reg := registry()
	dir := exampletest.Model(t)
	text := map[int]string{}
	for s, id := range servertest.Vocab() {
		text[id] = s
	}
	for _, zos := range []bool{false, true} {
		for _, params := range []engine.SamplingParams{exampletest.Params(12, 0, 1), exampletest.Params(12, 1, 5)} {
			t.Run(fmt.Sprintf("zos=%v/temperature=%g", zos, params.Temperature), func(t *testing.T) {
				run := func(pipeline string) [][]int {
					return exampletest.Tokens(exampletest.Generate(t, exampletest.Config(t, dir, pipeline, zos), reg, exampletest.Prompts(), params))
				}
				before := run("")
				banned := used(before)
				after := run(insert("{ids: " + idList(banned) + "}"))
				for i, o := range after {
					if len(o) != params.MaxTokens {
						t.Errorf("output %d: %d tokens, want %d", i, len(o), params.MaxTokens)
					}
					for _, id := range o {
						if slices.Contains(banned, id) {
							t.Errorf("output %d: banned token %d generated: %v", i, id, o)
						}
					}
				}
				quoted := make([]string, len(banned))
				for i, id := range banned {
					quoted[i] = strconv.Quote(text[id])
				}
				if byText := run(insert("{strings: [" + strings.Join(quoted, ", ") + "]}")); !reflect.DeepEqual(byText, after) {
					t.Errorf("banning by strings %v generates %v, by ids %v", quoted, byText, after)
				}
			})
		}
	}
}

// TestCommandLine runs the command line of cmd/tokenban on the example's
// config: the graph shows the inserted stage, and generate runs it: the
// shipped model's greedy continuation of the prompt opens with "if"
// without the stage and not with it.
func TestCommandLine(t *testing.T) {
	reg := registry()
	out := exampletest.Command(t, reg, "graph", "--config", "config.yaml")
	if !strings.Contains(out, "ban-tokens=default") {
		t.Errorf("graph lacks the stage:\n%s", out)
	}
	prompt := "func main() {"
	plain := exampletest.Command(t, reg, "generate", "--config", filepath.Join("..", "..", "configs", "default.yaml"), "-n", "4", "-p", prompt)
	banned := exampletest.Command(t, reg, "generate", "--config", "config.yaml", "-n", "4", "-p", prompt)
	if !strings.HasPrefix(plain, prompt+"\n\tif") {
		t.Fatalf("without the stage the model no longer opens with if, the check below shows nothing:\n%s", plain)
	}
	if !strings.HasPrefix(banned, prompt) || strings.HasPrefix(banned, prompt+"\n\tif") || !strings.Contains(banned, "stats: ") {
		t.Errorf("generate with the stage:\n%s", banned)
	}
}
