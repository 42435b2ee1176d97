// Package cuda is the CUDA backend of kernels.Ops. Its device code and host
// runtime live in libdeepinfer_cuda.so (built from csrc/ and this folder's
// .cu files by csrc/build.sh), which the package opens at run time with
// dlopen: the Go module builds, and its tests pass, on machines without CUDA;
// New reports a missing library or device as an error that says what to do.
//
// Numerics. Activations, KV caches, norm weights and biases are float32 on
// the device (ActivationDType is F32); weight matrices stay in their stored
// dtype (BF16, F16 or F32). GEMMs accumulate in float32: F32 weights
// multiply float32 activations exactly (no TF32); with BF16 or F16 weights
// the activations enter the GEMM rounded to the weight dtype (GEMMRound, the
// default: one tensor-core product) or split into a high and a low 16-bit
// part (GEMMSplit: about float32 accuracy, the weights still read once,
// twice the tensor-core work). Linears of 1..4 rows with weights of up to 4M
// elements run on the library's GEMV kernel (Options.GEMVRows), the rest on
// cuBLAS. Options.SkinnyRows = N (N <= 64) sends 16-bit
// linears of up to N rows to the library's skinny GEMM instead (tensor
// cores, batch-invariant; off by default because cuBLAS was faster at every
// shape measured, see NOTES.md). Norms, SiLU and routing follow the CPU
// backend's float64 steps, so the two backends agree to rounding outside the
// GEMMs.
//
// Execution. Every method queues work on the backend's one CUDA stream and
// returns; Download and Sync wait. Calls are serialized by a mutex, so a
// Backend is safe for concurrent use. Kernels that meet an index outside its
// table (token id, position, cache slot, block, row) cannot fail while
// running: they write zeros and set a flag that the next Download or Sync
// reports as an error wrapping kernels.ErrOutOfRange, naming the operation.
// MoE waits for its routing ids (one small copy to the host).
//
// Memory. Tensors come from a caching allocator in the library; a tensor's
// memory returns to the cache when the Go garbage collector finds it
// unreachable (runtime.AddCleanup). Device memory the collector cannot see
// is counted: every GCEvery bytes allocated trigger a collection, and an
// allocation that fails runs one and retries before reporting
// ErrOutOfMemory.
//
// Batch invariance. The backend's own kernels (norms, RoPE, cache writes,
// attention, routing, the skinny GEMM and the GEMV) compute every row from
// its own inputs in a fixed order; with the skinny GEMM on, Linear and
// Logits of up to 64 rows with 16-bit weights give a row the same bits alone
// or in any batch (it splits K by the weight's shape only). cuBLAS may pick
// a different algorithm for a different number of rows, so by default
// linears of more than 4 rows, and MoE's host path, are not batch-invariant.
package cuda

import (
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/deepinfer/deepinfer-go/kernels"
)

/*
#include "api.h"
*/
import "C"

// Sentinel errors.
var (
	// ErrNoLibrary: libdeepinfer_cuda.so could not be opened.
	ErrNoLibrary = errors.New("cuda library not available")
	// ErrABIMismatch: the library was built from another version of the source.
	ErrABIMismatch = errors.New("cuda library ABI mismatch")
	// ErrNoDevice: no usable CUDA device or driver, or the library has no
	// kernel image for the device.
	ErrNoDevice = errors.New("no usable cuda device")
	// ErrOutOfMemory: device memory is exhausted.
	ErrOutOfMemory = errors.New("out of device memory")
	// ErrUnsupported: a size or dtype the kernels do not handle yet.
	ErrUnsupported = errors.New("not supported by the cuda backend")
	// ErrCapturing: the call is not allowed while a CUDA graph is captured.
	ErrCapturing = errors.New("not allowed during graph capture")
	// ErrCUDA: any other failure of the CUDA runtime or cuBLAS.
	ErrCUDA = errors.New("cuda failure")
)

// GEMMMode is how float32 activations enter GEMMs with 16-bit weights.
type GEMMMode int

const (
	// GEMMRound rounds activations to the weight dtype: one GEMM.
	GEMMRound GEMMMode = 0
	// GEMMSplit splits x into hi + lo (both 16-bit): about float32 accuracy,
	// the weights read once, twice the tensor-core work.
	GEMMSplit GEMMMode = 1
)

func (m GEMMMode) String() string {
	switch m {
	case GEMMRound:
		return "round"
	case GEMMSplit:
		return "split"
	}
	return fmt.Sprintf("GEMMMode(%d)", int(m))
}

