package models

import (
	"bytes"
	"fmt"
	"slices"
	"strings"

	"github.com/deepinfer/deepinfer-go/engine/weights"
	"github.com/deepinfer/deepinfer-go/kernels"
)

// Weights is where a model reads its tensors; *weights.Checkpoint implements
// it, and MemWeights holds tensors built in memory.
type Weights interface {
	Tensor(name string) (weights.Tensor, error)
	Has(name string) bool
}

// MemWeights is an in-memory Weights, for models built without files.
type MemWeights map[string]weights.Tensor

// Tensor returns the named tensor or an error wrapping weights.ErrNotFound.
func (m MemWeights) Tensor(name string) (weights.Tensor, error) {
	t, ok := m[name]
	if !ok {
		return weights.Tensor{}, fmt.Errorf("memory weights: tensor %q: %w", name, weights.ErrNotFound)
	}
	return t, nil
}

// Has reports whether the named tensor exists.
func (m MemWeights) Has(name string) bool { _, ok := m[name]; return ok }

// Names lists the tensors, sorted.
func (m MemWeights) Names() []string {
	names := make([]string, 0, len(m))
	for name := range m {
		names = append(names, name)
	}
	slices.Sort(names)
	return names
}

func toKernelDType(d weights.DType) (kernels.DType, bool) {
	switch d {
	case weights.F32:
		return kernels.F32, true
	case weights.BF16:
		return kernels.BF16, true
	case weights.F16:
		return kernels.F16, true
	}
	return 0, false
}

// loader copies tensors from a Weights into backend memory (allocated with
// kernels.AllocWeight: they live as long as the model), remembering the
// first error so that a constructor can read many tensors and check once.
// Matrices keep their stored dtype (F32, BF16, F16, F8_E4M3 with its block
// scales, or the blocks of a GGUF file's quantized formats); with quantize
// set, the linear layers' float matrices are quantized to FP8 at load.
type loader struct {
	ops kernels.Ops
	src Weights
	err error
	// block is quantization_config.weight_block_size of an FP8 checkpoint
	// ([0, 0]: none); quantize asks for FP8 linear weights from a float
	// checkpoint, in blocks of quantBlock (see Options.Quantization).
	block    [2]int
	quantize bool
	// bytes counts the weight bytes loaded per format: a backend dtype's
	// name, or a block-quantized format's (see WeightFormat).
	bytes map[string]int64
}

// newLoader returns the loader of a model of config cfg: FP8 matrices
// read with cfg's block size, float ones quantized when opts asks.
func newLoader(ops kernels.Ops, cfg *weights.Config, src Weights, opts Options) *loader {
	l := &loader{ops: ops, src: src, quantize: opts.Quantization == "fp8"}
	if cfg.Quantization.Method == "fp8" {
		l.block = cfg.Quantization.WeightBlockSize
	}
	return l
}

// weightFormat names the formats of the loaded weights, the most bytes
// first: "F8_E4M3+BF16" (FP8 weights with the embeddings and LM head in
// BF16), "BF16", "Q4_K+Q6_K+F32" (a GGUF Q4_K_M file).
func (l *loader) weightFormat() string {
	names := make([]string, 0, len(l.bytes))
	for name := range l.bytes {
		names = append(names, name)
	}
	slices.SortFunc(names, func(a, b string) int {
		if l.bytes[a] != l.bytes[b] {
			if l.bytes[a] > l.bytes[b] {
				return -1
			}
			return 1
		}
		return strings.Compare(a, b)
	})
	return strings.Join(names, "+")
}

func (l *loader) fail(err error) {
	if l.err == nil {
		l.err = err
	}
}

// quantBlock is the block of FP8 quantization at load, DeepSeek-V3's.
var quantBlock = [2]int{128, 128}

