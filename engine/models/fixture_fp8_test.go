package models

import (
	"math"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/deepinfer/deepinfer-go/engine/weights"
)

// TestFixtureFP8Layout checks that the FP8 fixtures are laid out as
// DeepSeek-V3/R1's and Qwen3's FP8 checkpoints are, so that their parity in
// TestFixtureParity speaks for real ones: quantization_config fp8 / e4m3 /
// dynamic / [128, 128]; every linear layer's matrix of the decoder layers
// (IsFP8Linear) stored as F8_E4M3 with an F32 "_scale_inv" of
// [ceil(rows/128), ceil(cols/128)] positive finite scales; every other tensor
// BF16 (e_score_correction_bias F32); partial blocks in both dimensions; and
// that the engine keeps the bytes (its weight format leads with F8_E4M3).
func TestFixtureFP8Layout(t *testing.T) {
	ops := newBackend(t, 0)
	for name, variants := range fixtureVariants {
		if !slices.Contains(variants, "fp8") {
			continue
		}
		t.Run(name, func(t *testing.T) {
			dir := filepath.Join(fixtureDir, name, "fp8")
			ck, err := weights.Open(dir)
			if err != nil {
				t.Fatal(err)
			}
			defer ck.Close()
			q := ck.Config.Quantization
			if q.Method != "fp8" || q.Fmt != "e4m3" || q.ActivationScheme != "dynamic" || q.WeightBlockSize != [2]int{128, 128} {
				t.Fatalf("quantization_config %+v, want fp8 e4m3 dynamic [128 128]", q)
			}
			var nFP8, nKept int
			partialRows, partialCols := false, false
			for _, n := range ck.Names() {
				ten, err := ck.Tensor(n)
				if err != nil {
					t.Fatal(err)
				}
				switch {
				case strings.HasSuffix(n, "_scale_inv"):
					w := strings.TrimSuffix(n, "_scale_inv")
					if !IsFP8Linear(w) || !ck.Has(w) {
						t.Errorf("%s: scale of %s, which is not an FP8 matrix here", n, w)
					}
				case IsFP8Linear(n):
					nFP8++
					if ten.DType != weights.F8E4M3 || len(ten.Shape) != 2 {
						t.Errorf("%s: %s %v, want a 2-D F8_E4M3 matrix", n, ten.DType, ten.Shape)
						continue
					}
					rows, cols := ten.Shape[0], ten.Shape[1]
					partialRows = partialRows || rows%128 != 0
					partialCols = partialCols || cols%128 != 0
					s, err := ck.Expect(weights.ScaleInvName(n), (rows+127)/128, (cols+127)/128)
					if err != nil {
						t.Error(err)
						continue
					}
					if s.DType != weights.F32 {
						t.Errorf("%s: %s, want F32", s.Name, s.DType)
					}
					for i, v := range s.Float32s() {
						if !(v > 0) || math.IsInf(float64(v), 0) {
							t.Errorf("%s[%d] = %g, want a positive finite scale", s.Name, i, v)
							break
						}
					}
					for i, b := range ten.Data {
						if b&0x7f == 0x7f {
							t.Errorf("%s: byte %d is NaN", n, i)
							break
						}
					}
				default:
					nKept++
					want := weights.BF16
					if strings.HasSuffix(n, "e_score_correction_bias") {
						want = weights.F32
					}
					if ten.DType != want {
						t.Errorf("%s: %s, want %s (kept in the checkpoint's dtype)", n, ten.DType, want)
					}
				}
			}
			if nFP8 == 0 || !partialRows || !partialCols {
				t.Errorf("%d FP8 matrices, partial row blocks %v, partial column blocks %v: want some of each", nFP8, partialRows, partialCols)
			}
			m, err := Builtin().Load(ops, dir, Options{MaxModelLen: 128})
			if err != nil {
				t.Fatal(err)
			}
			format := WeightFormat(m)
			if !strings.HasPrefix(format, "F8_E4M3") {
				t.Errorf("weight format %q, want the FP8 bytes kept (F8_E4M3 first)", format)
			}
			t.Logf("%d FP8 matrices, %d other tensors; weight format %s", nFP8, nKept, format)
		})
	}
}
