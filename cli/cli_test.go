package cli

import (
	"bytes"
	"compress/gzip"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/deepinfer/deepinfer-go/engine/models/random"
	"github.com/deepinfer/deepinfer-go/pipeline"
)

func run(t *testing.T, args ...string) (string, error) {
	t.Helper()
	cmd := NewRootCommand(nil)
	var out bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(&out)
	cmd.SetArgs(args)
	err := cmd.Execute()
	return out.String(), err
}

func TestGraphCommand(t *testing.T) {
	cfg := filepath.Join("..", "configs", "zos.yaml")
	tests := []struct {
		args    []string
		want    []string
		wantErr string
	}{
		{args: []string{"graph", "--config", cfg}, want: []string{"flowchart LR", "schedule", "feedback, in flight <= 2", "*stages.ScheduledStep"}},
		{args: []string{"graph", "--config", cfg, "--format", "dot"}, want: []string{"digraph pipeline", `"postprocess" -> "schedule"`}},
		// The CUDA preset draws on a machine without a GPU: stages do their
		// device work in the start phase, which drawing never reaches.
		{args: []string{"graph", "--config", filepath.Join("..", "configs", "cuda.yaml"), "--format", "mermaid"},
			want: []string{"forward=default", `-.-o|"lagged 1: item k waits for item k-1"|`, "feedback, in flight <= 2"}},
		{args: []string{"graph", "--config", cfg, "--format", "dot"}, want: []string{`"sample" -> "forward" [label="lagged 1`, `"postprocess" -> "sample" [label="lagged 1`}},
		{args: []string{"graph", "--config", cfg, "--format", "png"}, wantErr: "--format must be mermaid or dot"},
		{args: []string{"graph", "--config", "missing.yaml"}, wantErr: "missing.yaml"},
	}
	for _, tc := range tests {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			out, err := run(t, tc.args...)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			for _, w := range tc.want {
				if !strings.Contains(out, w) {
					t.Errorf("output lacks %q:\n%s", w, out)
				}
			}
		})
	}
}

func TestGraphProfile(t *testing.T) {
	dir := t.TempDir()
	if err := random.WriteLlama(dir, random.TinyLlama, 7); err != nil {
		t.Fatal(err)
	}
	cfg := filepath.Join(dir, "run.yaml")
	if err := os.WriteFile(cfg, []byte("model: .\ncpu: {threads: 2}\ncache: {num_blocks: 64}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := run(t, "graph", "--config", cfg, "--profile", "4", "--max-tokens", "3")
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range []string{"flowchart LR", "items, busy", "wait-out", "bottleneck: "} {
		if !strings.Contains(out, w) {
			t.Errorf("output lacks %q:\n%s", w, out)
		}
	}
	if _, err := run(t, "graph", "--config", cfg, "--format", "dot"); err != nil {
		t.Errorf("dot render: %v", err)
	}
	// The host profiles of a profiled run: a CPU profile and an allocation
	// profile that the forward's allocations show up in.
	cpuProf, memProf := filepath.Join(dir, "cpu.prof"), filepath.Join(dir, "mem.prof")
	if _, err := run(t, "graph", "--config", cfg, "--profile", "4", "--max-tokens", "3", "--cpuprofile", cpuProf, "--memprofile", memProf); err != nil {
		t.Fatal(err)
	}
	for _, path := range []string{cpuProf, memProf} {
		names := profileStrings(t, path)
		if path == memProf && !strings.Contains(names, "Forward") {
			t.Errorf("the allocation profile names no model Forward")
		}
	}
	if _, err := run(t, "graph", "--config", cfg, "--memprofile", filepath.Join(dir, "missing", "mem.prof")); err == nil || !strings.Contains(err.Error(), "--memprofile") {
		t.Errorf("unwritable --memprofile: %v", err)
	}
	bad := filepath.Join(dir, "bad.yaml")
	os.WriteFile(bad, []byte("model: .\npipeline: {sample: nonesuch}\n"), 0o644)
	if _, err := run(t, "graph", "--config", bad); err == nil || !strings.Contains(err.Error(), `has no implementation "nonesuch"`) {
		t.Errorf("unknown sampler: %v", err)
	}
}

// profileStrings returns the decompressed bytes of the pprof profile at
// path (a gzipped protocol buffer, whose string table holds the function
// names), failing the test when it is not one.
func profileStrings(t *testing.T, path string) string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	z, err := gzip.NewReader(f)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	data, err := io.ReadAll(z)
	if err != nil || len(data) == 0 {
		t.Fatalf("%s: %d bytes, %v", path, len(data), err)
	}
	return string(data)
}

func TestGenerateCommand(t *testing.T) {
	dir := t.TempDir()
	if err := random.WriteLlama(dir, random.TinyLlama, 7); err != nil {
		t.Fatal(err)
	}
	cfg := filepath.Join(dir, "run.yaml")
	if err := os.WriteFile(cfg, []byte("model: .\ncpu: {threads: 2}\ncache: {num_blocks: 64}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		args    []string
		want    []string
		wantErr string
	}{
		{args: []string{"--token-ids", "-p", "3 4 5", "-n", "5", "--ignore-eos"}, want: []string{"stats:", "decode", "MFU"}},
		{args: []string{"--token-ids", "-p", "3 4 5", "-p", "9 9", "-n", "3", "--n", "2", "-t", "0.7", "--seed", "1"}, want: []string{"prompt 2, output 1 (", "stats:"}},
		{args: []string{"-p", "hello", "-n", "3"}, wantErr: "1 of 1 outputs failed"},
		{args: []string{"--token-ids", "-p", "3 x"}, wantErr: `"x" is not a token id`},
		{args: []string{"--token-ids", "-p", "3", "--top-p", "2"}, wantErr: "top_p"},
		{args: []string{"--token-ids", "-p", "3", "--logit-bias", "5:1"}, wantErr: "TOKEN=BIAS"},
	}
	for _, tc := range tests {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			out, err := run(t, append([]string{"generate", "-c", cfg}, tc.args...)...)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			for _, w := range tc.want {
				if !strings.Contains(out, w) {
					t.Errorf("output lacks %q:\n%s", w, out)
				}
			}
		})
	}
}

