package llm

import (
	"fmt"
	"reflect"
	"strings"
	"testing"

	"github.com/deepinfer/deepinfer-go/engine/config"
)

func TestSpec(t *testing.T) {
	tests := []struct {
		name      string
		yaml      string
		wantNodes string
		wantLoop  string
		wantErr   string
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
			name:      "speculation adds draft and verify",
			yaml:      "model: m\nspeculative: {method: ngram}\n",
			wantNodes: "requests tokenize schedule prepare forward draft=ngram verify sample postprocess",
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
			if want := []string{"sample->forward lag 1", "postprocess->sample lag 1"}; !reflect.DeepEqual(lagged, want) {
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