// get returns the named tensor after checking its shape and dtype (a
// float, or F8_E4M3 for a matrix).
func (l *loader) get(name string, shape ...int) (weights.Tensor, bool) {
	if l.err != nil {
		return weights.Tensor{}, false
	}
	t, err := l.src.Tensor(name)
	if err != nil {
		l.fail(fmt.Errorf("models: %w: %w", ErrWeights, err))
		return t, false
	}
	if !slices.Equal(t.Shape, shape) {
		l.fail(fmt.Errorf("models: %s: tensor %q has shape %v, want %v: %w", t.File, name, t.Shape, shape, ErrWeights))
		return t, false
	}
	if _, ok := toKernelDType(t.DType); !ok && t.DType != weights.F8E4M3 {
		l.fail(fmt.Errorf("models: %s: tensor %q has dtype %v, want F32, BF16, F16 or F8_E4M3: %w", t.File, name, t.DType, ErrWeights))
		return t, false
	}
	if t.DType == weights.F8E4M3 && len(shape) != 2 {
		l.fail(fmt.Errorf("models: %s: tensor %q: F8_E4M3 of shape %v, want a matrix: %w", t.File, name, shape, ErrWeights))
		return t, false
	}
	return t, true
}

// part is one stored matrix of a weight that several fill (q, k and v
// fused; gate and up; one expert's slice of stacked experts).
type part struct {
	name       string
	rows, cols int
}

// fp8Part is a part read as FP8 bytes and its rows of block scales.
type fp8Part struct {
	data     []byte
	scales   []float32 // [ceil(rows/bn), ceil(cols/bk)]
	rowBlock int       // bn
	blockK   int
}

// readFP8 reads a stored F8_E4M3 part with its "_scale_inv" tensor.
func (l *loader) readFP8(t weights.Tensor, p part) (fp8Part, bool) {
	if l.block == [2]int{} {
		l.fail(fmt.Errorf("models: %s: tensor %q is F8_E4M3 but config.json has no fp8 quantization_config: %w", t.File, p.name, ErrWeights))
		return fp8Part{}, false
	}
	bn, bk := l.block[0], l.block[1]
	sname := weights.ScaleInvName(p.name)
	st, ok := l.get(sname, (p.rows+bn-1)/bn, (p.cols+bk-1)/bk)
	if !ok {
		return fp8Part{}, false
	}
	if st.DType == weights.F8E4M3 {
		l.fail(fmt.Errorf("models: %s: tensor %q: scales of dtype %v: %w", st.File, sname, st.DType, ErrWeights))
		return fp8Part{}, false
	}
	return fp8Part{data: t.Data, scales: st.Float32s(), rowBlock: bn, blockK: bk}, true
}

// quantizePart quantizes a float part per block of quantBlock.
func quantizePart(t weights.Tensor, p part) fp8Part {
	data, scales := weights.QuantizeFP8Blocks(t.Float32s(), p.rows, p.cols, quantBlock[0], quantBlock[1])
	return fp8Part{data: data, scales: scales, rowBlock: quantBlock[0], blockK: quantBlock[1]}
}

