package cuda

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/deepinfer/deepinfer-go/kernels"
	"github.com/deepinfer/deepinfer-go/kernels/sampling"
)

// Sampling on the device against kernels/sampling. Every random row is also
// sampled with no shared-memory candidates (the global-memory path), which
// must give the same token bit for bit: the kernel's sums are exact.

// sampleLogits is one row of logits: N(0, scale^2) (kind 0), a few distinct
// values with many ties (1), ties with zeros of both signs (2) or nearly
// flat (3).
func sampleLogits(r *rand.Rand, vocab int, scale float64, kind int) []float32 {
	z := make([]float32, vocab)
	for i := range z {
		switch kind {
		case 0:
			z[i] = float32(r.NormFloat64() * scale)
		case 1:
			z[i] = float32(r.IntN(7)-3) * float32(scale) / 4
		case 2:
			v := float32(r.IntN(5) - 2)
			if v == 0 && r.IntN(2) == 0 {
				v = float32(math.Copysign(0, -1))
			}
			z[i] = v * float32(scale)
		default:
			z[i] = float32(r.Float64() * 0.01 * scale)
		}
	}
	return z
}

// sampleParamSets names the parameter sets of the tests.
var sampleParamSets = []string{"greedy", "temperature", "top_k", "top_p", "min_p", "combined", "large top_k", "top_p near 1"}

// sampleRow draws a row of parameter set which; a third of the rows also
// get penalties, biases and masked ids (edits).
func sampleRow(r *rand.Rand, vocab, which int) kernels.SampleRow {
	s := kernels.SampleRow{Temperature: 1, TopP: 1, RepetitionPenalty: 1, Seed: r.Uint64(), Step: uint64(r.IntN(1 << 20))}
	switch sampleParamSets[which] {
	case "greedy":
		s.Greedy = true
	case "temperature":
		s.Temperature = 0.3 + r.Float32()*1.5
	case "top_k":
		s.TopK, s.Temperature = 1+r.IntN(min(vocab, 300)), 0.7
	case "top_p":
		s.TopP, s.Temperature = 0.05+r.Float32()*0.9, 0.5+r.Float32()
	case "min_p":
		s.MinP, s.Temperature = r.Float32()*0.3, 0.8
	case "combined":
		s.Temperature, s.TopK, s.TopP, s.MinP = 0.7, 50, 0.9, 0.05
	case "large top_k":
		s.TopK, s.TopP = vocab/2+1, 0.95
	case "top_p near 1":
		s.TopP, s.Temperature = 0.9999999, 2
	}
	if r.IntN(3) == 0 {
		s.RepetitionPenalty = 0.8 + r.Float32()*0.6
		s.PresencePenalty = r.Float32() - 0.5
		s.FrequencyPenalty = r.Float32() * 0.4
		seen := map[int32]bool{}
		for range r.IntN(200) {
			e := kernels.LogitEdit{Token: int32(r.IntN(vocab))}
			if seen[e.Token] {
				continue
			}
			if r.IntN(5) == 0 {
				e.Flags |= kernels.EditMask
			}
			if r.IntN(3) == 0 {
				e.Flags |= kernels.EditBias
				e.Bias = float32(r.NormFloat64() * 3)
			}
			if r.IntN(2) == 0 {
				e.Flags |= kernels.EditSeen
				if r.IntN(2) == 0 {
					e.Count = int32(1 + r.IntN(4))
				}
			}
			if e.Flags != 0 {
				seen[e.Token] = true
				s.Edits = append(s.Edits, e)
			}
		}
	}
	return s
}

// sampleCase is a batch of rows for the device and its host reference.
type sampleCase struct {
	vocab  int
	rows   []kernels.SampleRow
	logits [][]float32
}

func (c *sampleCase) flat() []float32 {
	out := make([]float32, 0, len(c.rows)*c.vocab)
	for _, z := range c.logits {
		out = append(out, z...)
	}
	return out
}

// host samples every row with kernels/sampling, returning the tokens (-1
// for an error) and the processed rows.
func (c *sampleCase) host() ([]int32, [][]float32) {
	toks := make([]int32, len(c.rows))
	proc := make([][]float32, len(c.rows))
	var wg sync.WaitGroup
	workers := runtime.NumCPU()
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s := new(sampling.Scratch)
			for r := w; r < len(c.rows); r += workers {
				z := append([]float32(nil), c.logits[r]...)
				res, err := sampling.Sample(z, &c.rows[r], s)
				toks[r], proc[r] = res.Token, z
				if err != nil {
					toks[r] = -1
				}
			}
		}()
	}
	wg.Wait()
	return toks, proc
}