// DefaultGCEvery is the default of Options.GCEvery: 1 GiB.
const DefaultGCEvery = 1 << 30

// Options configure New.
type Options struct {
	// Library is the path of libdeepinfer_cuda.so. Empty: $DEEPINFER_CUDA_LIB,
	// then the executable's folder, then the dynamic loader's search path.
	Library string
	// Device is the CUDA device ordinal.
	Device int
	// GEMM picks how activations enter 16-bit GEMMs (YAML cuda.gemm).
	GEMM GEMMMode
	// KVCacheDType is the element type of GQA models' K and V caches: 0
	// (auto) keeps KVCacheDType's choice; kernels.F8E4M3 stores them in 8
	// bits (see Backend.KVCacheDType).
	KVCacheDType kernels.DType
	// DecodeChunk is the key count of a split decode row's attention chunk,
	// a positive multiple of DecodeChunkAlign; 0 keeps the library's (256;
	// YAML cuda.decode_attention_chunk). A row's chunks, and so its bits,
	// depend on this and on its own key count alone. Longer chunks leave
	// fewer partial results to merge (Qwen3-0.6B offline, 256 rows: 512
	// keys about 3% faster than 256), shorter ones give a lone long row
	// more blocks (Llama-3.2-1B at batch 1 and 2048 keys: 512 keys about
	// 5% slower a step). Rows of at most 512 keys always take chunks of 128.
	DecodeChunk int
	// GCEvery triggers a Go garbage collection after this many bytes of
	// device allocations, so that unreachable tensors return to the cache;
	// 0 means DefaultGCEvery, negative disables it.
	GCEvery int64
	// SkinnyRows sends 16-bit linears (and logits) of up to this many rows
	// (at most MaxSkinnyRows) to the library's skinny GEMM: tensor cores,
	// a row's bits the same alone or in any batch, but slower than cuBLAS
	// at every shape measured (NOTES.md). 0, the default: off (YAML
	// cuda.skinny_gemm_rows).
	SkinnyRows int

	// The fields below pick between kernels of one contract, for measuring
	// them against each other; every zero is the default, and none has a
	// config key. Unless a field says otherwise they change speed, not
	// results. Validate states their ranges.

	// GEMVRows sends linears of up to this many rows (at most MaxGEMVRows)
	// to the library's GEMV kernel (float32 inputs, batch-invariant;
	// another summation order than cuBLAS): 0: 4; negative: none.
	GEMVRows int
	// GEMVMaxElems bounds the weights of the GEMV kernel above one row, in
	// elements: 0: 4 Mi (the crossover with cuBLAS on an H200); negative:
	// one-row linears only.
	GEMVMaxElems int64
	// DisableGEMVWide makes one-row GEMVs with k <= 2048 take 4 columns a
	// block with two chunks, not 8 columns with one (the same bits).
	DisableGEMVWide bool
	// DisablePDL turns off programmatic dependent launch (a kernel's start
	// overlapping the tail of the one before it).
	DisablePDL bool
	// DisablePrefillGQA makes prefill attention over half caches run one
	// query head a block instead of a KV head's group.
	DisablePrefillGQA bool
	// DisableDecodeKM makes decode over half and 8-bit caches with at most
	// 8 query heads a KV head run the heads-as-rows tensor-core kernel
	// instead of the keys-as-rows one; changes results by rounding.
	DisableDecodeKM bool
	// DecodeStages and DecodeF8Stages are the copy stages of the
	// heads-as-rows decode kernel over half caches (2 or 3; 0: 2) and over
	// 8-bit ones (2 to 4; 0: 2).
	DecodeStages, DecodeF8Stages int
	// DecodeF8Direct is the copy stages (2 to 4; 0: 3) of the decode kernel
	// that widens 8-bit cache bytes in registers (at most 8 query heads a
	// KV head); negative: the keys-as-rows kernel instead.
	DecodeF8Direct int
	// DecodeChunksPerBlock n > 0 gives a decode row ceil(chunks / n) blocks
	// of the 8-bit and keys-as-rows kernels; 0: enough blocks to fill
	// DecodeBlocksPerSM blocks a multiprocessor (0: 32).
	DecodeChunksPerBlock, DecodeBlocksPerSM int
	// DecodeKMBlockPerChunk gives the keys-as-rows decode kernel one block
	// a chunk instead of the 8-bit kernel's runs of chunks.
	DecodeKMBlockPerChunk bool
	// MLAStagedMax is the largest MLA grid (rows x heads) that stages its
	// keys in shared memory: 0: the multiprocessors' count; negative: none.
	MLAStagedMax int
	// DisableMLAPrefill makes MLA over 16- and 8-bit latent caches run
	// every row in the absorbed form, prefill rows too, instead of the
	// non-absorbed prefill kernels for sequences of at least 16 query rows;
	// changes those rows' results by rounding.
	DisableMLAPrefill bool
	// DisableMLAPrefillHint makes an MLA call with prefill rows and several
	// sequences read its plan's counts back (a wait for the device) instead
	// of sizing its launches by the metadata's HostCuSeqlensQ; the same
	// results.
	DisableMLAPrefillHint bool
	// DisableMoEMMA keeps MoE expert GEMVs of 16-bit weights on CUDA cores
	// instead of tensor cores; changes results by summation order.
	DisableMoEMMA bool
	// DisableAttnOut16 sends every 16-bit attention output through float32
	// scratch and a narrowing pass instead of rounding it as it is stored.
	DisableAttnOut16 bool
	// SampleSplitRows: Sample calls of at most this many rows cut each row
	// into chunks, at least SampleMinChunks of them (0: 4), for the
	// whole-row passes: 0: every call; negative: none. The tokens do not
	// depend on either.
	SampleSplitRows, SampleMinChunks int
	// DisableNormNarrow makes LinearInputDType report F32 at every row
	// count, so that models keep their norms' and attention's outputs in
	// float32 and each linear rounds them itself (the same bits, one more
	// pass).
	DisableNormNarrow bool
	// DisableFusedMLAPrepare runs DeepSeek's split of the fused q / kv_a
	// projection, c_kv norm, two ropes and latent cache write as the
	// separate kernels (kernels.PrepareMLASteps) rather than as one kernel
	// a call (PrepareMLA, kernels.MLAPreparer). The same bits either way.
	DisableFusedMLAPrepare bool
	// DisableMoEAdd makes MoEAdd run MoE and then Add rather than adding in
	// MoE's combine pass (the same bits, one launch and pass more).
	DisableMoEAdd bool
	// DisableMoERoundedInput makes MoEInputDType answer F32 (x in float32)
	// where it would answer the experts' 16-bit type: in GEMM mode round
	// (kernels.MoEInputer) a model's norm writes a MoE layer's x rounded,
	// so that the router, the shared experts and the MoE do not each round
	// it again: the same bits (TestGPUMoERoundedInputModel), a rounding
	// pass less a projection that reads x. MoE takes either x
	// (kernels.MoERoundedShapes).
	DisableMoERoundedInput bool
	// DisableEmbedNorm makes EmbedNormConcat run Embedding, two RMSNorms
	// and Concat (the same bits, three launches more).
	DisableEmbedNorm bool
	// DisableFusedRoute makes RoutedMoE run MoERoute and then MoE rather
	// than routing inside the MoE's grouping launch (the same bits, one
	// launch more at small batches).
	DisableFusedRoute bool
	// DisableGatedGEMV runs GatedMLP's gate/up linear and SiLU-mul as two
	// operations where one paired GEMV would write the activations (the
	// same bits, one launch and one pass more).
	DisableGatedGEMV bool
	// MLPNarrowRows is the least number of rows for which GatedMLP keeps
	// its intermediates in the weights' 16-bit type (GEMM mode round, BF16
	// or F16 weights): half the bytes of float32 gate, up and product, and
	// no narrowing pass before the down projection; changes results by
	// rounding. 0: 64 (prefill chunks, large decode batches); negative:
	// never.
	MLPNarrowRows int
	// MoEGEMMPairs is the least number of (token, k) pairs for which MoE
	// over 16-bit experts (hidden and intermediate sizes multiples of 32)
	// runs a grouped tensor-core GEMM on the device (the wgmma one unless
	// DisableMoEWGMMA, whose mma.sync one gives the bits of the smaller
	// batches' grouped kernels, which run below it, also on the device): 0:
	// 2048 (on an H200 at DeepSeek-V2-Lite's expert shapes
	// the grouped kernels win at 1536 pairs, the GEMM at 6144); negative:
	// never (above 1024 pairs the batch groups on the host and runs cuBLAS
	// per expert, as before the GEMM). The same threshold moves FP8 experts
	// (block-scaled, tensor-core shapes) from the small-batch kernel to
	// their grouped GEMM (the same bits); negative sends their batches of
	// more than 1024 pairs to the host grouping too.
	MoEGEMMPairs int
	// DisableFP8LT sends FP8 linears of more than 8 rows to the library's
	// own tensor-core GEMM, whose rows' bits do not depend on the batch,
	// instead of cuBLASLt's block-scaled FP8 GEMM (DeepSeek-V3's recipe:
	// the same quantized activations, 3-7x faster on an H200 at 4096 rows,
	// see NOTES.md; cuBLASLt may pick another algorithm for another row
	// count, as cuBLAS does for 16-bit weights).
	DisableFP8LT bool
	// DisableMoEWGMMA runs MoE batches of MoEGEMMPairs pairs and more over
	// 16-bit experts on the mma.sync grouped GEMM, which gives the bits of
	// the smaller batches' grouped kernels, instead of the grouped GEMM of
	// Hopper's warpgroup MMA (sm_90a builds, hidden and intermediate sizes
	// multiples of 64; 1.56x the mma.sync GEMM's speed at 4096 tokens of
	// DeepSeek-V2-Lite's experts on an H100, NOTES.md), whose sums differ
	// from those kernels' in rounding, as the 16-bit linears' cuBLAS GEMMs
	// differ from their GEMVs.
	DisableMoEWGMMA bool
	// DisableMLAPrefillWGMMA runs MLA's prefill path (the non-absorbed
	// form, DisableMLAPrefill off: the expansion and the attention) on its
	// mma.sync kernels instead of those on Hopper's warpgroup MMA (sm_90a
	// builds), which give the same bits 2.6x faster (BF16 cache, 4096
	// tokens, NOTES.md); for tests and benchmarks.
	DisableMLAPrefillWGMMA bool
	// FillUninitialized fills every allocation (the library's scratch
	// included) with 0xFF bytes before it is handed out, so that a kernel
	// reading memory nobody wrote sees NaN or -1 rather than what the
	// block's last owner left (YAML cuda.fill_uninitialized_memory; the
	// switch PyTorch calls fill_uninitialized_memory). For debugging: one
	// memset an allocation, and a run's tokens change only where such a
	// read exists.
	FillUninitialized bool
	// GEMMPlans runs float32 and 16-bit linears of more than 16 rows
	// through cuBLASLt with an algorithm chosen once per shape and bucket
	// of row counts (four an octave) instead of cublasGemmEx, which
	// chooses again for every new row count: an eager step's rows vary
	// with the prompts in it, and on an H100 a step with prompt chunks of
	// new lengths spent about 0.5 ms of host time a gated MLP (YAML
	// cuda.gemm_plans). A plan cuBLASLt refuses falls back to
	// cublasGemmEx. Results change by rounding.
	GEMMPlans bool

	// profile and skip are measurement switches that only this package's
	// tests set (optionsFromTestEnv): profile brackets every eager
	// operation with device events (OpProfile); skip names operations
	// (as OpProfile names them) that are then not queued at all, which
	// makes results wrong.
	profile bool
	skip    []string
}

