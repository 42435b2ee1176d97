package cpu

import (
	"errors"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/deepinfer/deepinfer-go/kernels"
)

// TestPrepareMLAKVA: kernels.PrepareMLA from q in place and kv_a's own rows
// (MLAPrep.KVA, q compressed) gives the q and cache bits of the fused row
// [q c_kv k_pe] (MLAPrep.QKVA) holding the same values; an MLAPrep with both
// sources, or neither, is refused.
func TestPrepareMLAKVA(t *testing.T) {
	b := newTestBackend(t, 2)
	r := rand.New(rand.NewPCG(3, 5))
	d := kernels.MLAParams{NumHeads: 4, NopeDim: 32, RopeDim: 16, KVLoraRank: 128, VHeadDim: 32}
	const tokens, maxPos, blocks, blockSize = 5, 64, 4, 16
	qd, kw := d.NumHeads*(d.NopeDim+d.RopeDim), d.KVLoraRank+d.RopeDim
	q0, kva := randVals(r, tokens*qd, 1), randVals(r, tokens*kw, 2)
	var qkva []float32
	for i := range tokens {
		qkva = append(append(qkva, q0[i*qd:(i+1)*qd]...), kva[i*kw:(i+1)*kw]...)
	}
	pos, slots := make([]int32, tokens), make([]int32, tokens)
	for i := range tokens {
		pos[i], slots[i] = int32(7+3*i), int32(2*i)
	}
	prep := func(q, cache kernels.Tensor) kernels.MLAPrep {
		return kernels.MLAPrep{Q: q, Cache: cache, SlotMapping: putI32(t, b, slots, tokens), Positions: putI32(t, b, pos, tokens),
			Cos:    put(t, b, kernels.F32, randVals(rand.New(rand.NewPCG(1, 1)), maxPos*d.RopeDim/2, 1), maxPos, d.RopeDim/2),
			Sin:    put(t, b, kernels.F32, randVals(rand.New(rand.NewPCG(2, 2)), maxPos*d.RopeDim/2, 1), maxPos, d.RopeDim/2),
			KVNorm: put(t, b, kernels.F32, randVals(rand.New(rand.NewPCG(4, 4)), d.KVLoraRank, 1.5), d.KVLoraRank), Eps: 1e-6, MLA: d,
			Interleaved: true, CKV: alloc(t, b, tokens, d.KVLoraRank), KPE: alloc(t, b, tokens, d.RopeDim)}
	}
	fusedQ, fusedC := alloc(t, b, tokens, qd), alloc(t, b, blocks, blockSize, kw)
	a := prep(fusedQ, fusedC)
	a.QKVA = put(t, b, kernels.F32, qkva, tokens, qd+kw)
	if err := kernels.PrepareMLA(b, a); err != nil {
		t.Fatal(err)
	}
	sepQ, sepC := put(t, b, kernels.F32, q0, tokens, qd), alloc(t, b, blocks, blockSize, kw)
	a = prep(sepQ, sepC)
	a.KVA = put(t, b, kernels.F32, kva, tokens, kw)
	if err := kernels.PrepareMLA(b, a); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(vals(sepQ), vals(fusedQ)) {
		t.Errorf("q from KVA differs from QKVA's (max relative difference %.3g)", maxRelErr(vals(sepQ), vals(fusedQ)))
	}
	if slices.Equal(vals(sepQ), q0) {
		t.Error("q not rotated")
	}
	if !slices.Equal(vals(sepC), vals(fusedC)) {
		t.Errorf("cache from KVA differs from QKVA's (max relative difference %.3g)", maxRelErr(vals(sepC), vals(fusedC)))
	}
	a.QKVA = put(t, b, kernels.F32, qkva, tokens, qd+kw) // both
	if err := kernels.PrepareMLA(b, a); !errors.Is(err, kernels.ErrShape) {
		t.Errorf("QKVA and KVA both set: %v, want ErrShape", err)
	}
	a.QKVA, a.KVA = nil, nil
	if err := kernels.PrepareMLA(b, a); !errors.Is(err, kernels.ErrShape) {
		t.Errorf("neither QKVA nor KVA: %v, want ErrShape", err)
	}
}