// device uploads the logits and samples them with at most maxCand
// candidates in shared memory; it returns the host copy of the tokens, the
// downloaded device tokens and the processed logits.
func (c *sampleCase) device(t *testing.T, g *Backend, maxCand int) (host, dev []int32, proc []float32) {
	t.Helper()
	logits := upload(t, g, kernels.F32, kernels.F32Bytes(c.flat()), kernels.F32, len(c.rows), c.vocab)
	tokens, host, err := g.sampleTokens(logits, c.rows, maxCand)
	if err != nil {
		t.Fatal(err)
	}
	dev, err = kernels.ToI32(g, tokens)
	if err != nil {
		t.Fatal(err)
	}
	proc, err = kernels.ToF32(g, logits)
	if err != nil {
		t.Fatal(err)
	}
	return host, dev, proc
}

// Greedy rows give the host's token exactly; random rows agree with the host
// except near rounding ties (at least 99.9% of them); the global-memory path
// gives the same tokens as the shared-memory one; the edits leave the host's
// processed logits bit for bit; the device tensor holds the host copy.
func TestGPUSampleMatchesHost(t *testing.T) {
	g := newGPU(t, GEMMRound)
	r := rand.New(rand.NewPCG(11, 17))
	var greedy, greedyOK, random, randomOK int
	for _, vc := range []struct{ vocab, rows int }{{1000, 512}, {32000, 192}, {151936, 64}} {
		for kind := range 4 {
			for _, scale := range []float64{1, 3, 8} {
				if kind > 0 && scale == 8 {
					continue
				}
				c := sampleCase{vocab: vc.vocab}
				for i := range vc.rows {
					c.rows = append(c.rows, sampleRow(r, vc.vocab, i%len(sampleParamSets)))
					c.logits = append(c.logits, sampleLogits(r, vc.vocab, scale, kind))
				}
				start := time.Now()
				want, wantProc := c.host()
				hostTime := time.Since(start)
				host, dev, proc := c.device(t, g, maxSampleCandidates)
				hostG, _, procG := c.device(t, g, 0)
				var g1, g1ok, r1, r1ok, procBad int
				for i := range c.rows {
					if host[i] != dev[i] {
						t.Fatalf("vocab %d row %d: host copy %d, device tensor %d", vc.vocab, i, host[i], dev[i])
					}
					if host[i] != hostG[i] {
						t.Errorf("vocab %d kind %d row %d (%+v): shared-memory path %d, global path %d", vc.vocab, kind, i, c.rows[i], host[i], hostG[i])
					}
					for j := range c.vocab {
						w, d, dg := wantProc[i][j], proc[i*c.vocab+j], procG[i*c.vocab+j]
						if math.Float32bits(w) != math.Float32bits(d) || math.Float32bits(d) != math.Float32bits(dg) {
							procBad++
							if procBad < 4 {
								t.Errorf("vocab %d row %d: processed logit %d: host %v, device %v / %v", vc.vocab, i, j, w, d, dg)
							}
							break
						}
					}
					if want[i] < 0 {
						t.Fatalf("vocab %d row %d: the host sampler failed on a valid row", vc.vocab, i)
					}
					if c.rows[i].Greedy {
						g1++
						if host[i] == want[i] {
							g1ok++
						} else {
							t.Errorf("vocab %d kind %d scale %g row %d: greedy token %d, host %d", vc.vocab, kind, scale, i, host[i], want[i])
						}
						continue
					}
					r1++
					if host[i] == want[i] {
						r1ok++
					} else {
						t.Logf("vocab %d kind %d scale %g row %d (%s, T %v, k %d, p %v, min_p %v, %d edits): device %d, host %d",
							vc.vocab, kind, scale, i, sampleParamSets[i%len(sampleParamSets)], c.rows[i].Temperature, c.rows[i].TopK,
							c.rows[i].TopP, c.rows[i].MinP, len(c.rows[i].Edits), host[i], want[i])
					}
				}
				greedy, greedyOK, random, randomOK = greedy+g1, greedyOK+g1ok, random+r1, randomOK+r1ok
				t.Logf("sample vocab %d logits kind %d scale %g: greedy %d/%d exact, random %d/%d agree; paths identical, edits bit-exact in %d/%d rows (host %v)",
					vc.vocab, kind, scale, g1ok, g1, r1ok, r1, len(c.rows)-procBad, len(c.rows), hostTime.Round(time.Millisecond))
			}
		}
	}
	agree := float64(randomOK) / float64(random)
	t.Logf("sample agreement: greedy %d/%d exact, random %d/%d (%.4f%%) with the host sampler", greedyOK, greedy, randomOK, random, 100*agree)
	if agree < 0.999 {
		t.Errorf("random rows agree with the host in %.4f%% of %d rows, want >= 99.9%%", 100*agree, random)
	}
}

