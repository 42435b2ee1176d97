package cuda

/*
#include "api.h"
*/
import "C"

import (
	"fmt"
	"slices"
	"strings"

	"github.com/deepinfer/deepinfer-go/kernels"
)

// Bounds of Options that the library shares (deepinfer_cuda.h).
const (
	// DecodeChunkAlign divides every Options.DecodeChunk.
	DecodeChunkAlign = 128
	// MaxSkinnyRows is the most Options.SkinnyRows: the skinny GEMM's limit.
	MaxSkinnyRows = 64
	// MaxGEMVRows is the most Options.GEMVRows: the GEMV kernel's limit.
	MaxGEMVRows = 8
)

// The bounds above are the library's: a mismatch does not compile.
var (
	_ [DecodeChunkAlign - C.DI_DEC_CHUNK_ALIGN]struct{}
	_ [C.DI_DEC_CHUNK_ALIGN - DecodeChunkAlign]struct{}
	_ [MaxSkinnyRows - C.DI_SKINNY_MAX_ROWS]struct{}
	_ [C.DI_SKINNY_MAX_ROWS - MaxSkinnyRows]struct{}
	_ [MaxGEMVRows - C.DI_GEMV_MAX_ROWS]struct{}
	_ [C.DI_GEMV_MAX_ROWS - MaxGEMVRows]struct{}
)

// defaultMLPNarrowRows is Options.MLPNarrowRows' default: from 64 rows
// (prefill chunks, large decode batches) the intermediates' traffic is worth
// saving; below, the GEMV paths read float32 rows.
const defaultMLPNarrowRows = 64

// Validate reports the first option out of range, naming the field and
// what it allows; the error wraps ErrUnsupported. New calls it before it
// opens the library. Cost: a few comparisons.
func (o Options) Validate() error {
	bad := func(field string, v any, want string) error {
		return fmt.Errorf("cuda: option %s = %v: want %s: %w", field, v, want, ErrUnsupported)
	}
	switch {
	case o.Device < 0:
		return bad("Device", o.Device, "a device ordinal (0 or more)")
	case o.GEMM != GEMMRound && o.GEMM != GEMMSplit:
		return bad("GEMM", o.GEMM, "GEMMRound or GEMMSplit")
	case o.KVCacheDType != 0 && o.KVCacheDType != kernels.F8E4M3:
		return bad("KVCacheDType", o.KVCacheDType, "auto (0) or F8_E4M3")
	case o.DecodeChunk < 0 || o.DecodeChunk%DecodeChunkAlign != 0:
		return bad("DecodeChunk", o.DecodeChunk, fmt.Sprintf("0 (the library's 256 keys) or a positive multiple of %d keys", DecodeChunkAlign))
	case o.SkinnyRows < 0 || o.SkinnyRows > MaxSkinnyRows:
		return bad("SkinnyRows", o.SkinnyRows, fmt.Sprintf("0 (off) to %d", MaxSkinnyRows))
	case o.GEMVRows > MaxGEMVRows:
		return bad("GEMVRows", o.GEMVRows, fmt.Sprintf("at most %d (0: 4; negative: none)", MaxGEMVRows))
	case o.DecodeStages != 0 && o.DecodeStages != 2 && o.DecodeStages != 3:
		return bad("DecodeStages", o.DecodeStages, "0 (2), 2 or 3")
	case o.DecodeF8Stages != 0 && (o.DecodeF8Stages < 2 || o.DecodeF8Stages > 4):
		return bad("DecodeF8Stages", o.DecodeF8Stages, "0 (2) or 2 to 4")
	case o.DecodeF8Direct > 0 && (o.DecodeF8Direct < 2 || o.DecodeF8Direct > 4):
		return bad("DecodeF8Direct", o.DecodeF8Direct, "0 (3), 2 to 4, or negative (off)")
	case o.DecodeChunksPerBlock < 0:
		return bad("DecodeChunksPerBlock", o.DecodeChunksPerBlock, "0 (fill the device) or positive")
	case o.DecodeBlocksPerSM < 0:
		return bad("DecodeBlocksPerSM", o.DecodeBlocksPerSM, "0 (32) or positive")
	case o.SampleMinChunks < 0:
		return bad("SampleMinChunks", o.SampleMinChunks, "0 (4) or positive")
	}
	for _, op := range o.skip {
		if !slices.Contains(skippable, op) {
			return fmt.Errorf("cuda: skip %q: not an operation (want some of %s): %w", op, strings.Join(skippable, ", "), ErrUnsupported)
		}
	}
	return nil
}

