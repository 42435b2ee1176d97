package stages

import (
	"slices"
	"testing"

	"github.com/deepinfer/deepinfer-go/engine"
)

// The layout of a drafting step's one upload: arrays that do not overlap,
// each 16-byte aligned, inside its size; the first pass's offsets depend
// on T only, the chain's on N, W and where it starts only, depth j's not
// on the depth, so that graphs keyed by T and by (N, D) read one layout.
func TestMTPLayoutOffsets(t *testing.T) {
	const w = 5
	chainAt := firstExtent(32)
	for _, T := range []int{1, 3, 4, 32} {
		for _, N := range []int{1, 2, 8, 32} {
			for D := 1; D <= 4; D++ {
				l := newMTPLayout(T, N, D, w, chainAt)
				type span struct {
					name  string
					at, n int
				}
				spans := []span{{"ids", l.ids, T}, {"positions", l.positions, T}, {"slots", l.slots, T}, {"seqlens_k", l.seqlensK, T},
					{"from_row", l.fromRow, T}, {"verified", l.verified, 3 * N}, {"entries", l.entries, N}, {"cu", l.cu, N + 1}, {"tables", l.tables, N * w}}
				for j, d := range l.depths {
					spans = append(spans, span{"depth positions", d.positions, N}, span{"depth slots", d.slots, N}, span{"depth seqlens_k", d.seqlensK, N}, span{"depth shift_from", d.shiftFrom, N})
					if j > 0 && d.positions <= l.depths[j-1].shiftFrom {
						t.Errorf("T %d N %d D %d: depth %d before depth %d", T, N, D, j+1, j)
					}
				}
				if len(l.depths) != D-1 {
					t.Errorf("T %d N %d D %d: %d depth layouts", T, N, D, len(l.depths))
				}
				slices.SortFunc(spans, func(a, b span) int { return a.at - b.at })
				for i, s := range spans {
					if s.at%4 != 0 || s.at+s.n > l.size {
						t.Errorf("T %d N %d D %d: %s at %d (%d elements) in %d", T, N, D, s.name, s.at, s.n, l.size)
					}
					if i > 0 && spans[i-1].at+spans[i-1].n > s.at {
						t.Errorf("T %d N %d D %d: %s overlaps %s", T, N, D, spans[i-1].name, s.name)
					}
				}
				if l.chain != chainAt {
					t.Errorf("T %d: chain at %d, want %d", T, l.chain, chainAt)
				}
				a, b := newMTPLayout(T, 1, 1, 1, chainAt), newMTPLayout(1, N, 4, w, chainAt)
				if a.ids != l.ids || a.positions != l.positions || a.slots != l.slots || a.seqlensK != l.seqlensK || a.fromRow != l.fromRow {
					t.Errorf("T %d: the first pass moves with N or D", T)
				}
				if b.verified != l.verified || b.entries != l.entries || b.cu != l.cu || b.tables != l.tables || !slices.Equal(b.depths[:D-1], l.depths) {
					t.Errorf("N %d D %d: the chain moves with T or D", N, D)
				}
			}
		}
	}
}

// fill lays a step out as the chained passes read it: the first pass's
// ids and placeholders, padding past the step's rows (token 0, position 0,
// one key, slot -1, no shift, block 0); each drafting row's block table
// and, at each depth it reaches, its position, slot and key count; from
// the device its entry, whose accepted count shifts it, on the host its
// hidden row in the verification and no shift.
func TestMTPLayoutFill(t *testing.T) {
	const bs = 4
	m0 := &engine.SequenceMetadata{SeqID: 1, BlockTable: []int{7, 3, 9}}
	m1 := &engine.SequenceMetadata{SeqID: 2, BlockTable: []int{5, 2}}
	for _, fromDevice := range []bool{true, false} {
		s := &mtpPlan{fromDevice: fromDevice, ids: []int32{11, 0, 13}, fromRow: []int32{-1, 0, -1},
			rows:  []chainRow{{out: 1, meta: m1, pos: 5, hiddenRow: 2}, {out: 0, meta: m0, pos: 9, hiddenRow: 0}},
			depth: []int{3, 1}, entry: []int32{1, 0}, maxDepth: 3, entries: 2}
		l := newMTPLayout(4, 4, 3, 4, 0)
		host := make([]int32, l.size)
		for i := range host {
			host[i] = 99 // what fill leaves is visible
		}
		l.fill(host, s, bs)
		at := func(off, n int) []int32 { return host[off : off+n] }
		check := func(name string, got, want []int32) {
			t.Helper()
			if !slices.Equal(got, want) {
				t.Errorf("from device %v: %s = %v, want %v", fromDevice, name, got, want)
			}
		}
		check("ids", at(l.ids, 4), []int32{11, 0, 13, 0})
		check("from_row", at(l.fromRow, 4), []int32{-1, 0, -1, -1})
		check("slots", at(l.slots, 4), []int32{-1, -1, -1, -1})
		check("seqlens_k", at(l.seqlensK, 4), []int32{1, 1, 1, 1})
		check("cu", at(l.cu, 5), []int32{0, 1, 2, 3, 4})
		check("tables", at(l.tables, 16), []int32{5, 2, -1, -1, 7, 3, 9, -1, 0, -1, -1, -1, 0, -1, -1, -1})
		if fromDevice {
			check("entries", at(l.entries, 4), []int32{1, 0, 0, 0})
			check("verified", at(l.verified, 12), make([]int32, 12))
		} else {
			check("entries", at(l.entries, 4), []int32{0, 1, 0, 0})
			check("verified", at(l.verified, 12), []int32{0, 0, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0})
		}
		shift := []int32{-1, -1, -1, -1}
		if fromDevice {
			shift = []int32{1, -1, -1, -1}
		}
		// Row 0 (depth 3) at positions 5 and 6, block 2 of its table;
		// row 1 (depth 1) is padding at both depths.
		for j, pos := range []int32{5, 6} {
			d := l.depths[j]
			check("positions", at(d.positions, 4), []int32{pos, 0, 0, 0})
			check("slots", at(d.slots, 4), []int32{2*bs + pos%bs, -1, -1, -1})
			check("seqlens_k", at(d.seqlensK, 4), []int32{pos + 1, 1, 1, 1})
			check("shift_from", at(d.shiftFrom, 4), shift)
		}
	}
}
