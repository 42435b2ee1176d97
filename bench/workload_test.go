package bench

import (
	"context"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/deepinfer/deepinfer-go/engine/config"
)

// The editing workload: deterministic in its options; each prompt is a
// passage of one document, the separator and the passage's start with
// exactly the edited words changed (to other words); prompts cycle over
// the documents and the passages have about the asked length.
func TestEditingPrompts(t *testing.T) {
	o := TextWorkloadOptions{NumPrompts: 9, MinLen: 40, MaxLen: 80, NumEdits: 3, Seed: 7}
	ps, err := EditingPrompts(o)
	if err != nil {
		t.Fatal(err)
	}
	again, err := EditingPrompts(o)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(ps, again) {
		t.Fatal("EditingPrompts is not deterministic")
	}
	o2 := o
	o2.Seed = 8
	if other, _ := EditingPrompts(o2); reflect.DeepEqual(ps, other) {
		t.Fatal("the seed changes nothing")
	}
	docs := Corpus()
	if len(docs) != 3 {
		t.Fatalf("%d corpus documents, want 3", len(docs))
	}
	if len(ps) != o.NumPrompts {
		t.Fatalf("%d prompts, want %d", len(ps), o.NumPrompts)
	}
	for i, p := range ps {
		if strings.TrimSpace(p.Passage) == "" || strings.TrimSpace(p.Restart) == "" {
			t.Fatalf("prompt %d: empty passage or restart: %+v", i, p)
		}
		if want := p.Passage + EditingSeparator + p.Restart; p.Text != want {
			t.Fatalf("prompt %d is not passage + separator + restart:\n%q", i, p.Text)
		}
		if !strings.Contains(docs[i%len(docs)], p.Passage) {
			t.Errorf("prompt %d: passage not from document %d:\n%s", i, i%len(docs), p.Passage)
		}
		if n := (len(p.Passage) + 2) / 3; n < o.MinLen || n > o.MaxLen+40 {
			t.Errorf("prompt %d: passage of about %d tokens, want %d..%d (to the end of a line)", i, n, o.MinLen, o.MaxLen)
		}
		if len(p.Edits) != o.NumEdits {
			t.Fatalf("prompt %d: %d edits, want %d", i, len(p.Edits), o.NumEdits)
		}
		// Undoing the edits gives the passage's start back; every edit
		// changes its word.
		var orig strings.Builder
		pos, shift := 0, 0
		for _, e := range p.Edits {
			if strings.EqualFold(e.Old, e.New) || p.Passage[e.Pos:e.Pos+len(e.Old)] != e.Old {
				t.Fatalf("prompt %d: bad edit %+v", i, e)
			}
			at := e.Pos + shift
			if p.Restart[at:at+len(e.New)] != e.New {
				t.Fatalf("prompt %d: edit %+v not in the restart %q", i, e, p.Restart)
			}
			orig.WriteString(p.Restart[pos:at])
			orig.WriteString(e.Old)
			pos = at + len(e.New)
			shift += len(e.New) - len(e.Old)
		}
		orig.WriteString(p.Restart[pos:])
		if start := orig.String(); !strings.HasPrefix(p.Passage, start) || len(start) >= len(p.Passage) {
			t.Fatalf("prompt %d: restart %q is not the passage's start with its edits", i, p.Restart)
		}
		if words := strings.Fields(p.Restart); len(words) < 3 {
			t.Errorf("prompt %d: short restart %q", i, p.Restart)
		}
	}
	// prose: the passages alone, the same ones.
	prose, err := ProsePrompts(o)
	if err != nil {
		t.Fatal(err)
	}
	for i, p := range prose {
		if p.Text != ps[i].Passage || p.Passage != p.Text || p.Restart != "" || p.Edits != nil {
			t.Fatalf("prose prompt %d: %+v", i, p)
		}
	}
	for _, bad := range []TextWorkloadOptions{{NumPrompts: 0, MinLen: 1, MaxLen: 1}, {NumPrompts: 1, MinLen: 5, MaxLen: 4}} {
		if _, err := EditingPrompts(bad); err == nil {
			t.Errorf("%+v: no error", bad)
		}
	}
	if _, err := EditingPrompts(TextWorkloadOptions{NumPrompts: 1, MinLen: 1, MaxLen: 1, Documents: []string{" \n"}}); err == nil {
		t.Error("blank documents: no error")
	}
	// A document shorter than the length gives all of itself (its first
	// two words, the restart, both changed); one without words to change
	// still gets a restart.
	short, err := EditingPrompts(TextWorkloadOptions{NumPrompts: 2, MinLen: 500, MaxLen: 500, Documents: []string{"one two three four\n", "12 34 56 78\n"}})
	if err != nil {
		t.Fatal(err)
	}
	if short[0].Passage != "one two three four\n" || len(short[0].Edits) != 2 || short[1].Restart != "12 " || short[1].Edits != nil {
		t.Fatalf("short documents: %+v", short)
	}
}

// The offline benchmark's text workloads run on the default model.
func TestRunOfflineTextWorkloads(t *testing.T) {
	dir := filepath.Join("..", "assets", "deepseek-tiny")
	if _, err := os.Stat(filepath.Join(dir, "model.safetensors")); err != nil {
		t.Skip("no default model:", err)
	}
	cfg := config.Default()
	cfg.Model = dir
	cfg.CPU.Threads = 2
	cfg.Engine.MaxModelLen = 512
	l, err := newTestLLM(t, &cfg)
	if err != nil {
		t.Fatal(err)
	}
	for _, wl := range []string{WorkloadProse, WorkloadEditing} {
		o := DefaultTextOffline(wl)
		o.NumSeqs, o.MinInputLen, o.MaxInputLen, o.MinOutputLen, o.MaxOutputLen = 3, 20, 40, 4, 6
		r, err := RunOffline(context.Background(), l, o)
		if err != nil {
			t.Fatal(err)
		}
		if r.Workload != wl || r.NumRequests != 3 || r.Failed != 0 || r.TotalOutputTokens < 12 || r.TotalInputTokens < 60 ||
			!strings.HasPrefix(r.Backend, "cpu(") || r.Speculative != nil {
			t.Fatalf("%s: %+v", wl, r)
		}
	}
	o := DefaultTextOffline(WorkloadEditing)
	o.MaxInputLen, o.MaxOutputLen = 400, 400
	if _, err := RunOffline(context.Background(), l, o); err == nil || !strings.Contains(err.Error(), "past max_model_len 512") {
		t.Fatalf("too long: %v", err)
	}
	o.Workload = "chat"
	if _, err := RunOffline(context.Background(), l, o); err == nil || !strings.Contains(err.Error(), "workload must be one of random, prose, editing") {
		t.Fatalf("bad workload: %v", err)
	}
}
