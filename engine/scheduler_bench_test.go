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