// A top-p limit within the host's margin of a bin edge makes the host sort
// every bin up to the boundary; the device must walk the same order.
func TestGPUSampleTopPMargin(t *testing.T) {
	g := newGPU(t, GEMMRound)
	r := rand.New(rand.NewPCG(5, 6))
	const vocab = 64
	c := sampleCase{vocab: vocab}
	found := 0
	for n0 := 1; n0 <= 6 && found < 4; n0++ {
		for k := 1; k <= 40 && found < 4; k++ {
			for zi := range 20000 {
				z := float32(-0.1 - float64(zi)*0.00037)
				total := float64(n0) + float64(k)*math.Exp(float64(z))
				tp := float32(float64(n0) / total)
				limit := float64(tp) * total
				if tp >= 1 || math.Abs(limit-float64(n0)) >= 2e-10*limit {
					continue
				}
				lg := make([]float32, vocab)
				for i := range lg {
					lg[i] = float32(math.Inf(-1))
				}
				perm := r.Perm(vocab)
				for i := range n0 {
					lg[perm[i]] = 0
				}
				for i := range k {
					lg[perm[n0+i]] = z
				}
				for step := range 16 {
					c.rows = append(c.rows, kernels.SampleRow{Temperature: 1, TopP: tp, RepetitionPenalty: 1, Seed: r.Uint64(), Step: uint64(step)})
					c.logits = append(c.logits, lg)
				}
				found++
				break
			}
		}
	}
	want, _ := c.host()
	host, _, _ := c.device(t, g, maxSampleCandidates)
	hostG, _, _ := c.device(t, g, 0)
	ok := 0
	for i := range c.rows {
		if host[i] == want[i] && hostG[i] == want[i] {
			ok++
		} else {
			t.Errorf("row %d (top_p %v): device %d / %d (global path), host %d", i, c.rows[i].TopP, host[i], hostG[i], want[i])
		}
	}
	t.Logf("sample top-p at the margin: %d/%d rows agree (%d limits)", ok, len(c.rows), found)
}

// A row's token does not depend on the other rows of the call, and two calls
// give the same tokens.
func TestGPUSampleInvariance(t *testing.T) {
	g := newGPU(t, GEMMRound)
	r := rand.New(rand.NewPCG(8, 9))
	const vocab = 32000
	c := sampleCase{vocab: vocab}
	for i := range 64 {
		c.rows = append(c.rows, sampleRow(r, vocab, i%len(sampleParamSets)))
		c.logits = append(c.logits, sampleLogits(r, vocab, 3, 0))
	}
	all, _, _ := c.device(t, g, maxSampleCandidates)
	again, _, _ := c.device(t, g, maxSampleCandidates)
	for i := range c.rows {
		one := sampleCase{vocab: vocab, rows: c.rows[i : i+1], logits: c.logits[i : i+1]}
		alone, _, _ := one.device(t, g, maxSampleCandidates)
		if alone[0] != all[i] || again[i] != all[i] {
			t.Errorf("row %d: %d in a batch of 64, %d alone, %d in a second call", i, all[i], alone[0], again[i])
		}
	}
	t.Logf("sample invariance: 64 rows, alone = in a batch of 64 = second call")
}