// build loads a weight of the given shape whose matrix rows (all
// dimensions but the last flattened) are the parts' rows in order. Its
// dtype: FP8 when every part is stored in F8_E4M3 (or quantize is set and
// FP8 is possible), else the parts' common float dtype, else F32 (a mixed
// group: BF16 and F16 parts are widened, FP8 parts dequantized). Cost: one
// copy of every part; FP8 and mixed groups are assembled on the host first.
func (l *loader) build(quantize bool, shape []int, parts []part) kernels.Tensor {
	if l.err != nil {
		return nil
	}
	if qs, ok := l.quantParts(parts); !ok {
		return nil
	} else if qs != nil {
		return l.buildQuant(shape, parts, qs)
	}
	ts := make([]weights.Tensor, len(parts))
	nf8, dtypes := 0, map[kernels.DType]bool{}
	for i, p := range parts {
		t, ok := l.get(p.name, p.rows, p.cols)
		if !ok {
			return nil
		}
		ts[i] = t
		if t.DType == weights.F8E4M3 {
			nf8++
		} else {
			dt, _ := toKernelDType(t.DType)
			dtypes[dt] = true
		}
	}
	f8, canF8 := l.ops.(kernels.FP8Weighter)
	useF8 := nf8 == len(parts) || (quantize && l.quantize)
	if useF8 && !canF8 {
		l.fail(fmt.Errorf("models: %s: tensor %q: FP8 weights need a backend with FP8 kernels, and %s has none: %w",
			ts[0].File, parts[0].name, l.ops.Name(), ErrConfig))
		return nil
	}
	cols := shape[len(shape)-1]
	if useF8 {
		fw := kernels.FP8Weight{Shape: shape, Data: make([]byte, 0, numel(shape))}
		for i, p := range parts {
			var fp fp8Part
			if ts[i].DType == weights.F8E4M3 {
				var ok bool
				if fp, ok = l.readFP8(ts[i], p); !ok {
					return nil
				}
			} else {
				fp = quantizePart(ts[i], p)
			}
			if fw.BlockK == 0 {
				fw.BlockK = fp.blockK
			}
			if fp.blockK != fw.BlockK {
				l.fail(fmt.Errorf("models: %s: tensor %q: blocks of %d columns, fused with blocks of %d: %w", ts[i].File, p.name, fp.blockK, fw.BlockK, ErrWeights))
				return nil
			}
			base := int32(len(fw.Scales) / max(1, (cols+fw.BlockK-1)/fw.BlockK))
			fw.Data = append(fw.Data, fp.data...)
			fw.Scales = append(fw.Scales, fp.scales...)
			for r := range p.rows {
				fw.ScaleRow = append(fw.ScaleRow, base+int32(r/fp.rowBlock))
			}
		}
		dst, err := f8.FP8Weight(fw)
		if err != nil {
			l.fail(fmt.Errorf("models: %s: tensor %q: %w", ts[0].File, parts[0].name, err))
			return nil
		}
		l.count(kernels.F8E4M3, int64(len(fw.Data)+4*len(fw.Scales)))
		return dst
	}
	dt := kernels.F32
	if nf8 == 0 && len(dtypes) == 1 {
		for d := range dtypes {
			dt = d
		}
	}
	dst, err := kernels.AllocWeight(l.ops, dt, shape...)
	if err != nil {
		l.fail(fmt.Errorf("models: tensor %q: %w", parts[0].name, err))
		return nil
	}
	flat, err := l.ops.Reshape(dst, numel(shape)/max(cols, 1), cols)
	lo := 0
	for i, p := range parts {
		if err != nil {
			break
		}
		var view kernels.Tensor
		view, err = l.ops.Rows(flat, lo, lo+p.rows)
		if err != nil {
			break
		}
		data, src := ts[i].Data, dt
		if ts[i].DType == weights.F8E4M3 {
			fp, ok := l.readFP8(ts[i], p)
			if !ok {
				return nil
			}
			data = kernels.F32Bytes(weights.DequantizeFP8Blocks(fp.data, fp.scales, p.rows, p.cols, fp.rowBlock, fp.blockK))
		} else {
			src, _ = toKernelDType(ts[i].DType)
		}
		if err = l.ops.Upload(view, data, src); err != nil {
			err = fmt.Errorf("tensor %q: %w", p.name, err)
		}
		lo += p.rows
	}
	if err != nil {
		l.fail(fmt.Errorf("models: %w", err))
		return nil
	}
	l.count(dt, int64(numel(shape)*dt.Size()))
	return dst
}

func (l *loader) count(dt kernels.DType, n int64) { l.countName(dt.String(), n) }

func (l *loader) countName(format string, n int64) {
	if l.bytes == nil {
		l.bytes = map[string]int64{}
	}
	l.bytes[format] += n
}

// sameStored reports whether the tensors a and b are stored as the same
// dtype, shape and bytes, FP8 scales ("_scale_inv") included, so that one
// loaded copy serves both. False when either is missing or stored
// block-quantized (a GGUF file's blocks are not compared). Cost: one pass
// over both tensors' bytes.
func (l *loader) sameStored(a, b string) bool {
	if !l.src.Has(a) || !l.src.Has(b) {
		return false
	}
	if bs, ok := l.src.(blockSource); ok {
		for _, name := range []string{a, b} {
			if _, quant, err := bs.Blocks(name); err != nil || quant {
				return false
			}
		}
	}
	same := func(a, b string) bool {
		ta, err := l.src.Tensor(a)
		if err != nil {
			return false
		}
		tb, err := l.src.Tensor(b)
		return err == nil && ta.DType == tb.DType && slices.Equal(ta.Shape, tb.Shape) && bytes.Equal(ta.Data, tb.Data)
	}
	sa, sb := a+"_scale_inv", b+"_scale_inv"
	if l.src.Has(sa) || l.src.Has(sb) {
		return same(a, b) && same(sa, sb)
	}
	return same(a, b)
}

