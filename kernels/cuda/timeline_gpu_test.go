package cuda

import (
	"errors"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/deepinfer/deepinfer-go/kernels"
)

// Device markers (kernels.DeviceTimer): the time between two markers
// around queued work is the work's device time (within the host's
// measurement of the same work, and close to TimeDevice's), reading a
// completed marker does not wait, and misuse is a clear error.
func TestGPUDeviceMarkers(t *testing.T) {
	g := newGPU(t, GEMMRound)
	r := rand.New(rand.NewPCG(1, 1))
	const n, k, reps = 8192, 4096, 50
	w := upload(t, g, kernels.BF16, hostBytes(kernels.BF16, randVals(r, n*k, 0.03)), kernels.BF16, n, k)
	x := upload(t, g, kernels.F32, kernels.F32Bytes(randVals(r, 32*k, 1)), kernels.F32, 32, k)
	out, err := g.Alloc(kernels.F32, 32, n)
	if err != nil {
		t.Fatal(err)
	}
	work := func() error {
		for range reps {
			if err := g.Linear(out, x, w, nil); err != nil {
				return err
			}
		}
		return nil
	}
	if err := work(); err != nil { // warm-up: cuBLAS heuristics
		t.Fatal(err)
	}
	if err := g.Sync(); err != nil {
		t.Fatal(err)
	}

	start, err := g.NewDeviceMarker()
	if err != nil {
		t.Fatal(err)
	}
	defer start.Close()
	end, err := g.NewDeviceMarker()
	if err != nil {
		t.Fatal(err)
	}
	defer end.Close()
	if _, err := end.Since(start); !errors.Is(err, kernels.ErrMarkerNotRecorded) {
		t.Errorf("unrecorded markers: %v, want ErrMarkerNotRecorded", err)
	}
	other := newGPU(t, GEMMRound)
	foreign, err := other.NewDeviceMarker()
	if err != nil {
		t.Fatal(err)
	}
	defer foreign.Close()

	t0 := time.Now()
	if err := start.Record(); err != nil {
		t.Fatal(err)
	}
	if err := work(); err != nil {
		t.Fatal(err)
	}
	if err := end.Record(); err != nil {
		t.Fatal(err)
	}
	if err := g.Sync(); err != nil {
		t.Fatal(err)
	}
	host := time.Since(t0)
	r0 := time.Now()
	dev, err := end.Since(start)
	if err != nil {
		t.Fatal(err)
	}
	read := time.Since(r0)
	timed, err := kernels.TimeDevice(g, work)
	if err != nil {
		t.Fatal(err)
	}
	foreign.Record()
	if _, err := end.Since(foreign); !errors.Is(err, kernels.ErrForeignMarker) {
		t.Errorf("a marker of another backend: %v, want ErrForeignMarker", err)
	}
	bytes := float64(reps) * 2 * n * k
	t.Logf("device markers: %d Linear %dx%d BF16 (m=32): %v between markers (%.0f GB/s of weights), host %v, TimeDevice %v; reading completed markers took %v",
		reps, n, k, dev.Round(time.Microsecond), bytes/dev.Seconds()/1e9, host.Round(time.Microsecond), timed.Round(time.Microsecond), read.Round(time.Microsecond))
	if dev <= 0 || dev > host+time.Millisecond {
		t.Errorf("device time %v between markers, host time %v: want 0 < device <= host", dev, host)
	}
	if d := float64(timed-dev) / float64(dev); d > 0.5 || d < -0.5 {
		t.Errorf("TimeDevice %v and markers %v disagree by %.0f%%", timed, dev, 100*d)
	}
	if read > 5*time.Millisecond {
		t.Errorf("reading completed markers took %v: it should not wait", read)
	}
}