// SampleTokensAsync hands out the device tokens at once: work queued after
// it (here a long dependent chain) does not hold up the host copy, which
// equals the synchronous call's tokens and the device tensor; at most two
// fetches may be outstanding.
func TestGPUSampleAsync(t *testing.T) {
	g := newGPU(t, GEMMRound)
	r := rand.New(rand.NewPCG(10, 11))
	const vocab = 32000
	c := sampleCase{vocab: vocab}
	for i := range 16 {
		c.rows = append(c.rows, sampleRow(r, vocab, i%len(sampleParamSets)))
		c.logits = append(c.logits, sampleLogits(r, vocab, 3, 0))
	}
	want, _, _ := c.device(t, g, maxSampleCandidates)
	logits := upload(t, g, kernels.F32, kernels.F32Bytes(c.flat()), kernels.F32, len(c.rows), vocab)
	tokens, fetch, err := g.SampleTokensAsync(logits, c.rows)
	if err != nil {
		t.Fatal(err)
	}
	// Work queued behind the sampling that reads its tokens, as the next
	// forward pass does.
	ids := upload(t, g, kernels.I32, kernels.I32Bytes(make([]int32, len(c.rows))), kernels.I32, len(c.rows))
	from := make([]int32, len(c.rows))
	for i := range from {
		from[i] = int32(i)
	}
	fromRow := upload(t, g, kernels.I32, kernels.I32Bytes(from), kernels.I32, len(c.rows))
	if err := g.ResolvePlaceholders(ids, fromRow, tokens); err != nil {
		t.Fatal(err)
	}
	big := upload(t, g, kernels.F32, kernels.F32Bytes(randVals(r, 1<<22, 1)), kernels.F32, 1<<22)
	for range 200 {
		if err := g.Add(big, big, big); err != nil {
			t.Fatal(err)
		}
	}
	start := time.Now()
	host, err := fetch()
	if err != nil {
		t.Fatal(err)
	}
	waited := time.Since(start)
	resolved, err := kernels.ToI32(g, ids)
	if err != nil {
		t.Fatal(err)
	}
	for i := range want {
		if host[i] != want[i] || resolved[i] != want[i] {
			t.Fatalf("row %d: asynchronous %d (resolved on the device %d), synchronous %d", i, host[i], resolved[i], want[i])
		}
	}
	// Three outstanding fetches: the third is refused.
	_, f1, err := g.SampleTokensAsync(logits, c.rows)
	if err != nil {
		t.Fatal(err)
	}
	_, f2, err := g.SampleTokensAsync(logits, c.rows)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := g.SampleTokensAsync(logits, c.rows); err == nil {
		t.Error("a third outstanding fetch: no error")
	}
	for _, f := range []func() ([]int32, error){f1, f2} {
		if _, err := f(); err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("sample async: %d rows equal to the synchronous call; the host copy arrived %v after 200 queued adds of 16 MB", len(want), waited)
}

// NaN and +Inf logits and rows left with only -Inf are errors naming the
// row; the backend keeps working afterwards.
func TestGPUSampleErrors(t *testing.T) {
	g := newGPU(t, GEMMRound)
	r := rand.New(rand.NewPCG(3, 4))
	const vocab, rows = 1000, 6
	tests := []struct {
		name   string
		greedy bool
		edit   func(z []float32, row *kernels.SampleRow)
		reason string
		index  int
	}{
		{"NaN", false, func(z []float32, _ *kernels.SampleRow) { z[17], z[400] = float32(math.NaN()), float32(math.NaN()) }, "NaN", 17},
		{"NaN greedy", true, func(z []float32, _ *kernels.SampleRow) { z[999] = float32(math.NaN()) }, "NaN", 999},
		{"+Inf", false, func(z []float32, _ *kernels.SampleRow) { z[33], z[70] = float32(math.Inf(1)), float32(math.Inf(1)) }, "+Inf", 33},
		{"-Inf row", false, func(z []float32, _ *kernels.SampleRow) {
			for i := range z {
				z[i] = float32(math.Inf(-1))
			}
		}, "all -Inf", -1},
		{"all masked", true, func(_ []float32, row *kernels.SampleRow) {
			for i := range vocab {
				row.Edits = append(row.Edits, kernels.LogitEdit{Token: int32(i), Flags: kernels.EditMask})
			}
		}, "all -Inf", -1},
		{"bias to +Inf", false, func(z []float32, row *kernels.SampleRow) {
			z[5] = 3e38
			row.Edits = append(row.Edits, kernels.LogitEdit{Token: 5, Bias: 3e38, Flags: kernels.EditBias})
		}, "+Inf", 5},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			const bad = 3
			c := sampleCase{vocab: vocab}
			for i := range rows {
				row := sampleRow(r, vocab, 1)
				row.Edits, row.Greedy = nil, tc.greedy
				c.rows = append(c.rows, row)
				c.logits = append(c.logits, sampleLogits(r, vocab, 2, 0))
				if i == bad {
					tc.edit(c.logits[i], &c.rows[i])
				}
			}
			logits := upload(t, g, kernels.F32, kernels.F32Bytes(c.flat()), kernels.F32, rows, vocab)
			_, _, err := g.SampleTokens(logits, c.rows)
			var rowErr *kernels.SampleRowError
			if !errors.As(err, &rowErr) || !errors.Is(err, kernels.ErrInvalidLogits) {
				t.Fatalf("got %v, want a *kernels.SampleRowError", err)
			}
			if rowErr.Row != bad || rowErr.Reason != tc.reason || rowErr.Index != tc.index {
				t.Errorf("got row %d reason %q index %d, want row %d %q %d", rowErr.Row, rowErr.Reason, rowErr.Index, bad, tc.reason, tc.index)
			}
			if err := g.Sync(); err != nil {
				t.Fatalf("the error stayed in the device check word: %v", err)
			}
			// The same rows without the bad one sample fine.
			c.rows, c.logits = append(c.rows[:bad:bad], c.rows[bad+1:]...), append(c.logits[:bad:bad], c.logits[bad+1:]...)
			c.device(t, g, maxSampleCandidates)
			t.Logf("sample error %s: %v", tc.name, err)
		})
	}
	// A NaN at a masked id is not an error (the host masks it first).
	c := sampleCase{vocab: vocab, rows: []kernels.SampleRow{sampleRow(r, vocab, 3)}, logits: [][]float32{sampleLogits(r, vocab, 1, 0)}}
	c.rows[0].Edits = []kernels.LogitEdit{{Token: 9, Flags: kernels.EditMask}}
	c.logits[0][9] = float32(math.NaN())
	want, _ := c.host()
	if got, _, _ := c.device(t, g, maxSampleCandidates); got[0] != want[0] {
		t.Errorf("masked NaN: device %d, host %d", got[0], want[0])
	}
	// Arguments are checked before any launch.
	logits := upload(t, g, kernels.F32, kernels.F32Bytes(make([]float32, 2*vocab)), kernels.F32, 2, vocab)
	if _, _, err := g.SampleTokens(logits, c.rows); !errors.Is(err, kernels.ErrShape) {
		t.Errorf("2 logits rows for 1 sample row: %v, want ErrShape", err)
	}
}

