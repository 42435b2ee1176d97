package server

import (
	"context"
	"log/slog"
	"math"
	"time"

	"github.com/deepinfer/deepinfer-go/stages"
)

// defaultThroughputInterval is the time between two throughput log lines
// while requests run, as vLLM's.
const defaultThroughputInterval = 10 * time.Second

// logRequest writes r's line at INFO when r has finished (its last
// sequence, at now): the request id, its prompt and output tokens (all
// sequences), its time to first token (when it produced one; t holds it,
// started says so), its end-to-end latency and the finish reason of its
// first sequence. Called by observeOutput under r's group lock. Cost: one
// log record, when the logger is enabled for INFO.
func (s *Server) logRequest(r *request, t requestTiming, started bool, now time.Time) {
	ctx := context.Background()
	if !s.log.Enabled(ctx, slog.LevelInfo) {
		return
	}
	attrs := make([]slog.Attr, 0, 7)
	attrs = append(attrs,
		slog.String("request_id", r.id),
		slog.Int("prompt_tokens", len(r.promptTokenIDs)),
		slog.Int("output_tokens", r.numGen),
		slog.Int("n", max(1, r.params.N)),
	)
	if started {
		attrs = append(attrs, slog.Duration("ttft", t.firstToken.Sub(r.arrival).Round(time.Microsecond)))
	}
	attrs = append(attrs,
		slog.Duration("e2e", now.Sub(r.arrival).Round(time.Microsecond)),
		slog.String("finish_reason", r.firstReason.String()))
	s.log.LogAttrs(ctx, slog.LevelInfo, "request finished", attrs...)
}

// startThroughputLog starts the throughput log loop unless it runs:
// observeOutput calls it for every output before counting the output's
// tokens, so the loop runs while requests do and its first line counts
// the output that started it. Cost: an atomic load, and starting a
// goroutine once per busy period.
func (s *Server) startThroughputLog() {
	m := s.metrics
	if m.logRunning.Load() || !m.logRunning.CompareAndSwap(false, true) {
		return
	}
	prompt, out := m.logPromptTokens.Load(), m.logOutputTokens.Load()
	// After Shutdown: no loop, and none needed.
	s.background(func() { s.throughputLoop(prompt, out) })
}

// throughputLoop writes, every interval (metrics.logInterval, 10 s by
// default) while requests run, a line at INFO as vLLM's: the prompt and
// generation throughput over the interval (tokens/s: prompt tokens of
// requests that produced their first token, tokens generated), the
// sequences running and waiting, the KV-cache usage and the prefix-cache
// hit rate since start, and, when drafts were verified in the interval,
// speculative decoding's acceptance over it (specLogAttrs). It returns
// after an interval in which nothing happened and no request was pending
// (observeOutput starts it again), or when the server shuts down.
// lastPrompt and lastOut are the token counters when it was started. Cost
// per line: one scheduler snapshot and one snapshot of the spec-decode
// counters (a few dozen atomic loads).
func (s *Server) throughputLoop(lastPrompt, lastOut int64) {
	m := s.metrics
	tick := time.NewTicker(time.Duration(m.logInterval.Load()))
	defer tick.Stop()
	last, lastSpec := time.Now(), s.specSnapshot()
	for {
		select {
		case <-s.closing:
			m.logRunning.Store(false)
			return
		case <-tick.C:
			// The interval ends now, when the counters are read: a tick's
			// own time is when it was due, which may precede last (the
			// first tick of a loop whose goroutine started late), and the
			// rates came out negative.
			now := time.Now()
			prompt, out := m.logPromptTokens.Load(), m.logOutputTokens.Load()
			if prompt == lastPrompt && out == lastOut && s.NumPending() == 0 {
				m.logRunning.Store(false)
				// A request that came in since the check may have found
				// the loop running: keep running for it.
				if s.NumPending() == 0 || !m.logRunning.CompareAndSwap(false, true) {
					return
				}
			}
			dt := now.Sub(last).Seconds()
			st := s.eng.SchedulerStats()
			attrs := []slog.Attr{
				slog.Float64("prompt_tokens_per_s", round1(float64(prompt-lastPrompt)/dt)),
				slog.Float64("generation_tokens_per_s", round1(float64(out-lastOut)/dt)),
				slog.Int("running", st.NumRunning+st.NumPrompted),
				slog.Int("waiting", st.NumWaiting+st.NumWaitingForGrammar),
				slog.Float64("kv_cache_usage_pct", round1(100*st.BlockUsage)),
				slog.Float64("prefix_cache_hit_rate_pct", round1(100*st.PrefixCache.HitRate())),
			}
			spec := s.specSnapshot()
			if d := spec.Sub(lastSpec); d.NumDrafts > 0 {
				attrs = append(attrs, specLogAttrs(d)...)
			}
			s.log.LogAttrs(context.Background(), slog.LevelInfo, "engine throughput", attrs...)
			last, lastPrompt, lastOut, lastSpec = now, prompt, out, spec
		}
	}
}

// specSnapshot returns the engine's speculative-decoding counters (zero
// when it has no step stats).
func (s *Server) specSnapshot() stages.SpecStats {
	if st := s.eng.StepStats(); st != nil {
		return st.Spec()
	}
	return stages.SpecStats{}
}

// specLogAttrs are the throughput line's speculative-decoding attributes
// over an interval in which drafts were verified (d: the counts over it),
// as vLLM's "SpecDecoding metrics" line: the summary
// "accept 0.62, mean len 2.9, per-pos 0.81/0.64/0.47/0.30" (see
// stages.SpecStats.String), and the accepted and drafted tokens.
func specLogAttrs(d stages.SpecStats) []slog.Attr {
	return []slog.Attr{
		slog.String("spec_decode", d.String()),
		slog.Int64("spec_accepted_tokens", d.NumAcceptedTokens),
		slog.Int64("spec_draft_tokens", d.NumDraftTokens),
	}
}

// round1 rounds v to one decimal, as vLLM prints its rates.
func round1(v float64) float64 { return math.Round(v*10) / 10 }
