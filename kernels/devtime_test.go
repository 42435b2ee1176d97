package kernels

import (
	"errors"
	"fmt"
	"testing"
	"time"
)

// clockTimer is a DeviceTimer whose markers read a manual clock when
// recorded: the device of a backend that runs each call to completion.
type clockTimer struct {
	now     time.Duration
	failNew bool
	open    int // markers not closed
}

type clockMarker struct {
	t        *clockTimer
	at       time.Duration
	recorded bool
}

func (c *clockTimer) NewDeviceMarker() (DeviceMarker, error) {
	if c.failNew {
		return nil, errors.New("no events left")
	}
	c.open++
	return &clockMarker{t: c}, nil
}

func (m *clockMarker) Record() error { m.at, m.recorded = m.t.now, true; return nil }

func (m *clockMarker) Since(earlier DeviceMarker) (time.Duration, error) {
	e, ok := earlier.(*clockMarker)
	if !ok || e.t != m.t {
		return 0, fmt.Errorf("clock: %T: %w", earlier, ErrForeignMarker)
	}
	if !e.recorded || !m.recorded {
		return 0, ErrMarkerNotRecorded
	}
	return m.at - e.at, nil
}

func (m *clockMarker) Close() error { m.t.open--; return nil }

// timedOps is an Ops (left nil: never called) with a DeviceTimer.
type timedOps struct {
	Ops
	*clockTimer
}

func TestDeviceTimerOf(t *testing.T) {
	var plain struct{ Ops }
	if _, ok := DeviceTimerOf(plain); ok {
		t.Error("an Ops without markers reported a DeviceTimer")
	}
	c := &clockTimer{}
	if got, ok := DeviceTimerOf(timedOps{clockTimer: c}); !ok || got.(timedOps).clockTimer != c {
		t.Errorf("DeviceTimerOf = %v, %v; want the wrapped timer", got, ok)
	}
}

func TestTimeDevice(t *testing.T) {
	boom := errors.New("launch failed")
	tests := []struct {
		name    string
		work    time.Duration
		fnErr   error
		failNew bool
		want    time.Duration
		wantErr error
	}{
		{name: "work", work: 3 * time.Millisecond, want: 3 * time.Millisecond},
		{name: "no work", want: 0},
		{name: "fn fails", work: time.Millisecond, fnErr: boom, wantErr: boom},
		{name: "no markers", failNew: true, wantErr: errors.New("any")},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := &clockTimer{now: time.Second, failNew: tc.failNew}
			got, err := TimeDevice(c, func() error { c.now += tc.work; return tc.fnErr })
			switch {
			case tc.wantErr == nil && err != nil:
				t.Fatalf("TimeDevice: %v", err)
			case tc.wantErr != nil && err == nil:
				t.Fatalf("TimeDevice = %v, want an error", got)
			case tc.fnErr != nil && !errors.Is(err, tc.fnErr):
				t.Fatalf("TimeDevice error %v, want fn's %v", err, tc.fnErr)
			}
			if err == nil && got != tc.want {
				t.Errorf("TimeDevice = %v, want %v", got, tc.want)
			}
			if c.open != 0 {
				t.Errorf("%d markers left open", c.open)
			}
		})
	}
}
