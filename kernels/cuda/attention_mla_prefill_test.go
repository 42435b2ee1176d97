package cuda

import (
	"strings"
	"testing"
)

// mlaPrefillHint derives the plan's totals from the host offsets: the
// tiles of the sequences of at least mlaPrefillMinRows rows and the other
// rows exactly, the expanded rows bounded by the block table's reach
// rounded up to the tile; no offsets, or a bound past int32, give no hint;
// offsets of the wrong count, span or order are errors naming the field.
func TestMLAPrefillHint(t *testing.T) {
	for _, tc := range []struct {
		name                  string
		cu                    []int32
		seqs, tokens, keys    int
		ok                    bool
		rows, tiles, absorbed int
		err                   string
	}{
		{"none", nil, 2, 10, 64, false, 0, 0, 0, ""},
		{"decode rows only", []int32{0, 1, 2, 5}, 3, 5, 1024, true, 0, 0, 5, ""},
		{"threshold", []int32{0, mlaPrefillMinRows, 2*mlaPrefillMinRows - 1}, 2, 2*mlaPrefillMinRows - 1, 100, true, 128, 1, mlaPrefillMinRows - 1, ""},
		{"mixed", []int32{0, 1, 257, 258, 358}, 4, 358, 1000, true, 2 * 1024, 4 + 2, 2, ""},
		{"bound past int32", []int32{0, 100, 200}, 2, 200, 1 << 30, false, 0, 0, 0, ""},
		{"count", []int32{0, 41}, 2, 41, 64, false, 0, 0, 0, "HostCuSeqlensQ"},
		{"span", []int32{0, 20, 40}, 2, 41, 64, false, 0, 0, 0, "HostCuSeqlensQ"},
		{"order", []int32{0, 30, 20, 41}, 3, 41, 64, false, 0, 0, 0, "below offset"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h, ok, err := mlaPrefillHint(tc.cu, tc.seqs, tc.tokens, tc.keys)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("error %v, want one naming %q", err, tc.err)
				}
				return
			}
			if err != nil || ok != tc.ok {
				t.Fatalf("ok %v, err %v; want ok %v", ok, err, tc.ok)
			}
			if got := [3]int{int(h.rows), int(h.tiles), int(h.absorbed)}; ok && got != [3]int{tc.rows, tc.tiles, tc.absorbed} {
				t.Errorf("rows, tiles, absorbed = %v, want %v", got, [3]int{tc.rows, tc.tiles, tc.absorbed})
			}
		})
	}
}