// DeviceInfo describes the device and the library.
type DeviceInfo struct {
	Name                 string
	Device               int
	Major, Minor         int // compute capability
	NumSMs               int
	TotalMem, FreeMem    uint64 // bytes, at the time of the call
	L2Bytes              uint64
	Runtime, Driver      int // CUDA versions, e.g. 13000
	CUBLAS               int
	LibraryArch, Library string // the target the library was built for, its path
}

// MemStats are the caching allocator's counters.
type MemStats struct {
	Reserved, InUse, Peak                    uint64 // bytes
	NumAllocs, NumCacheHits, NumDriverAllocs uint64
}

// GEMMStats counts the cuBLASLt GEMM plans (Options.GEMMPlans): plans
// made and GEMMs run through them since the backend was made. Cost: none.
type GEMMStats struct {
	Plans, PlanCalls uint64
}

// Backend implements kernels.Ops on one CUDA device.
type Backend struct {
	mu         handoffMutex
	life       sync.RWMutex // read: release; write: Close (after mu)
	lib        *library
	ctx        *C.di_ctx
	closed     atomic.Bool
	info       DeviceInfo
	gcEvery    int64
	sinceGC    atomic.Int64
	gemm       GEMMMode
	kvCache    kernels.DType   // Options.KVCacheDType
	fetches    sampleFetches   // pinned copies of sampled tokens (sample.go)
	i32Fetches sampleFetches   // pinned copies of FetchI32Async (drafts)
	lastSample sampleParams    // the last sample call's parameters (sample.go)
	opts       Options         // the options in force (setOptions)
	prof       *profiler       // per-operation device times; nil unless Options.profile
	skip       map[string]bool // operations not queued (Options.skip): timing ablations only
	// GatedMLP keeps 16-bit intermediates from this many rows (0: never).
	mlpNarrow int
	// LinearInputDType reports 16-bit inputs (not Options.DisableNormNarrow).
	normNarrow bool
	// mlaPrepare: PrepareMLA runs the fused kernel (not Options.DisableFusedMLAPrepare).
	mlaPrepare bool
}