// BenchmarkGPUSample compares sampling on the device (SampleTokens: upload
// of the rows, the kernel, download of the tokens) with the host path it
// replaces (download of the logits, kernels/sampling on one worker per core
// as the sample stage does), on a Qwen-size vocabulary.
func BenchmarkGPUSample(b *testing.B) {
	g := newGPU(b, GEMMRound)
	const vocab = 151936
	r := rand.New(rand.NewPCG(1, 2))
	params := []struct {
		name string
		row  kernels.SampleRow
	}{
		{"greedy", kernels.SampleRow{Greedy: true, TopP: 1, RepetitionPenalty: 1}},
		{"top_k=50,top_p=0.9,T=0.7", kernels.SampleRow{Temperature: 0.7, TopK: 50, TopP: 0.9, RepetitionPenalty: 1}},
		{"T=1", kernels.SampleRow{Temperature: 1, TopP: 1, RepetitionPenalty: 1}},
		{"top_p=0.9,T=1", kernels.SampleRow{Temperature: 1, TopP: 0.9, RepetitionPenalty: 1}},
	}
	for _, batch := range []int{1, 32, 256} {
		flat := make([]float32, 0, batch*vocab)
		for range batch {
			flat = append(flat, sampleLogits(r, vocab, 2.5, 0)...)
		}
		logits := upload(b, g, kernels.F32, kernels.F32Bytes(flat), kernels.F32, batch, vocab)
		for _, pc := range params {
			rows := make([]kernels.SampleRow, batch)
			for i := range rows {
				rows[i] = pc.row
				rows[i].Seed, rows[i].Step = uint64(i), 7
			}
			b.Run(fmt.Sprintf("batch=%d/%s", batch, pc.name), func(b *testing.B) {
				var dev []int32
				for step := 0; b.Loop(); step++ {
					for i := range rows {
						rows[i].Step = uint64(step)
					}
					_, host, err := g.SampleTokens(logits, rows)
					if err != nil {
						b.Fatal(err)
					}
					dev = host
				}
				devUs := float64(b.Elapsed().Microseconds()) / float64(b.N)
				// The host path, timed here too: download, then sample.
				const hostIters = 3
				buf := make([]float32, batch*vocab)
				scratch := make([]*sampling.Scratch, runtime.NumCPU())
				for i := range scratch {
					scratch[i] = new(sampling.Scratch)
				}
				var hostTok []int32
				start := time.Now()
				for range hostIters {
					var err error
					if buf, err = kernels.ToF32Into(g, logits, buf); err != nil {
						b.Fatal(err)
					}
					hostTok = hostSampleRows(b, buf, vocab, rows, scratch)
				}
				hostUs := float64(time.Since(start).Microseconds()) / hostIters
				same := 0
				for i := range rows {
					if hostTok[i] == dev[i] {
						same++
					}
				}
				b.ReportMetric(devUs, "device-us/op")
				b.ReportMetric(hostUs, "host-us/op")
				b.Logf("sample batch %d vocab %d %s: device %.1f us, download+host %.1f us (%.1fx); last step's tokens %d/%d equal",
					batch, vocab, pc.name, devUs, hostUs, hostUs/devUs, same, batch)
			})
		}
	}
}

