package llm

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"strings"
	"testing"

	"github.com/deepinfer/deepinfer-go/engine/config"
	"github.com/deepinfer/deepinfer-go/pipeline"
)

func TestSpec(t *testing.T) {
	tests := []struct {
		name      string
		yaml      string
		wantNodes string
		wantLoop  string
		// wantTokens is the stage whose output feeds the next step's
		// forward pass (the lagged edge to forward); "" means sample.
		wantTokens string
		wantErr    string
	}{
		{
			name:      "default",
			yaml:      "model: m\n",
			wantNodes: "requests tokenize schedule prepare forward sample postprocess",
			wantLoop:  "postprocess->schedule in flight 1",
		},
		{
			name:      "zos doubles the loop",
			yaml:      "model: m\nzos: {enabled: true}\n",
			wantNodes: "requests tokenize schedule prepare forward sample postprocess",
			wantLoop:  "postprocess->schedule in flight 2",
		},
		{
			name:       "speculation adds draft and verify",
			yaml:       "model: m\nspeculative: {method: ngram}\n",
			wantNodes:  "requests tokenize schedule prepare forward sample verify draft=ngram postprocess",
			wantLoop:   "postprocess->schedule in flight 1",
			wantTokens: "draft",
		},
		{
			name:      "method none is off",
			yaml:      "model: m\nspeculative: {method: none}\n",
			wantNodes: "requests tokenize schedule prepare forward sample postprocess",
			wantLoop:  "postprocess->schedule in flight 1",
		},
		{
			name:      "swap and insert from YAML",
			yaml:      "model: m\npipeline:\n  sample: my-sampler\n  insert:\n    - {after: forward, stage: logit-softcap}\n",
			wantNodes: "requests tokenize schedule prepare forward logit-softcap sample=my-sampler postprocess",
			wantLoop:  "postprocess->schedule in flight 1",
		},
		{
			name:      "cuda graphs stay out of the stage options",
			yaml:      "model: m\ndevice: cuda\ncuda_graph: {enabled: true, batch_sizes: [1, 4]}\n",
			wantNodes: "requests tokenize schedule prepare forward sample postprocess",
			wantLoop:  "postprocess->schedule in flight 1",
		},
		{
			name:    "a misspelt slot",
			yaml:    "model: m\npipeline:\n  sampel: my-sampler\n",
			wantErr: `slot "sampel" is not a slot of this pipeline (did you mean "sample"?)`,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg, err := config.Parse("test.yaml", []byte(tc.yaml))
			if err != nil {
				t.Fatal(err)
			}
			spec, err := Spec(cfg)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("Spec = %v, want error %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var nodes []string
			for _, n := range spec.Nodes {
				s := n.Name
				if n.Impl != "" {
					s += "=" + n.Impl
				}
				nodes = append(nodes, s)
			}
			if got := strings.Join(nodes, " "); got != tc.wantNodes {
				t.Errorf("nodes = %s\nwant    %s", got, tc.wantNodes)
			}
			var loops []string
			for _, e := range spec.Edges {
				if e.Feedback {
					loops = append(loops, fmt.Sprintf("%s->%s in flight %d", e.From, e.To, e.MaxInFlight))
				}
			}
			if !reflect.DeepEqual(loops, []string{tc.wantLoop}) {
				t.Errorf("loops = %v, want %s", loops, tc.wantLoop)
			}
			// The two orderings of the step loop are edges of the graph,
			// whatever is inserted and whatever the ZOS depth.
			var lagged []string
			for _, e := range spec.Edges {
				if e.Lag > 0 {
					lagged = append(lagged, fmt.Sprintf("%s->%s lag %d", e.From, e.To, e.Lag))
				}
			}
			tokens := tc.wantTokens
			if tokens == "" {
				tokens = "sample"
			}
			if want := []string{tokens + "->forward lag 1", "postprocess->sample lag 1"}; !reflect.DeepEqual(lagged, want) {
				t.Errorf("lagged edges = %v, want %v", lagged, want)
			}
			// Stage options never carry the top-level cuda_graph section:
			// it reaches the forward stage typed, through stages.Env.
			for _, n := range spec.Nodes {
				if _, has := n.Options["cuda_graph"]; has {
					t.Errorf("node %s: cuda_graph travels as an option", n.Name)
				}
			}
		})
	}
}

// Every option of a built-in stage is documented in configs/reference.yaml
// beside its stage's name.
func TestBuiltinStageOptionsDocumented(t *testing.T) {
	ref, err := os.ReadFile(filepath.Join("..", "configs", "reference.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	reg := pipeline.DefaultRegistry()
	documented := 0
	for _, slot := range reg.Slots() {
		for _, name := range reg.Names(slot) {
			d, err := reg.Defaults(slot, name)
			if err != nil {
				t.Fatal(err)
			}
			if d == nil {
				continue
			}
			typ := reflect.TypeOf(d)
			for i := range typ.NumField() {
				key, _, _ := strings.Cut(typ.Field(i).Tag.Get("yaml"), ",")
				if key == "" {
					continue
				}
				documented++
				if !regexp.MustCompile(`(?m)^#.*\b` + regexp.QuoteMeta(slot) + `\b.*\b` + regexp.QuoteMeta(key) + `:`).Match(ref) {
					t.Errorf("%s=%s option %q is not documented in configs/reference.yaml (a comment line naming %s and %s:)", slot, name, key, slot, key)
				}
			}
		}
	}
	if documented == 0 {
		t.Fatal("no built-in stage option found: is the registry filled?")
	}
}

// A stage option is checked when the config's pipeline is resolved, before
// any model loads, with the stage's own message.
func TestCheckedSpecRefusesBadOptions(t *testing.T) {
	for _, tc := range []struct{ yaml, want string }{
		{"pipeline:\n  insert:\n    - {after: forward, stage: logit-softcap, options: {cap: -1}}\n", "cap must be positive"},
		{"pipeline:\n  insert:\n    - {after: forward, stage: logit-softcap, options: {capp: 3}}\n", "field capp not found"},
		{"pipeline:\n  options:\n    sample: {temperature: 2}\n", "field temperature not found"},
		{"pipeline:\n  sample: typical\n", `slot "sample" has no implementation "typical"`},
	} {
		cfg, err := config.Parse("t.yaml", []byte("model: m\n"+tc.yaml))
		if err != nil {
			t.Fatal(err)
		}
		_, err = CheckedSpec(cfg, nil)
		if !errors.Is(err, config.ErrInvalid) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: CheckedSpec = %v, want config.ErrInvalid with %q", tc.yaml, err, tc.want)
		}
		if _, err := DryGraph(cfg, nil); err == nil {
			t.Errorf("%s: DryGraph built it", tc.yaml)
		}
	}
}