var _ kernels.Ops = (*Backend)(nil)

// New opens the library, selects the device and creates the stream, cuBLAS
// handle and allocator. Errors wrap ErrNoLibrary, ErrABIMismatch or
// ErrNoDevice and say what to do; options out of range are refused first
// (Options.Validate), before the library is opened. Cost: library load and
// CUDA context creation (hundreds of milliseconds on a cold device).
func New(opts Options) (*Backend, error) {
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	lib, err := openLibrary(opts.Library)
	if err != nil {
		return nil, err
	}
	var buf [1024]C.char
	var ctx *C.di_ctx
	rc := C.c_create(lib.api, C.int(opts.Device), &ctx, &buf[0], C.int(len(buf)))
	if rc != stOK {
		msg := C.GoString(&buf[0])
		switch rc {
		case stNoDevice, stArch:
			return nil, fmt.Errorf("cuda: %s: %s: check the driver (nvidia-smi) or use device: cpu: %w", lib.path, msg, ErrNoDevice)
		case stOOM:
			return nil, fmt.Errorf("cuda: %s: %s: %w", lib.path, msg, ErrOutOfMemory)
		}
		return nil, fmt.Errorf("cuda: %s: create context on device %d: %s: %w", lib.path, opts.Device, msg, ErrCUDA)
	}
	b := &Backend{lib: lib, ctx: ctx, gcEvery: opts.GCEvery, kvCache: opts.KVCacheDType}
	if b.gcEvery == 0 {
		b.gcEvery = DefaultGCEvery
	}
	if err := b.setOptions(opts); err != nil {
		C.c_destroy(lib.api, ctx)
		return nil, err
	}
	var di C.di_device_info
	if err := b.status("device_info", C.c_device_info(lib.api, ctx, &di)); err != nil {
		C.c_destroy(lib.api, ctx)
		return nil, err
	}
	b.info = DeviceInfo{
		Name: C.GoString(&di.name[0]), Device: int(di.device), Major: int(di.cc_major), Minor: int(di.cc_minor),
		NumSMs: int(di.num_sms), TotalMem: uint64(di.total_mem), FreeMem: uint64(di.free_mem), L2Bytes: uint64(di.l2_bytes),
		Runtime: int(di.runtime_version), Driver: int(di.driver_version), CUBLAS: int(di.cublas_version),
		LibraryArch: C.GoString(&di.arch[0]), Library: lib.path,
	}
	return b, nil
}

