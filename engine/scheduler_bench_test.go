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
//	go test -run '^$' -bench SchedulerDecode -benchtime 2000x -count 3 -benchmem ./engine
//	go test -run '^$' -bench 'SchedulerDecode/.*/reuse=true' -benchtime 2000x -count 3 -benchmem ./engine
//
// Figures (reuse=true, cpu-ns/op, range of 8 runs of each test binary,
// old and new interleaved, on a 2-core AMD EPYC virtual machine, AVX-512,
// 1 MiB of L2 per core, 32 MiB of L3, another process busy on the other
// core):
//
//	running   before         after          after/before
//	256        20-30 µs       10-18 µs      ~0.55
//	1024       83-95 µs       36-52 µs      ~0.46
//	4096      339-417 µs     158-190 µs     ~0.45
//
// Allocations per step are unchanged (2 with reuse, 3 without, same bytes).
// Part of the gain at 4,096 is the benchmark's own: processAll used to
// range over the metadata by value (a copy of every field of every
// element) and build each row on the stack; with that processAll the new
// Scheduler takes 184-216 µs (~0.53), the old one with the new processAll
// 317-403 µs (~0.92).
//
// Where a step went (4,096 sequences): the per-sequence work of the decode
// loop more than the misses. Kept, by measured effect (medians of
// interleaved runs, ±10% noise):
//   - a plain decode (its slot in a block it holds privately, no drafts)
//     skips draftsFor, CanAppendSlots and AppendSlots (three calls, two
//     block-count divisions): ~0.75 at 4,096, ~0.8 at 256;
//   - prefix-cache commits queued and run in passes (commitLater,
//     flushCommits), so that the misses on the blocks' tokens and on the
//     prefix table's slots overlap: their share of a step's profile from
//     ~27% to ~15%;
//   - a recycled element that holds the same sequence's previous plain
//     decode gets only its first 128 bytes rewritten (planPlainDecodes,
//     Sequence.metaGen): ~0.92;
//   - running is compacted only after a running sequence left it, the
//     per-token finish checks are a single inlined comparison until one
//     can apply (Scheduler.quietLen), and a plain step's row skips the
//     speculative path: ~0.9;
//   - step entries written in place, not built on the stack and appended
//     (the 16-byte copy stalled on the narrower stores that built it).
//
// Tried and dropped, no gain beyond the noise: Sequence padded to 384
// bytes and SequenceMetadata to 320 so that each starts on a cache line;
// ProcessOutputs' fields of a Sequence packed into one line; loads of the
// Sequence 6 entries ahead in both loops. Earlier, also without gain:
// token arrays staggered across cache sets, loads 8-16 sequences ahead in
// ProcessOutputs.
//
// On an Intel Xeon (Sapphire Rapids class) VM, 2 vCPUs, 2 MiB L2, 105 MiB
// L3 shared with other tenants, the same code takes (reuse=true,
// cpu-ns/op, ranges over runs spread across an hour; a run's figure moves
// by ±15% with the host's load, so compare binaries in alternating runs):
//
//	running   cpu time        per sequence
//	256        15-26 µs        60-100 ns
//	1024       74-109 µs       72-106 ns
//	4096      394-680 µs       96-166 ns
//
// At 4,096 a step's working set (about 10 cache lines per sequence:
// three or four of its Sequence, three of its recycled metadata, which
// come back only every other step, the token tail, the step entry, the
// sampled row) is several MiB, past L2; the same code takes ~40 ns per
// sequence on the EPYC, so a miss to this L3 seems to cost far more. The
// token tail alone (a store into a line of its own per sequence, every
// tail at the same offset in a 4 KiB-strided array when the sequences
// have one length) is 13-22% of the step: with that store removed (an
// experiment, not a fix) a step took 360-534 µs against 413-680 µs.
// Tried on this machine, no gain beyond the noise (medians of 4-7
// alternating pairs within ±6%): SequenceMetadata padded to 320 bytes;
// every field of a plain decode in a Sequence's first two cache lines,
// Sequence padded to 384 bytes (line-aligned objects), scheduledStep left
// alone by plain decodes; the plain decodes planned in one loop with the
// builder's slices in locals (the compiler spills them: no fewer
// instructions); token arrays staggered 0-7 lines by request id (-4% at
// 4,096, inside the range); a pass in ProcessOutputs' validation loop
// loading each token tail first (+10%: the loads stall where the stores
// drained).
//
// Where a step goes on that Xeon VM, measured to decide on a
// structure-of-arrays layout (the plain-decode fields of every running
// sequence in dense arrays). Per sequence, timing Schedule, the reader
// pass (processAll's loop) and ProcessOutputs apart:
//
//	running   Schedule    reader    ProcessOutputs   ProcessOutputs, token tail not stored
//	256       40-50 ns    6-7 ns    25-33 ns         27 ns
//	1024      34-41 ns    5-6 ns    34-36 ns         22-26 ns
//	2048      38-46 ns    6-7 ns    37-46 ns         26-29 ns
//	4096      40-47 ns    8-10 ns   42-48 ns         24-31 ns
//
// Schedule costs the same per sequence at 256 (everything cached) as at
// 4,096: it is bound by its instructions, not by misses. Nor is
// ProcessOutputs, once the token tail's store is taken out (an
// experiment, not a fix): what grows with the batch is that one store,
// ~18 ns a sequence at 4,096 (~75 µs a step). Counted with callgrind
// (256 running), a plain decode step executed, before the changes kept
// below, about 450 instructions per sequence: addPlainDecode (the plain
// decode then) ~175, the decode loop ~65, ProcessOutputs
// ~115, the commits ~60 (a block every 16 steps, ~950 each), the reader
// ~35, for the ~80 ns a sequence takes at 256 (the VM exposes no
// hardware counters to split that further). A structure-of-arrays
// layout removes misses these figures do not show, so it was not built:
// 200 µs at 4,096 is 49 ns a sequence, and the tail store alone takes 18
// of them.
//
// The tail store, apart (4,096 []int of capacity 100 or 513, one append
// to each per step, nothing else): 7-10 ns an append, about the same
// with 100 tokens of capacity (four or five arrays to a page; the 4,096
// tail lines, 256 KiB, fit L2) as with 513, with the heap in huge pages (MADV_COLLAPSE) or
// not, and slower with the tails prefetched first (PREFETCHT0 or
// PREFETCHW 32 or 64 ahead, or all 4,096 before the stores: 54-81 µs
// against 38-42): on this VM a store to a line of its own costs ~10 ns
// and does not overlap. The API keeps each sequence's tokens in one
// array that the next step's metadata shows, so each step writes one
// such line per sequence.
//
// Tried on this VM against that picture, prediction then outcome
// (medians of alternating runs at 4,096, cpu-ns/op; all but the last
// dropped):
//   - Sequence.uncached, a copy of PromptLogprobs != nil in the first
//     cache line, so that a filled block's commit check does not load the
//     params (2% of the profile): -2% predicted; 443 against 444 µs.
//   - SeqID, Sample and SampleRow in the metadata's first 24 bytes (one
//     line for most elements; two or three when spread over 128): the
//     reader pass -20% and the step -2% predicted; the reader pass took
//     29-30 µs against 36-38 (4 pairs), the step 440 against 444 µs,
//     within the noise.
//   - ProcessOutputs' token stores gathered in a tight pass after its
//     loop, so that their misses overlap: -15% predicted; 427 against
//     411 µs (5 pairs), as the tail experiment above says.
//   - Each 32 entries' token tails prefetched (PREFETCHT0, assembly)
//     before ProcessOutputs handles them: -15% predicted; 380 against
//     373 µs; ProcessOutputs alone 184-204 against 177-194 µs.
//   - The heap collapsed into huge pages after the fill (an experiment):
//     ProcessOutputs unchanged (177-188 µs with, 187-230 without): the
//     tails' cost is not TLB misses.
//   - stepEntry at 32 bytes (computedAfter an int32): 369 against 380 µs
//     without it and 372 for the old code (11 alternating triples).
//   - Commit hashing that checks the int32 fit in the same pass, the
//     int32 copy's bounds check hoisted and the decode counts derived in
//     finishStep, alone: callgrind counts hashBlocks -17%, flushCommits
//     -18%, addPlainDecode -5%; the step time did not move (4,096: 343
//     against 328 µs, 1,024: 70.9 against 70.9, 256: 17.9 against 17.7;
//     9 pairs each). Kept with the change below.
//
// Kept, for fewer instructions: the plain decodes planned in runs
// (planPlainDecodes), written by index into the builder's arrays sliced
// to the room left, with no append and no call on the usual path, with
// the commit and counter changes above. (The one-loop attempt listed
// earlier kept the builder's slices in locals and counted no fewer
// instructions.) Callgrind (4,096 running, 300 steps) counts
// ScheduleInto's own instructions and its plain decodes' at 219 M
// against 293 M (-25%), the commits' hashing and inserts at 57 M against
// 69 M. Time, as the median of new/old ratios over alternating pairs (a
// run's figure moves by ±15% with the host; pairing takes most of that
// out), each set of pairs a row's figure; allocations unchanged:
//
//	running   pairs each   new/old
//	256       15           0.837, 0.914
//	1024      11           0.973, 0.975
//	4096      15           0.959, 0.971, 0.989
//
// A few per cent at 4,096: far from 200 µs, for the reasons above.
//
// The token and slot arrays now come back with the recycled metadata
// (ScheduleInto): 2 -> 1 allocations a step, 74.6 -> 1.5 KB at 4,096;
// cpu-ns/op new/old 0.79-0.94 at 1,024 and 0.93-1.05 at 4,096 over 4
// alternating pairs. A plain decode whose slot opens a block now takes it
// on the fast path (planPlainDecodes) instead of the general one: 4,096
// running, new/old median 0.956 over 8 alternating pairs.
//
// Tried and dropped: the step's per-sequence work split over two
// goroutines at 1,024 sequences and more (both halves scanned at once for
// the conditions of a plain decode, the blocks they open taken from the
// free list in the serial order, both planned at once into their parts of
// the arrays; ProcessOutputs' rows applied by halves with the commits and
// finishes replayed in row order: the same bits as serial in a lockstep
// test, forks, preemption and zero-overhead scheduling included). On this
// 2-vCPU VM it was slower, 4,096 running: 590-1,166 µs a step against
// 390-530 serial, 1,024: 90-197 against 70-80, with the helper
// goroutine handed its half through a channel (parking and waking a
// goroutine took tens of µs) or by spinning (0.6 µs a hand-off). Timed by
// phase, each half ran 1.5-3x slower than the same half alone, and the
// helper's half slowest: the rows each stage reads that the other core
// wrote (metadata, sampled rows, step entries) cross between the cores
// every step. With the data hot in both caches (50 repeats of the scan
// alone) the split scan took 9.2 µs against 15.1 serial, so the split
// works where the step's working set stays with its core; it would need
// measuring on a machine whose cores share their caches better before it
// is worth its code.
//
// Tried and dropped: software prefetch (PREFETCHT0 through a two-line
// assembly function) of the Sequence's first three cache lines 8
// sequences ahead in planPlainDecodes and ProcessOutputs, and of each
// sequence's token-array end 4 ahead in ProcessOutputs. Predicted: the
// misses of the two passes overlap, 4,096 running toward 250 µs. Outcome,
// 4 alternating pairs of test binaries: 4,096 running 373-440 µs against
// 335-412 without, 1,024 running 65-101 against 57-73; slower, and the
// misses stay: the out-of-order window already overlaps the passes'
// independent loads, and each call costs more than it hides.
//
// Where a step goes now on the EPYC VM (4,096 running, reuse=true,
// 20,000 steps under the CPU profiler, the fills left out): 171-205 µs a
// step (cpu-ns/op, 12 runs), linear from 1,024 (45-49 µs, 44-48 ns a
// sequence) and close to 256 (9-12 µs, 35-45 ns a sequence, everything
// cached): on this machine a step is bound by its instructions (~290 a
// sequence under callgrind: planPlainDecodes ~145, ProcessOutputs ~110
// with ~29 of them validating, the reader ~34), not by its misses. By
// profile: planPlainDecodes 82 µs (a quarter of it on the load of each
// Sequence's first line), ProcessOutputs 86 µs, of which the token tail
// store 30 and the prefix-cache commits 26 (256 blocks a step, ~100 ns
// each: the chained hash of 16 tokens ~25, the prefix table's slot and
// the block's copy the rest), the reader 15. Tried, prediction then
// outcome (alternating pairs of test binaries, 4,096 running), all
// dropped:
//   - ProcessOutputs' rows of a step without speculation applied last
//     entry first, the commits and finishes recorded and replayed in
//     entry order (the BlockManager sees the same calls): the sequences
//     Schedule touched last still cached, -10% predicted; new/old 0.99,
//     1.06, 1.00, 1.06, 0.86 (5 pairs): the misses are not what costs.
//   - planPlainDecodes' loop without calls (the block opening and the
//     metadata rewrite moved to a function it returns to), so that the
//     register allocator need not spill around them, with the decode
//     checks specialised to no drafts: -10% predicted; within the noise
//     (4 pairs at 4,096, 3 at 256), still 52 stack accesses in the loop.
//   - With that, a recycled element of the same sequence whose metaGen
//     changed (one step in 8 here: a block every 16 steps, two buffers)
//     gets only the 4 fields metaGen covers rewritten instead of
//     setPlainMetadata's 17: -5% predicted; new/old 0.89, 0.89, 1.15,
//     0.98, 1.10, 0.96 (6 pairs), a median of 0.97.
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

// processAll reports one token per sample row. It reads the metadata and
// writes the rows in place, as a stage does: ranging over the metadata by
// value would copy every field of every element, several times the bytes
// the step reads.
func processAll(s *Scheduler, out *SchedulerOutputs, metas []SequenceMetadata, sampled []SampledTokens, tokens []int) error {
	if out.StepID == 0 {
		return nil
	}
	n := 0
	for i := range metas {
		if m := &metas[i]; m.Sample {
			st := &sampled[n]
			st.SeqID, st.TokenIDs = m.SeqID, tokens[m.SampleRow:m.SampleRow+1]
			n++
		}
	}
	sampled = sampled[:n]
	_, err := s.ProcessOutputs(out.StepID, sampled)
	return err
}
