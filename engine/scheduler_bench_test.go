package engine

import (
	"fmt"
	"runtime"
	"testing"
	"time"
)

// BenchmarkSchedulerDecode measures one strict decode step of the
// Scheduler alone (Schedule + ProcessOutputs, no model) with every
// sequence running: block appends every block_size steps, prefix-cache
// commits of each filled block, metadata for every sequence; reuse=true
// recycles the metadata of two steps back (ScheduleInto). cpu-ns/op is
// the process CPU time per step (GC included), which a busy machine does
// not inflate the way it inflates ns/op.
//
//	go test -run '^$' -bench SchedulerDecode -benchmem ./engine
//
// Scaling (reuse=true, cpu-ns/op, best of 3 interleaved runs on a 2-core
// machine with 2 MB of L2 per core):
//
//	running   before                  after
//	256        20 µs   4 allocs/op     20 µs   2 allocs/op
//	1024      104 µs  10 allocs/op     99 µs   2 allocs/op
//	4096      681 µs  35 allocs/op    602 µs   2 allocs/op
//
// Prediction: a superlinear data structure on the decode path (a sort, a
// queue insert or delete, a per-step rebuild). Outcome: there is none;
// every pass is O(running), and the cost per sequence (about 80 ns at 256,
// 100 at 1,024, 160 at 4,096) rises with the bytes a step touches, not
// with work: per sequence, 296 bytes of SequenceMetadata written, the hot
// lines of its Sequence read in Schedule and again in ProcessOutputs, one
// line of its token array (one page per sequence at these lengths) and,
// every block_size steps, a random prefix-table slot. At 256 sequences
// that fits in L2; at 4,096 it is several MB a step. Measured by phase at
// 4,096: Schedule ~215 µs, the benchmark's own pass over the metadata ~60
// µs, ProcessOutputs ~395 µs, of which the token append alone (one store
// per sequence, to a distinct page) is ~190 µs and the prefix-cache
// commits ~100 µs. Tried and dropped, no gain beyond the noise: Sequence
// fields regrouped by pass into line-aligned 64-byte groups, token arrays
// staggered so that sequences of equal length do not write the same cache
// sets, prefix commits hoisted into a pass of their own for overlapped
// misses, and loads issued 8-16 sequences ahead in ProcessOutputs (of the
// next Sequence, of its token slot, of the prefix-table slot its commit
// probes) so that misses overlap. What one token store costs: replacing
// the append in ProcessOutputs by a length bump (measurement only) takes
// ProcessOutputs at 4,096 from ~380 to ~185 µs, ~49 ns for one 8-byte
// store per sequence. Each token array (prompt + reserved output, 3.6 KB
// here) lies on a page of its own, and a standalone loop storing one word
// into each of 4,096 distinct pages after a 5 MB pass costs ~24 ns a
// store against ~2.4 ns for 4,096 adjacent lines: the cost is the page
// spread (TLB), which touch-ahead loads do not hide. Kept: block tables
// get room for the sequence's remaining output at admission
// (BlockManager.tableHeadroom), so decoding no longer
// reallocates them every few blocks (the allocations that grew with the
// running count). The ≤200 µs goal at 4,096 needs fewer bytes per
// sequence per step (a smaller metadata record or per-step deltas),
// which changes what the stages downstream read.
func BenchmarkSchedulerDecode(b *testing.B) {
	const (
		promptLen = 64
		blockSize = 16
		epoch     = 256                     // steps before the sequences are rebuilt
		maxLen    = promptLen + epoch + 128 // the fill decodes up to ~64 tokens too
	)
	for _, bc := range []struct {
		numSeqs int
		reuse   bool
	}{{256, true}, {1024, true}, {4096, true}, {256, false}, {1024, false}, {4096, false}} {
		numSeqs := bc.numSeqs
		b.Run(fmt.Sprintf("running=%d/reuse=%v", numSeqs, bc.reuse), func(b *testing.B) {
			cfg := SchedulerConfig{
				MaxNumSeqs:           numSeqs,
				MaxNumBatchedTokens:  numSeqs * 2,
				MaxModelLen:          maxLen,
				EnableChunkedPrefill: true,
				BlockSize:            blockSize,
				NumBlocks:            numSeqs * (maxLen/blockSize + 1),
				EnablePrefixCaching:  true,
				EOSTokenIDs:          []int{0},
			}
			params := DefaultSamplingParams()
			params.MaxTokens = maxLen - promptLen
			params.IgnoreEOS = true
			var s *Scheduler
			sampled := make([]SampledTokens, numSeqs)
			tokens := make([]int, numSeqs)
			for i := range tokens {
				tokens[i] = 1 + i%1000
			}
			steps := epoch
			fill := func() {
				var err error
				if s, err = NewScheduler(cfg); err != nil {
					b.Fatal(err)
				}
				for i := range numSeqs {
					prompt := make([]int, promptLen)
					for j := range prompt {
						prompt[j] = 1 + (i*promptLen+j)%30000
					}
					if _, err := s.Add(NewSequence(fmt.Sprint(i), prompt, params, time.Time{})); err != nil {
						b.Fatal(err)
					}
				}
				for s.Stats().NumRunning < numSeqs || s.Stats().NumPrompted > 0 {
					out, metas := s.Schedule()
					if err := processAll(s, out, metas, sampled, tokens); err != nil {
						b.Fatal(err)
					}
				}
				steps = 0
				runtime.GC() // collect the previous fill's garbage outside the timing
			}
			b.ReportAllocs()
			b.ResetTimer()
			var cpu int64
			var bufs [2][]SequenceMetadata // metadata of the last two steps
			start := processCPUTime()
			for i := range b.N {
				if steps == epoch {
					b.StopTimer()
					cpu += processCPUTime() - start
					fill()
					start = processCPUTime()
					b.StartTimer()
				}
				var buf []SequenceMetadata
				if bc.reuse {
					buf = bufs[i%2]
				}
				out, metas := s.ScheduleInto(buf)
				if bc.reuse {
					bufs[i%2] = metas
				}
				if len(metas) != numSeqs {
					b.Fatalf("%d sequences scheduled, want %d", len(metas), numSeqs)
				}
				if err := processAll(s, out, metas, sampled, tokens); err != nil {
					b.Fatal(err)
				}
				steps++
			}
			cpu += processCPUTime() - start
			b.ReportMetric(float64(cpu)/float64(b.N), "cpu-ns/op")
		})
	}
}

// processAll reports one token per sample row.
func processAll(s *Scheduler, out *SchedulerOutputs, metas []SequenceMetadata, sampled []SampledTokens, tokens []int) error {
	if out.StepID == 0 {
		return nil
	}
	sampled = sampled[:0]
	for _, m := range metas {
		if m.Sample {
			sampled = append(sampled, SampledTokens{SeqID: m.SeqID, TokenIDs: tokens[m.SampleRow : m.SampleRow+1]})
		}
	}
	_, err := s.ProcessOutputs(out.StepID, sampled)
	return err
}