// Name reports the device, its compute capability and the GEMM mode.
func (b *Backend) Name() string {
	return fmt.Sprintf("cuda(%s, sm_%d%d, %s, gemm %s)", b.info.Name, b.info.Major, b.info.Minor, b.info.LibraryArch, b.gemm)
}

// ActivationDType is F32: activations and caches are float32 on the device.
func (b *Backend) ActivationDType() kernels.DType { return kernels.F32 }

// KVCacheDType keeps the K and V caches of models with 16-bit weights in
// IEEE half when activations are rounded for GEMMs (GEMM mode round): half
// the bytes of float32, so twice the tokens in the same memory and half the
// reads of decode attention; prefill attention then runs on tensor cores
// from them (see AttentionParams.InputDType). Half keeps 10 mantissa bits
// (bf16 has 7); values beyond +-65504 overflow. GEMM mode split and float32
// models keep float32 caches. With Options.KVCacheDType F8E4M3 every
// model's GQA caches are 8-bit E4M3 instead (3 mantissa bits, saturated at
// +-448, no scale): a quarter of float32's bytes, lossy; attention widens
// each value exactly (to half for the tensor-core kernels, to float32 for
// the others), so it computes what it would over a cache holding the
// rounded values.
func (b *Backend) KVCacheDType(weights kernels.DType) kernels.DType {
	if b.kvCache == kernels.F8E4M3 {
		return kernels.F8E4M3
	}
	if b.gemm == GEMMRound && (weights == kernels.BF16 || weights == kernels.F16) {
		return kernels.F16
	}
	return kernels.F32
}

// cacheDTypes are the element types the cache operations accept.
var cacheDTypes = []kernels.DType{kernels.F32, kernels.F16, kernels.F8E4M3}

// Info returns the device description read at New (FreeMem as of then).
func (b *Backend) Info() DeviceInfo { return b.info }