// hostSampleRows samples rows (no edits) from the flat logits with one
// worker per core over contiguous row ranges, as the sample stage does.
func hostSampleRows(b *testing.B, flat []float32, vocab int, rows []kernels.SampleRow, scratch []*sampling.Scratch) []int32 {
	out := make([]int32, len(rows))
	n := len(rows)
	workers := min(len(scratch), max(1, n/8))
	var wg sync.WaitGroup
	for w := range workers {
		lo, hi := w*n/workers, (w+1)*n/workers
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := lo; i < hi; i++ {
				res, err := sampling.Sample(flat[i*vocab:(i+1)*vocab], &rows[i], scratch[w])
				if err != nil {
					b.Error(err)
					return
				}
				out[i] = res.Token
			}
		}()
	}
	wg.Wait()
	return out
}

// Sampling calls cut each row into chunks for the whole-row passes
// (Options.SampleSplitRows, default every call; at least
// Options.SampleMinChunks, 4, a row): the tokens and the processed
// logits are those of one block per row, for every parameter set and kind
// of logits, with and without edits, for a few rows (many chunks a row)
// and for 300 (the fewest).
func TestGPUSampleChunks(t *testing.T) {
	whole := newGPUOpts(t, Options{SampleSplitRows: -1})
	chunked := newGPU(t, GEMMRound)
	r := rand.New(rand.NewPCG(3, 9))
	var rows, random int
	for _, vocab := range []int{151936, 32000, 1003} {
		for _, n := range []int{1, 3, 17, 300} {
			if n == 300 && vocab > 32000 {
				continue // the test's host side would take longest here, for no new case
			}
			for kind := range 4 {
				c := sampleCase{vocab: vocab}
				for i := range n {
					c.rows = append(c.rows, sampleRow(r, vocab, (i+kind+n)%len(sampleParamSets)))
					c.logits = append(c.logits, sampleLogits(r, vocab, 3, kind))
				}
				for _, maxCand := range []int{maxSampleCandidates, 0} {
					want, _, wantProc := c.device(t, whole, maxCand)
					got, _, proc := c.device(t, chunked, maxCand)
					for i := range c.rows {
						if got[i] != want[i] {
							t.Fatalf("vocab %d, %d rows, kind %d, row %d (%+v): token %d in chunks, %d in one block",
								vocab, n, kind, i, c.rows[i], got[i], want[i])
						}
						if !c.rows[i].Greedy {
							random++
						}
					}
					for j := range proc {
						if math.Float32bits(proc[j]) != math.Float32bits(wantProc[j]) {
							t.Fatalf("vocab %d, %d rows, kind %d: processed logit %d = %v in chunks, %v in one block",
								vocab, n, kind, j, proc[j], wantProc[j])
						}
					}
					rows += n
				}
			}
		}
	}
	t.Logf("sample in chunks: %d rows (%d random) give the tokens and processed logits of one block a row", rows, random)
}