func TestReadPrompts(t *testing.T) {
	got, err := readPrompts(nil, "", strings.NewReader("one\n\n{\"prompt\": \"two\"}\n"))
	if err != nil || strings.Join(got, "|") != "one|two" {
		t.Errorf("readPrompts = %v, %v", got, err)
	}
	if _, err := readPrompts(nil, "", strings.NewReader("{\"text\": 1}\n")); err == nil || !strings.Contains(err.Error(), "standard input:1") {
		t.Errorf("bad JSON line: %v", err)
	}
	if _, err := readPrompts(nil, "", strings.NewReader("\n")); err == nil {
		t.Error("no prompts accepted")
	}
}

// TestCommandsUseTheRegistry runs every command that builds an engine or
// a graph with an empty registry: each must fail for want of the stages,
// which shows it took its stages from the registry it was given.
func TestCommandsUseTheRegistry(t *testing.T) {
	dir := t.TempDir()
	if err := random.WriteLlama(dir, random.TinyLlama, 7); err != nil {
		t.Fatal(err)
	}
	cfg := filepath.Join(dir, "run.yaml")
	if err := os.WriteFile(cfg, []byte("model: .\ncpu: {threads: 2}\ncache: {num_blocks: 64}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	text := filepath.Join(dir, "text.txt")
	if err := os.WriteFile(text, []byte("some text to score"), 0o644); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		args []string
	}{
		{"graph", []string{"graph", "--config", cfg}},
		{"graph profile", []string{"graph", "--config", cfg, "--profile", "1"}},
		{"generate", []string{"generate", "--config", cfg, "--token-ids", "-p", "3 4", "-n", "2"}},
		{"eval", []string{"eval", "--config", cfg, "--file", text}},
		{"bench", []string{"bench", "--config", cfg, "--num-seqs", "1"}},
		{"serve", []string{"serve", "--config", cfg, "--port", "0"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cmd := NewRootCommand(pipeline.NewRegistry())
			var out bytes.Buffer
			cmd.SetOut(&out)
			cmd.SetErr(&out)
			cmd.SetArgs(tc.args)
			if err := cmd.Execute(); err == nil || !strings.Contains(err.Error(), "is registered") {
				t.Errorf("%v: err = %v, want a missing stage\n%s", tc.args, err, out.String())
			}
		})
	}
}