// MemoryInfo returns the device's free and total memory now.
func (b *Backend) MemoryInfo() (free, total uint64, err error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if err := b.checkOpen("memory_info"); err != nil {
		return 0, 0, err
	}
	var di C.di_device_info
	if err := b.status("device_info", C.c_device_info(b.lib.api, b.ctx, &di)); err != nil {
		return 0, 0, err
	}
	return uint64(di.free_mem), uint64(di.total_mem), nil
}

// MemStats returns the allocator's counters.
func (b *Backend) MemStats() MemStats {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed.Load() {
		return MemStats{}
	}
	var s C.di_mem_stats
	C.c_mem_stats(b.lib.api, b.ctx, &s)
	return MemStats{Reserved: uint64(s.reserved), InUse: uint64(s.in_use), Peak: uint64(s.peak),
		NumAllocs: uint64(s.num_allocs), NumCacheHits: uint64(s.num_cache_hits), NumDriverAllocs: uint64(s.num_driver_allocs)}
}

// GEMMStats returns the plan counters.
func (b *Backend) GEMMStats() GEMMStats {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed.Load() {
		return GEMMStats{}
	}
	var s C.di_gemm_stats
	C.c_gemm_stats(b.lib.api, b.ctx, &s)
	return GEMMStats{Plans: uint64(s.plans), PlanCalls: uint64(s.plan_calls)}
}

// Close waits for queued work and releases the context and all device
// memory; tensors become invalid.
func (b *Backend) Close() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.life.Lock() // no release is freeing into the context
	defer b.life.Unlock()
	if b.closed.Swap(true) {
		return nil
	}
	b.fetches.free(b)
	b.i32Fetches.free(b)
	b.prof.close(b)
	C.c_destroy(b.lib.api, b.ctx)
	b.ctx = nil
	return nil
}

func (b *Backend) checkOpen(op string) error {
	if b.closed.Load() {
		return fmt.Errorf("cuda: %s: %w", op, kernels.ErrClosed)
	}
	return nil
}

// status turns an ABI status into an error carrying the library's message.
// The caller holds b.mu.
func (b *Backend) status(op string, rc C.int) error {
	if rc == stOK {
		return nil
	}
	msg := C.GoString(C.c_last_error(b.lib.api, b.ctx))
	var sentinel error
	switch rc {
	case stOOM:
		return fmt.Errorf("cuda: %s: %s: lower cache.memory_fraction, cache.num_blocks or engine.max_num_batched_tokens: %w", op, msg, ErrOutOfMemory)
	case stDeviceCheck, stOutOfRange:
		sentinel = kernels.ErrOutOfRange
	case stUnsupported:
		sentinel = ErrUnsupported
	case stInvalid:
		sentinel = kernels.ErrShape
	case stCapturing:
		sentinel = ErrCapturing
	case stNoDevice, stArch:
		sentinel = ErrNoDevice
	default:
		sentinel = ErrCUDA
	}
	return fmt.Errorf("cuda: %s: %s: %w", op, msg, sentinel)
}

// buffer is one device allocation; views share it. Its memory returns to the
// allocator's cache when the buffer becomes unreachable.
type buffer struct {
	ptr   uint64
	bytes uint64
}

// Tensor is the CUDA backend's tensor: a shape, a dtype and a byte offset
// into a device buffer.
type Tensor struct {
	shape []int
	dtype kernels.DType
	buf   *buffer
	off   uint64
	fp8   *fp8Scales   // an FP8 weight's block scales (fp8.go); nil for other tensors
	mx    *mxfp4Scales // an MXFP4 weight's scales (mxfp4.go; buf holds its codes); nil for other tensors
	q     *quantRows   // a block-quantized weight's row table (quant.go; buf holds its blocks); nil for other tensors
}

// Shape returns the dimensions; the caller must not modify them.
func (t *Tensor) Shape() []int { return t.shape }

// DType returns the element type.
func (t *Tensor) DType() kernels.DType { return t.dtype }

func (t *Tensor) String() string { return fmt.Sprintf("%v%v", t.dtype, t.shape) }

func (t *Tensor) numel() int {
	n := 1
	for _, d := range t.shape {
		n *= d
	}
	return n
}

func (t *Tensor) rowLen() int {
	n := 1
	for _, d := range t.shape[1:] {
		n *= d
	}
	return n
}

// ptr is the device address of the tensor's first element.
func (t *Tensor) ptr() C.di_dptr { return C.di_dptr(t.buf.ptr + t.off) }

