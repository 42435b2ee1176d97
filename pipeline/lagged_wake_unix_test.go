//go:build unix

package pipeline

import (
	"context"
	"slices"
	"syscall"
	"testing"
	"time"
)

// blockingPublisher publishes the time on its lagged edges, then blocks in
// a system call for 200 µs, as a stage that hands the loop's next step on
// early and then waits for the device in a cgo call.
type blockingPublisher struct{ publish func(int) }

func (p *blockingPublisher) PublishLagged(f func(int)) { p.publish = f }
func (p *blockingPublisher) Process(_ context.Context, v int) (int, error) {
	p.publish(int(time.Now().UnixNano()))
	ts := syscall.NsecToTimespec((200 * time.Microsecond).Nanoseconds())
	syscall.Nanosleep(&ts, nil)
	return v, nil
}

// wakeRecorder reads the published time and records how long its stage
// took to see it.
type wakeRecorder struct{ waits []time.Duration }

func (w *wakeRecorder) Process(_ context.Context, v int) (int, error) { return v, nil }
func (w *wakeRecorder) read(_ context.Context, t int) error {
	w.waits = append(w.waits, time.Since(time.Unix(0, int64(t))))
	return nil
}

// BenchmarkEarlyPublishWake measures how long a lagged consumer waits
// after an early publish when the publisher goes on into a blocking call
// (the loop: a -> c with two items in flight, a reading c's early value of
// the item before). A goroutine readied right before a blocking system
// call or cgo call waits in its processor's run-next slot until the call
// returns or the runtime retakes the processor; the early publish
// therefore yields after its send.
//
// Measured on a shared 2-core machine (go test -run X -bench
// EarlyPublishWake -benchtime 2000x ./pipeline): without the yield, wake
// p50 35-40 µs, p90 88-90 µs; with it, p50 2-3 µs, p90 6-7 µs. A
// standalone program (send, then a 200 µs nanosleep) gave p50 86-90 µs
// without a yield and 3.8 µs with one, at GOMAXPROCS 2 and 8.
func BenchmarkEarlyPublishWake(b *testing.B) {
	w := &wakeRecorder{}
	head := &loopHead{n: b.N}
	g := New().
		Add("schedule", NewPlanner[struct{}, int, int](head)).
		Add("a", ReadLagged(NewStage[int, int](w), w.read)).
		Add("c", NewStage[int, int](&blockingPublisher{})).
		Connect("schedule", "a", 4).
		Connect("a", "c", 4).
		Feedback("c", "schedule", 2).
		Lagged("c", "a", 1)
	b.ResetTimer()
	if err := g.Run(context.Background()); err != nil {
		b.Fatal(err)
	}
	if len(w.waits) == 0 {
		return
	}
	slices.Sort(w.waits)
	q := func(p float64) float64 { return float64(w.waits[int(p*float64(len(w.waits)-1))].Microseconds()) }
	b.ReportMetric(q(0.5), "wake-p50-µs")
	b.ReportMetric(q(0.9), "wake-p90-µs")
}
