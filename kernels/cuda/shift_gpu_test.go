package cuda

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/deepinfer/deepinfer-go/kernels"
)

// shiftBatch is the layout of TestGPUShiftAccepted: three sequences of
// block size 4 over non-contiguous blocks, laid out as if no draft had been
// accepted. Sequence 0 (two tokens at positions 5 and 6) takes row 1 of
// accepted, sequence 1 (three tokens) is not shifted, sequence 2 (one token
// at position 10) takes row 0.
type shiftBatch struct {
	cu, seqlensK, tables, slots, positions, shiftFrom, accepted []int32
	numSeqs, width, blockSize                                   int
}

func newShiftBatch() shiftBatch {
	b := shiftBatch{
		cu:        []int32{0, 2, 5, 6},
		seqlensK:  []int32{7, 6, 11},
		tables:    []int32{9, 2, 6, 4, 0, -1, 7, 1, 8},
		positions: []int32{5, 6, 3, 4, 5, 10},
		shiftFrom: []int32{1, -1, 0},
		accepted:  []int32{1, 2, 0},
		numSeqs:   3, width: 3, blockSize: 4,
	}
	// The slots of the unshifted layout, as the host computed them.
	for s := range b.numSeqs {
		for i := b.cu[s]; i < b.cu[s+1]; i++ {
			p := b.positions[i]
			b.slots = append(b.slots, b.tables[s*b.width+int(p)/b.blockSize]*int32(b.blockSize)+p%int32(b.blockSize))
		}
	}
	return b
}

// shiftTensors is a shiftBatch uploaded to both backends.
type shiftTensors struct {
	cu, seqlensK, tables, slots, positions, shiftFrom, accepted dual
	numSeqs, numTokens, blockSize                               int
}

func (p *pair) shiftTensors(b shiftBatch) shiftTensors {
	return shiftTensors{
		cu:        p.ints(b.cu, len(b.cu)),
		seqlensK:  p.ints(b.seqlensK, b.numSeqs),
		tables:    p.ints(b.tables, b.numSeqs, b.width),
		slots:     p.ints(b.slots, len(b.slots)),
		positions: p.ints(b.positions, len(b.positions)),
		shiftFrom: p.ints(b.shiftFrom, len(b.shiftFrom)),
		accepted:  p.ints(b.accepted, len(b.accepted)),
		numSeqs:   b.numSeqs, numTokens: len(b.positions), blockSize: b.blockSize,
	}
}

// meta is the batch's metadata on one backend (pick chooses the side).
func (st shiftTensors) meta(pick func(dual) kernels.Tensor) *kernels.AttentionMetadata {
	return &kernels.AttentionMetadata{NumSeqs: st.numSeqs, NumTokens: st.numTokens, BlockSize: st.blockSize,
		CuSeqlensQ: pick(st.cu), SeqlensK: pick(st.seqlensK), BlockTables: pick(st.tables), SlotMapping: pick(st.slots)}
}

func cpuSide(d dual) kernels.Tensor { return d.c }
func gpuSide(d dual) kernels.Tensor { return d.g }

// ShiftAccepted on the device gives the CPU backend's positions, slots and
// key counts, which are also checked against the values worked out by hand.
func TestGPUShiftAccepted(t *testing.T) {
	p := newPair(t, GEMMRound)
	b := newShiftBatch()
	st := p.shiftTensors(b)
	if err := p.c.ShiftAccepted(st.meta(cpuSide), st.positions.c, st.shiftFrom.c, st.accepted.c); err != nil {
		t.Fatal(err)
	}
	if err := p.g.ShiftAccepted(st.meta(gpuSide), st.positions.g, st.shiftFrom.g, st.accepted.g); err != nil {
		t.Fatal(err)
	}
	// Sequence 0: +2, positions 7 and 8 in blocks 2 (index 1) and 6 (index
	// 2); sequence 1 unchanged; sequence 2: +1, position 11 in block 8.
	wants := map[string][]int32{
		"positions":    {7, 8, 3, 4, 5, 11},
		"slot_mapping": {2*4 + 3, 6*4 + 0, 4*4 + 3, 0*4 + 0, 0*4 + 1, 8*4 + 3},
		"seqlens_k":    {9, 6, 12},
	}
	for _, c := range []struct {
		name string
		d    dual
	}{{"positions", st.positions}, {"slot_mapping", st.slots}, {"seqlens_k", st.seqlensK}} {
		want, got := p.i32(p.c, c.d.c), p.i32(p.g, c.d.g)
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("shift_accepted: %s %v, cpu %v", c.name, got, want)
		}
		if fmt.Sprint(want) != fmt.Sprint(wants[c.name]) {
			t.Errorf("shift_accepted: cpu %s %v, want %v", c.name, want, wants[c.name])
		}
	}
	// The inputs and the other metadata are left alone.
	for _, c := range []struct {
		name string
		d    dual
		want []int32
	}{{"cu_seqlens_q", st.cu, b.cu}, {"block_tables", st.tables, b.tables}, {"shift_from", st.shiftFrom, b.shiftFrom},
		{"accepted", st.accepted, b.accepted}} {
		if got := p.i32(p.g, c.d.g); fmt.Sprint(got) != fmt.Sprint(c.want) {
			t.Errorf("shift_accepted changed %s: %v, want %v", c.name, got, c.want)
		}
	}
}