// release returns a buffer's memory to the cache (from the cleanup
// goroutine). It takes life, not mu: the library's free touches only its
// allocator, under the allocator's own lock, so the cleanups (several a
// step) never wait for the stream's mutex nor make its holder hand it
// over (handoffMutex).
func (b *Backend) release(ptr uint64) {
	b.life.RLock()
	defer b.life.RUnlock()
	if b.closed.Load() {
		return
	}
	C.c_free(b.lib.api, b.ctx, C.di_dptr(ptr))
}

// Alloc returns a zero-filled tensor. Cost: one allocation from the cache
// (or the driver) and one memset on the stream.
func (b *Backend) Alloc(dtype kernels.DType, shape ...int) (kernels.Tensor, error) {
	return b.alloc(dtype, shape, true)
}

// AllocEmpty is Alloc without the memset (kernels.EmptyAllocator): the
// contents are whatever the cached block held. Cost: one allocation.
func (b *Backend) AllocEmpty(dtype kernels.DType, shape ...int) (kernels.Tensor, error) {
	return b.alloc(dtype, shape, false)
}

func (b *Backend) alloc(dtype kernels.DType, shape []int, zero bool) (kernels.Tensor, error) {
	n, err := kernels.AllocShapes("cuda", dtype, shape)
	if err != nil {
		return nil, err
	}
	bytes := uint64(n) * uint64(dtype.Size())
	ptr, err := b.allocBytes(bytes, zero)
	if err != nil {
		return nil, fmt.Errorf("cuda: alloc %v%v: %w", dtype, shape, err)
	}
	buf := &buffer{ptr: ptr, bytes: bytes}
	runtime.AddCleanup(buf, b.release, ptr)
	return &Tensor{shape: append([]int(nil), shape...), dtype: dtype, buf: buf}, nil
}

// allocBytes allocates (and zeroes when zero is set); on out-of-memory it
// collects garbage so that unreachable tensors return to the cache, then
// retries.
func (b *Backend) allocBytes(bytes uint64, zero bool) (uint64, error) {
	if b.gcEvery > 0 && b.sinceGC.Add(int64(bytes)) > b.gcEvery {
		b.sinceGC.Store(0)
		runtime.GC() // cleanups of unreachable buffers run soon after
	}
	for attempt := 0; ; attempt++ {
		b.mu.Lock()
		if err := b.checkOpen("alloc"); err != nil {
			b.mu.Unlock()
			return 0, err
		}
		var p C.di_dptr
		rc := C.c_alloc(b.lib.api, b.ctx, C.uint64_t(bytes), &p)
		if rc == stOK && zero {
			rc = C.c_memset_zero(b.lib.api, b.ctx, p, C.uint64_t(bytes))
			if rc != stOK {
				C.c_free(b.lib.api, b.ctx, p)
			}
		}
		if rc == stOK {
			b.mu.Unlock()
			return uint64(p), nil
		}
		err := b.status("alloc", rc)
		b.mu.Unlock()
		if rc != stOOM || attempt == 2 {
			return 0, err
		}
		// Let unreachable tensors go back to the cache, then retry.
		runtime.GC()
		time.Sleep(time.Duration(attempt+1) * 20 * time.Millisecond)
	}
}