// A call of greedy rows alone (one launch up to sampleGreedyWhole
// tokens, no mass pass above) gives each row the token, the processed
// logits and, for a bad row, the error of the same rows sampled in a call
// with a random row beside them (the chunk kernels with the mass pass),
// and the host's token; at vocabularies either side of the bound, with
// ties, edits and rows of NaN, +Inf and all -Inf.
func TestGPUSampleAllGreedy(t *testing.T) {
	g := newGPU(t, GEMMRound)
	r := rand.New(rand.NewPCG(5, 11))
	random := sampleRow(r, 100, 1) // "temperature"
	for _, vocab := range []int{8192, sampleGreedyWhole, sampleGreedyWhole + 1, 151936} {
		for _, n := range []int{1, 3, 64} {
			for kind := range 4 {
				c := sampleCase{vocab: vocab}
				for i := range n {
					c.rows = append(c.rows, sampleRow(r, vocab, 0))
					c.logits = append(c.logits, sampleLogits(r, vocab, 3, (kind+i)%4))
				}
				want, _ := c.host()
				got, _, proc := c.device(t, g, maxSampleCandidates)
				mixed := sampleCase{vocab: vocab, rows: append(append([]kernels.SampleRow{}, c.rows...), random),
					logits: append(append([][]float32{}, c.logits...), sampleLogits(r, vocab, 3, 0))}
				ref, _, refProc := mixed.device(t, g, maxSampleCandidates)
				for i := range c.rows {
					if got[i] != ref[i] || got[i] != want[i] {
						t.Fatalf("vocab %d, %d rows, kind %d, row %d: token %d greedy alone, %d beside a random row, %d on the host",
							vocab, n, kind, i, got[i], ref[i], want[i])
					}
				}
				for j := range proc {
					if math.Float32bits(proc[j]) != math.Float32bits(refProc[j]) {
						t.Fatalf("vocab %d, %d rows, kind %d: processed logit %d = %v greedy alone, %v beside a random row",
							vocab, n, kind, j, proc[j], refProc[j])
					}
				}
			}
			// Bad rows report the same error either way.
			bads := []func(z []float32){
				func(z []float32) { z[vocab-1] = float32(math.NaN()) },
				func(z []float32) { z[vocab/3] = float32(math.Inf(1)) },
				func(z []float32) {
					for i := range z {
						z[i] = float32(math.Inf(-1))
					}
				},
			}
			for b, bad := range bads {
				c := sampleCase{vocab: vocab}
				for range n {
					c.rows = append(c.rows, kernels.SampleRow{Greedy: true, TopP: 1, RepetitionPenalty: 1})
					c.logits = append(c.logits, sampleLogits(r, vocab, 2, 0))
				}
				bad(c.logits[n-1])
				mixed := sampleCase{vocab: vocab, rows: append(append([]kernels.SampleRow{}, c.rows...), random),
					logits: append(append([][]float32{}, c.logits...), sampleLogits(r, vocab, 3, 0))}
				var errs [2]*kernels.SampleRowError
				for k, cc := range []sampleCase{c, mixed} {
					logits := upload(t, g, kernels.F32, kernels.F32Bytes(cc.flat()), kernels.F32, len(cc.rows), vocab)
					_, _, err := g.SampleTokens(logits, cc.rows)
					if !errors.As(err, &errs[k]) {
						t.Fatalf("vocab %d, %d rows, bad row %d: got %v, want a *kernels.SampleRowError", vocab, n, b, err)
					}
					if err := g.Sync(); err != nil {
						t.Fatalf("the error stayed in the device check word: %v", err)
					}
				}
				if *errs[0] != *errs[1] || errs[0].Row != n-1 {
					t.Errorf("vocab %d, %d rows, bad row %d: greedy alone %+v, beside a random row %+v", vocab, n, b, *errs[0], *errs[1])
				}
			}
		}
	}
}

