package bench

import (
	"context"
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"

	"github.com/deepinfer/deepinfer-go/engine"
	"github.com/deepinfer/deepinfer-go/engine/config"
	"github.com/deepinfer/deepinfer-go/engine/tokenizer"
)

// RunStructured runs the same requests without and with a constraint:
// every constrained output is a prefix of an instance of LongJSONSchema
// (which cannot end within the run), none ends early, and both sides
// report timings and their ratio.
func TestRunStructured(t *testing.T) {
	cfg, err := config.Parse("t.yaml", []byte("model: "+filepath.Join("..", "assets", "deepseek-tiny")+"\ncpu: {threads: 2}\ncache: {num_blocks: 128}\nengine: {max_num_seqs: 4}\n"))
	if err != nil {
		t.Fatal(err)
	}
	o := StructuredOptions{
		Offline:    OfflineOptions{NumSeqs: 4, MinInputLen: 4, MaxInputLen: 8, MinOutputLen: 24, MaxOutputLen: 24, MaxTokenID: 8000, Seed: 3},
		Constraint: engine.StructuredOutput{JSONSchema: LongJSONSchema, Whitespace: "compact"},
	}
	r, err := RunStructured(context.Background(), cfg, o)
	if err != nil {
		t.Fatal(err)
	}
	if r.EndedEarly != 0 || r.Constrained.TotalOutputTokens != 4*24 || r.Unconstrained.TotalOutputTokens != 4*24 {
		t.Fatalf("ended early %d, tokens %d / %d", r.EndedEarly, r.Constrained.TotalOutputTokens, r.Unconstrained.TotalOutputTokens)
	}
	if !(r.StepRateRatio > 0) || !(r.ThroughputRatio > 0) || r.Kind != "json_schema" {
		t.Fatalf("ratios %v %v, kind %q", r.StepRateRatio, r.ThroughputRatio, r.Kind)
	}
	// The constrained outputs open the array of records.
	tok, err := tokenizer.Load(filepath.Join("..", "assets", "deepseek-tiny"))
	if err != nil {
		t.Fatal(err)
	}
	for i, ids := range r.Constrained.outputs {
		if text := tok.Decode(ids, true); !strings.HasPrefix(text, `[{"name":"`) {
			t.Errorf("constrained output %d: %q", i, text)
		}
	}
	if _, err := json.Marshal(r); err != nil {
		t.Fatal(err)
	}
	bad := o
	bad.Constraint = engine.StructuredOutput{}
	if _, err := RunStructured(context.Background(), cfg, bad); err == nil {
		t.Error("no constraint accepted")
	}
}