// Upload copies little-endian host bytes into dst (see kernels.Ops). BF16 and
// F16 into an F32 tensor are widened on the device. Cost: one pass through
// pinned staging memory, asynchronous on the device side.
func (b *Backend) Upload(dst kernels.Tensor, src []byte, srcDType kernels.DType) error {
	const op = "upload"
	d, err := asCUDA(op, "dst", dst)
	if err != nil {
		return err
	}
	n, widen, err := kernels.UploadShapes("cuda", d, len(src), srcDType)
	if err != nil {
		return err
	}
	if n == 0 {
		return nil
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if err := b.checkOpen(op); err != nil {
		return err
	}
	var rc C.int
	if widen {
		rc = C.c_upload_widen(b.lib.api, b.ctx, d.ptr(), unsafe.Pointer(&src[0]), C.int(srcDType), C.uint64_t(n))
	} else {
		rc = C.c_upload(b.lib.api, b.ctx, d.ptr(), unsafe.Pointer(&src[0]), C.uint64_t(len(src)))
	}
	runtime.KeepAlive(d)
	return b.status(op, rc)
}

// Download copies src to host bytes of its own dtype after all queued work;
// it reports any index error a kernel met since the last Download or Sync.
func (b *Backend) Download(dst []byte, src kernels.Tensor) error {
	const op = "download"
	s, err := asCUDA(op, "src", src)
	if err != nil {
		return err
	}
	n, err := kernels.DownloadShapes("cuda", len(dst), s)
	if err != nil {
		return err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if err := b.checkOpen(op); err != nil {
		return err
	}
	var p unsafe.Pointer
	if n > 0 {
		p = unsafe.Pointer(&dst[0])
	}
	rc := C.c_download(b.lib.api, b.ctx, p, s.ptr(), C.uint64_t(n))
	runtime.KeepAlive(s)
	return b.status(op, rc)
}

// Rows is a view of rows [lo, hi) of dimension 0. No copy.
func (b *Backend) Rows(t kernels.Tensor, lo, hi int) (kernels.Tensor, error) {
	s, err := asCUDA("rows", "t", t)
	if err != nil {
		return nil, err
	}
	if err := kernels.RowsShapes("cuda", s, lo, hi); err != nil {
		return nil, err
	}
	if s.mx != nil { // codes and scales from the view's first matrix row (mxfp4.go)
		k := s.shape[len(s.shape)-1]
		return s.mxRows(lo*s.rowLen()/k, append([]int{hi - lo}, s.shape[1:]...)), nil
	}
	if s.q != nil { // the row table from the view's first matrix row (quant.go)
		k, r := max(s.shape[len(s.shape)-1], 1), s.rowLen()
		return s.qRows(lo*r/k, hi*r/k, append([]int{hi - lo}, s.shape[1:]...)), nil
	}
	v := &Tensor{shape: append([]int{hi - lo}, s.shape[1:]...), dtype: s.dtype, buf: s.buf,
		off: s.off + uint64(lo*s.rowLen()*s.dtype.Size())}
	if s.fp8 != nil { // the view's first matrix row (last dimension k)
		v.fp8 = s.fp8.view(lo * s.rowLen() / s.shape[len(s.shape)-1])
	}
	return v, nil
}

// Reshape is a view with a new shape and the same number of elements. No copy.
func (b *Backend) Reshape(t kernels.Tensor, shape ...int) (kernels.Tensor, error) {
	s, err := asCUDA("reshape", "t", t)
	if err != nil {
		return nil, err
	}
	if err := kernels.ReshapeShapes("cuda", s, shape); err != nil {
		return nil, err
	}
	if (s.mx != nil || s.q != nil) && (len(shape) == 0 || shape[len(shape)-1] != s.shape[len(s.shape)-1]) {
		return nil, fmt.Errorf("cuda: reshape: %v weight %v to %v changes its rows (last dimension): %w", s.dtype, s, shape, kernels.ErrShape)
	}
	v := &Tensor{shape: append([]int(nil), shape...), dtype: s.dtype, buf: s.buf, off: s.off, mx: s.mx, q: s.q}
	if s.fp8 != nil && len(shape) > 0 && shape[len(shape)-1] == s.shape[len(s.shape)-1] {
		v.fp8 = s.fp8.view(0) // an FP8 weight stays one while its rows keep their length
	}
	return v, nil
}

// Sync waits for all queued work and reports any index error a kernel met.
func (b *Backend) Sync() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if err := b.checkOpen("sync"); err != nil {
		return err
	}
	return b.status("sync", C.c_sync(b.lib.api, b.ctx))
}

// EmptyCache returns the allocator's cached blocks to the driver (a no-op
// while CUDA graphs exist). It waits for queued work.
func (b *Backend) EmptyCache() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if err := b.checkOpen("empty_cache"); err != nil {
		return err
	}
	return b.status("empty_cache", C.c_empty_cache(b.lib.api, b.ctx))
}

// asCUDA checks that t is a non-nil tensor of this backend.
func asCUDA(op, name string, t kernels.Tensor) (*Tensor, error) {
	return kernels.As[*Tensor]("cuda", op, name, t)
}

// tensorArg is a tensor argument of an op with its name in errors.
type tensorArg struct {
	name string
	t    kernels.Tensor
}

// asCUDAs is asCUDA over op's arguments in order, into ts (one per
// argument): the first foreign tensor's error, or nil.
func asCUDAs(op string, ts []*Tensor, args ...tensorArg) error {
	for i, a := range args {
		var err error
		if ts[i], err = asCUDA(op, a.name, a.t); err != nil {
			return err
		}
	}
	return nil
}

// optCUDA is asCUDA for optional arguments: nil stays nil.
func optCUDA(op, name string, t kernels.Tensor) (*Tensor, error) {
	return kernels.Opt[*Tensor]("cuda", op, name, t)
}

// optPtr is the device address of an optional tensor (0 for nil).
func optPtr(t *Tensor) C.di_dptr {
	if t == nil {
		return 0
	}
	return t.ptr()
}
