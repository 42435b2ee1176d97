package llm

import (
	"bytes"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/deepinfer/deepinfer-go/engine/config"
	"github.com/deepinfer/deepinfer-go/engine/models"
	"github.com/deepinfer/deepinfer-go/kernels/cpu/simd"
)

// TestWarnSlowBF16Pairs: the line about the pure-Go pairs loop appears
// exactly when BF16 weights meet bfloat16 activations on the pure-Go
// kernels: cpu.activation_rounding bf16, or auto with a GGUF file, and a
// model with BF16 weights; never for a model directory under auto or a
// file without BF16 weights, nor on a SIMD path with its own pairs kernel.
func TestWarnSlowBF16Pairs(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "m.gguf")
	if err := os.WriteFile(file, []byte("GGUF\x03\x00\x00\x00"), 0o644); err != nil {
		t.Fatal(err)
	}
	var logged bytes.Buffer
	old := slog.Default()
	slog.SetDefault(slog.New(slog.NewTextHandler(&logged, nil)))
	t.Cleanup(func() { slog.SetDefault(old) })
	native := simd.Default().HasNativeBF16Pairs()
	for _, tc := range []struct {
		name, model, rounding, formats string
		pureGo, want                   bool
	}{
		{"gguf bf16 weights, pure Go", file, "auto", "BF16", true, true},
		{"gguf mixed formats with bf16, pure Go", file, "", "Q8_0+BF16", true, true},
		{"gguf without bf16 weights", file, "auto", "Q4_K+Q6_K", true, false},
		{"model directory under auto", dir, "auto", "BF16", true, false},
		{"model directory under bf16", dir, "bf16", "BF16", true, true},
		{"float32 activations", file, "none", "BF16", true, false},
		{"the SIMD path", file, "auto", "BF16", false, !native},
	} {
		logged.Reset()
		cfg := config.Default()
		cfg.Model, cfg.CPU.ActivationRounding, cfg.CPU.PureGo = tc.model, tc.rounding, tc.pureGo
		warnSlowBF16Pairs(&cfg, models.IsGGUF(tc.model), tc.formats)
		if got := strings.Contains(logged.String(), "pure-Go kernels"); got != tc.want {
			t.Errorf("%s: warned %v, want %v (log %q)", tc.name, got, tc.want, logged.String())
		}
	}
}