// matrix uploads a weight in its stored dtype (FP8 with its scales): the
// embeddings, LM head, router and other matrices that stay as stored.
func (l *loader) matrix(name string, shape ...int) kernels.Tensor {
	return l.weight(false, name, shape...)
}

// linear is matrix for the weight of a linear layer, quantized to FP8 at
// load when the loader quantizes.
func (l *loader) linear(name string, shape ...int) kernels.Tensor {
	return l.weight(true, name, shape...)
}

// quantParts reads the parts stored block-quantized (a GGUF file's Q8_0,
// Q4_K, ...). It returns nil when none is, every part when all are, and
// fails (ok false) when only some are or a part's shape is not its own.
func (l *loader) quantParts(parts []part) (qs []QuantTensor, ok bool) {
	src, isBlocks := l.src.(blockSource)
	if !isBlocks {
		return nil, true
	}
	floatPart := -1
	for i, p := range parts {
		q, isQuant, err := src.Blocks(p.name)
		if err != nil {
			l.fail(err)
			return nil, false
		}
		if !isQuant {
			if !l.src.Has(p.name) {
				l.get(p.name, p.rows, p.cols) // fails naming the tensor
				return nil, false
			}
			floatPart = i
			continue
		}
		if !slices.Equal(q.Shape, []int{p.rows, p.cols}) {
			l.fail(fmt.Errorf("models: %s: tensor %q has shape %v, want %v: %w", q.File, p.name, q.Shape, []int{p.rows, p.cols}, ErrWeights))
			return nil, false
		}
		qs = append(qs, q)
	}
	if len(qs) > 0 && floatPart >= 0 {
		l.fail(fmt.Errorf("models: %s: tensor %q is stored as floats and %q as %v: a fused weight's parts must all be block-quantized or all floats: %w",
			qs[0].File, parts[floatPart].name, qs[0].Name, qs[0].Type, ErrWeights))
		return nil, false
	}
	return qs, true
}

// buildQuant loads a weight whose parts are all block-quantized, kept in
// their blocks by a backend with their kernels.
func (l *loader) buildQuant(shape []int, parts []part, qs []QuantTensor) kernels.Tensor {
	qw, ok := l.ops.(kernels.QuantWeighter)
	if !ok {
		l.fail(fmt.Errorf("models: %s: tensor %q is %v: block-quantized weights need a backend with their kernels, and %s has none "+
			"(run it on the cpu device, or use a GGUF file in F32, F16 or BF16): %w", qs[0].File, qs[0].Name, qs[0].Type, l.ops.Name(), ErrConfig))
		return nil
	}
	w := kernels.QuantWeight{Shape: shape, Parts: make([]kernels.QuantPart, len(parts))}
	for i, q := range qs {
		w.Parts[i] = kernels.QuantPart{Type: q.Type, Rows: parts[i].rows, Data: q.Data}
	}
	dst, err := qw.QuantWeight(w)
	if err != nil {
		l.fail(fmt.Errorf("models: %s: tensor %q: %w", qs[0].File, qs[0].Name, err))
		return nil
	}
	for _, q := range qs {
		l.countName(q.Type.String(), int64(len(q.Data)))
	}
	return dst
}

// weight loads one stored tensor: a matrix, or a 1-D or 3-D float tensor.
func (l *loader) weight(quantize bool, name string, shape ...int) kernels.Tensor {
	if len(shape) == 2 {
		return l.build(quantize, shape, []part{{name, shape[0], shape[1]}})
	}
	// 1-D and 3-D tensors (stacked experts stored whole) stay as stored.
	t, ok := l.get(name, shape...)
	if !ok {
		return nil
	}
	dt, _ := toKernelDType(t.DType)
	dst, err := kernels.AllocWeight(l.ops, dt, shape...)
	if err == nil {
		err = l.ops.Upload(dst, t.Data, dt)
	}
	if err != nil {
		l.fail(fmt.Errorf("models: tensor %q: %w", name, err))
		return nil
	}
	l.count(dt, int64(len(t.Data)))
	return dst
}