// Rows with an allowed-token mask (structured output) sample only allowed
// tokens, the masked logits are -Inf on the device as on the host, and the
// tokens match the host sampler's (greedy exactly, random rows except near
// rounding ties); rows without a mask in the same call are untouched by it.
func TestGPUSampleAllowedMask(t *testing.T) {
	g := newGPU(t, GEMMRound)
	r := rand.New(rand.NewPCG(23, 29))
	for _, vc := range []struct{ vocab, rows int }{{1000, 96}, {32001, 64}, {128256, 16}} {
		c := sampleCase{vocab: vc.vocab}
		words := (vc.vocab + 31) / 32
		for i := range vc.rows {
			row := sampleRow(r, vc.vocab, i%len(sampleParamSets))
			if i%3 != 2 {
				mask := make([]uint32, words)
				for range 1 + r.IntN(vc.vocab/8) {
					t := r.IntN(vc.vocab)
					mask[t/32] |= 1 << (t % 32)
				}
				if i%3 == 1 {
					for w := range mask[:words/2] { // dense words, skipped by the host
						mask[w] = ^uint32(0)
					}
				}
				row.Allowed = mask
			}
			c.rows = append(c.rows, row)
			c.logits = append(c.logits, sampleLogits(r, vc.vocab, 3, 0))
		}
		want, wantProc := c.host()
		host, _, proc := c.device(t, g, maxSampleCandidates)
		agree, random := 0, 0
		for i, row := range c.rows {
			tok := host[i]
			if row.Allowed != nil && row.Allowed[tok/32]>>(tok%32)&1 == 0 {
				t.Fatalf("vocab %d row %d: token %d is not allowed", vc.vocab, i, tok)
			}
			for j := range c.vocab {
				if math.Float32bits(wantProc[i][j]) != math.Float32bits(proc[i*c.vocab+j]) {
					t.Fatalf("vocab %d row %d: processed logit %d: host %v, device %v", vc.vocab, i, j, wantProc[i][j], proc[i*c.vocab+j])
				}
			}
			switch {
			case want[i] < 0:
				t.Fatalf("vocab %d row %d: the host sampler failed", vc.vocab, i)
			case row.Greedy && tok != want[i]:
				t.Errorf("vocab %d row %d: greedy token %d, host %d", vc.vocab, i, tok, want[i])
			case !row.Greedy:
				random++
				if tok == want[i] {
					agree++
				}
			}
		}
		t.Logf("allowed masks, vocab %d: %d/%d random rows agree with the host", vc.vocab, agree, random)
		if agree < random-1 {
			t.Errorf("vocab %d: only %d of %d random rows agree with the host", vc.vocab, agree, random)
		}
	}
}

// A call with the last call's parameters reads them from device memory
// without an upload; a call with other parameters uploads its own, and the
// first parameters then take effect again: greedy rows, then the same rows
// with each argmax masked (the second-best tokens), then the first rows.
func TestGPUSampleParamsReused(t *testing.T) {
	g := newGPU(t, GEMMRound)
	r := rand.New(rand.NewPCG(21, 22))
	const vocab = 1000
	plain := sampleCase{vocab: vocab}
	for i := range 3 {
		plain.rows = append(plain.rows, kernels.SampleRow{Greedy: true, TopP: 1, RepetitionPenalty: 1, Seed: 7, Step: uint64(i)})
		plain.logits = append(plain.logits, sampleLogits(r, vocab, 3, 0))
	}
	first, _, _ := plain.device(t, g, maxSampleCandidates)
	params := g.lastSample.t
	// The next decode step: greedy rows draw nothing, so their step does
	// not change their parameters.
	for i := range plain.rows {
		plain.rows[i].Step++
	}
	again, _, _ := plain.device(t, g, maxSampleCandidates)
	if g.lastSample.t != params {
		t.Error("the same parameters were uploaded again")
	}
	masked := sampleCase{vocab: vocab, logits: plain.logits}
	for i := range plain.rows {
		row := plain.rows[i]
		row.Edits = []kernels.LogitEdit{{Token: first[i], Flags: kernels.EditMask}}
		masked.rows = append(masked.rows, row)
	}
	second, _, _ := masked.device(t, g, maxSampleCandidates)
	if g.lastSample.t == params {
		t.Error("other parameters read the last call's")
	}
	third, _, _ := plain.device(t, g, maxSampleCandidates)
	for i := range first {
		if again[i] != first[i] || third[i] != first[i] || second[i] == first[i] {
			t.Errorf("row %d: argmax %d, again %d, after the masked call %d; masked %d (must differ)", i, first[i], again[i], third[i], second[i])
		}
	}
}