// ShiftAccepted is queued without a host round trip, so it can be captured:
// each replay shifts once more.
func TestGPUShiftAcceptedGraph(t *testing.T) {
	p := newPair(t, GEMMRound)
	b := newShiftBatch()
	// Each replay moves sequence 0 by 1 (row 1) and sequence 2 by 0 (row 2,
	// its position 10 being the last but one of its table): two replays
	// stay inside the tables.
	b.shiftFrom = []int32{1, -1, 2}
	b.accepted = []int32{1, 1, 0}
	st := p.shiftTensors(b)
	m := st.meta(gpuSide)
	graph, err := p.g.CaptureGraph(func() error {
		return p.g.ShiftAccepted(m, st.positions.g, st.shiftFrom.g, st.accepted.g)
	})
	if err != nil {
		t.Fatal(err)
	}
	defer graph.Close()
	// Capturing queued nothing: the values are still the unshifted ones.
	if got := p.i32(p.g, st.positions.g); fmt.Sprint(got) != fmt.Sprint(b.positions) {
		t.Fatalf("after capture: positions %v, want the unshifted %v", got, b.positions)
	}
	cm := st.meta(cpuSide)
	for round := range 2 {
		if err := graph.Replay(); err != nil {
			t.Fatal(err)
		}
		if err := p.c.ShiftAccepted(cm, st.positions.c, st.shiftFrom.c, st.accepted.c); err != nil {
			t.Fatal(err)
		}
		for _, c := range []struct {
			name string
			d    dual
		}{{"positions", st.positions}, {"slot_mapping", st.slots}, {"seqlens_k", st.seqlensK}} {
			want, got := p.i32(p.c, c.d.c), p.i32(p.g, c.d.g)
			if fmt.Sprint(got) != fmt.Sprint(want) {
				t.Errorf("replay %d: %s %v, cpu %v", round, c.name, got, want)
			}
		}
	}
}

// A row outside accepted, a negative count and a shift past the block
// table are reported by the next Sync as kernels.ErrOutOfRange naming
// shift_accepted (the CPU backend refuses the same calls at once); the
// sequence concerned is left unchanged, the others are shifted, and the
// backend stays usable.
func TestGPUShiftAcceptedOutOfRange(t *testing.T) {
	p := newPair(t, GEMMRound)
	tests := []struct {
		name      string
		shiftFrom []int32
		accepted  []int32
		bad       int // the sequence that is left unchanged
	}{
		{"row", []int32{1, -1, 3}, []int32{1, 2, 0}, 2},
		{"negative count", []int32{1, -1, 0}, []int32{-1, 2, 0}, 2},
		{"no block", []int32{1, 2, -1}, []int32{1, 2, 3}, 1}, // sequence 1's position 5 + 3 lands in its unset third block
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			b := newShiftBatch()
			b.shiftFrom, b.accepted = tc.shiftFrom, tc.accepted
			st := p.shiftTensors(b)
			err := p.c.ShiftAccepted(st.meta(cpuSide), st.positions.c, st.shiftFrom.c, st.accepted.c)
			if !errors.Is(err, kernels.ErrOutOfRange) {
				t.Fatalf("cpu: %v, want ErrOutOfRange", err)
			}
			if err := p.g.ShiftAccepted(st.meta(gpuSide), st.positions.g, st.shiftFrom.g, st.accepted.g); err != nil {
				t.Fatalf("launch: %v", err)
			}
			err = p.g.Sync()
			if !errors.Is(err, kernels.ErrOutOfRange) {
				t.Fatalf("Sync after a bad shift_accepted: %v, want ErrOutOfRange", err)
			}
			if !strings.Contains(err.Error(), "shift_accepted") {
				t.Errorf("error %q does not name shift_accepted", err)
			}
			if err := p.g.Sync(); err != nil {
				t.Fatalf("second Sync: %v", err)
			}
			pos, seqK := p.i32(p.g, st.positions.g), p.i32(p.g, st.seqlensK.g)
			for i := b.cu[tc.bad]; i < b.cu[tc.bad+1]; i++ {
				if pos[i] != b.positions[i] {
					t.Errorf("position %d of the bad sequence %d: %d, want it unchanged (%d)", i, tc.bad, pos[i], b.positions[i])
				}
			}
			if seqK[tc.bad] != b.seqlensK[tc.bad] {
				t.Errorf("seqlens_k of the bad sequence %d: %d, want it unchanged (%d)", tc.bad, seqK[tc.bad], b.seqlensK[tc.bad])
			}
			// Sequence 0 (row 1, count 2) is good in every case.
			if pos[0] != b.positions[0]+2 || seqK[0] != b.seqlensK[0]+2 {
				t.Errorf("sequence 0: position %d, seqlens_k %d; want %d and %d", pos[0], seqK[0], b.positions[0]+2, b.seqlensK[0]+2)
			}
		})
	}
}