// fused stacks several linear weights along dimension 0 into one tensor:
// parts[i] has rows[i] rows of cols columns (see build for its dtype).
func (l *loader) fused(cols int, names []string, rows []int) kernels.Tensor {
	parts := make([]part, len(names))
	total := 0
	for i, name := range names {
		parts[i] = part{name, rows[i], cols}
		total += rows[i]
	}
	return l.build(true, []int{total, cols}, parts)
}

// vector uploads a 1-D parameter (norm weight, bias) converted to the
// activation dtype.
func (l *loader) vector(name string, n int) kernels.Tensor {
	t, ok := l.get(name, n)
	if !ok {
		return nil
	}
	dt, ok := toKernelDType(t.DType)
	if !ok {
		l.fail(fmt.Errorf("models: %s: tensor %q has dtype %v, want F32, BF16 or F16: %w", t.File, name, t.DType, ErrWeights))
		return nil
	}
	act := l.ops.ActivationDType()
	dst, err := kernels.AllocWeight(l.ops, act, n)
	if err == nil {
		err = l.ops.Upload(dst, t.Data, dt)
	}
	if err != nil {
		l.fail(fmt.Errorf("models: tensor %q: %w", name, err))
		return nil
	}
	return dst
}

// optVector is vector for a parameter that may be absent (nil then).
func (l *loader) optVector(name string, n int) kernels.Tensor {
	if l.err != nil || !l.src.Has(name) {
		return nil
	}
	return l.vector(name, n)
}

// fusedVector concatenates 1-D parameters (e.g. gate and up biases) in the
// activation dtype; nil when the first is absent.
func (l *loader) fusedVector(names []string, sizes []int) kernels.Tensor {
	if l.err != nil || !l.src.Has(names[0]) {
		return nil
	}
	total := 0
	for _, s := range sizes {
		total += s
	}
	dst, err := kernels.AllocWeight(l.ops, l.ops.ActivationDType(), total)
	if err != nil {
		l.fail(err)
		return nil
	}
	lo := 0
	for i, name := range names {
		t, ok := l.get(name, sizes[i])
		if !ok {
			return nil
		}
		dt, ok := toKernelDType(t.DType)
		if !ok {
			l.fail(fmt.Errorf("models: %s: tensor %q has dtype %v, want F32, BF16 or F16: %w", t.File, name, t.DType, ErrWeights))
			return nil
		}
		view, err := l.ops.Rows(dst, lo, lo+sizes[i])
		if err == nil {
			err = l.ops.Upload(view, t.Data, dt)
		}
		if err != nil {
			l.fail(fmt.Errorf("models: tensor %q: %w", name, err))
			return nil
		}
		lo += sizes[i]
	}
	return dst
}

// numel is the product of shape.
func numel(shape []int) int {
	n := 1
	for _, d := range shape {
		n *= d
	}
	return n
}

// loadExpertParts reads e experts stored one module per expert
// (<prefix><i>.<gate>.weight, .<up>, .<down>) into the stacked layout of
// the MoE kernel: gate_up [e, 2*inter, h] (gate rows first), down [e, h,
// inter]. FP8 experts keep their bytes and per-expert scales.
func loadExpertParts(l *loader, prefix string, e, h, inter int, gate, up, down string) (kernels.Tensor, kernels.Tensor) {
	gu := make([]part, 0, 2*e)
	dn := make([]part, 0, e)
	for i := range e {
		p := fmt.Sprintf("%s%d.", prefix, i)
		gu = append(gu, part{p + gate + ".weight", inter, h}, part{p + up + ".weight", inter, h})
		dn = append(dn, part{p + down + ".weight", h, inter})
	}
	return l.build(true, []int{e, 2 * inter, h}, gu), l.build(true, []int{e, h, inter}, dn)
}