// cOptions is o's library half (di_options); both use zero for the default.
// Values are clamped to [-1, 2^30], which keeps every valid option's
// meaning (a negative one means "none" or "off").
func (o Options) cOptions() C.di_options {
	i32 := func(v int) C.int32_t { return C.int32_t(min(max(v, -1), 1<<30)) }
	flag := func(v bool) C.int32_t {
		if v {
			return 1
		}
		return 0
	}
	return C.di_options{
		size:                      C.uint32_t(C.sizeof_di_options),
		gemm_mode:                 i32(int(o.GEMM)),
		decode_chunk:              i32(o.DecodeChunk),
		skinny_rows:               i32(o.SkinnyRows),
		gemv_rows:                 i32(o.GEMVRows),
		gemv_max_elems:            C.int64_t(o.GEMVMaxElems),
		disable_pdl:               flag(o.DisablePDL),
		disable_gemv_wide:         flag(o.DisableGEMVWide),
		disable_prefill_gqa:       flag(o.DisablePrefillGQA),
		disable_decode_km:         flag(o.DisableDecodeKM),
		decode_stages:             i32(o.DecodeStages),
		decode_f8_stages:          i32(o.DecodeF8Stages),
		decode_f8_direct:          i32(o.DecodeF8Direct),
		decode_chunks_per_block:   i32(o.DecodeChunksPerBlock),
		decode_blocks_per_sm:      i32(o.DecodeBlocksPerSM),
		decode_km_block_per_chunk: flag(o.DecodeKMBlockPerChunk),
		mla_staged_max:            i32(o.MLAStagedMax),
		disable_moe_mma:           flag(o.DisableMoEMMA),
		disable_attn_out16:        flag(o.DisableAttnOut16),
		sample_split_rows:         i32(o.SampleSplitRows),
		sample_min_chunks:         i32(o.SampleMinChunks),
		moe_gemm_pairs:            i32(o.MoEGEMMPairs),
		disable_fp8_lt:            flag(o.DisableFP8LT),
		fill_uninitialized:        flag(o.FillUninitialized),
		gemm_plans:                flag(o.GEMMPlans),
		disable_moe_wgmma:         flag(o.DisableMoEWGMMA),
		disable_mla_prefill_wgmma: flag(o.DisableMLAPrefillWGMMA),
	}
}

// setOptions puts valid options o in force: the library's switches
// (set_options, refused while a graph exists) and the Go side's. Library,
// Device, KVCacheDType and GCEvery keep the values New gave them. Tests
// call it again on an open backend, before any work (the Go side's fields
// are read without the lock); production code only through New. The
// caller does not hold b.mu.
func (b *Backend) setOptions(o Options) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if err := b.checkOpen("set_options"); err != nil {
		return err
	}
	co := o.cOptions()
	if err := b.status("set_options", C.c_set_options(b.lib.api, b.ctx, &co)); err != nil {
		return err
	}
	b.opts, b.gemm = o, o.GEMM
	b.normNarrow = !o.DisableNormNarrow
	b.mlaPrepare = !o.DisableFusedMLAPrepare
	switch {
	case o.MLPNarrowRows > 0:
		b.mlpNarrow = o.MLPNarrowRows
	case o.MLPNarrowRows < 0:
		b.mlpNarrow = 0
	default:
		b.mlpNarrow = defaultMLPNarrowRows
	}
	b.skip = nil
	if len(o.skip) > 0 {
		b.skip = map[string]bool{}
		for _, op := range o.skip {
			b.skip[op] = true
		}
	}
	switch {
	case o.profile && b.prof == nil:
		b.prof = newProfiler()
	case !o.profile && b.prof != nil:
		b.prof.close(b)
		b.prof = nil
	}
	return nil
}
