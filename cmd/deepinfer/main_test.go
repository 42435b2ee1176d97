package main

import (
	"bytes"
	"path/filepath"
	"strings"
	"testing"
)

func run(t *testing.T, args ...string) (string, error) {
	t.Helper()
	cmd := newRootCmd()
	var out bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(&out)
	cmd.SetArgs(args)
	err := cmd.Execute()
	return out.String(), err
}

func TestGraphCommand(t *testing.T) {
	cfg := filepath.Join("..", "..", "configs", "zos.yaml")
	tests := []struct {
		args    []string
		want    []string
		wantErr string
	}{
		{args: []string{"graph", "--config", cfg}, want: []string{"flowchart LR", "schedule", "feedback, in flight <= 2"}},
		{args: []string{"graph", "--config", cfg, "--format", "dot"}, want: []string{"digraph pipeline", `"postprocess" -> "schedule"`}},
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
