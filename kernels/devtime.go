package kernels

import (
	"errors"
	"fmt"
	"time"
)

// DeviceTimer is an optional capability of a backend that queues its work
// on a device stream (kernels/cuda): timestamp markers recorded in stream
// order, from which device time between two points of the stream is read
// later without stopping the host. A backend that runs every call to
// completion on the host (kernels/cpu) does not implement it: its host
// clock already is its device clock.
//
// Find it with a type assertion, or DeviceTimerOf.
type DeviceTimer interface {
	// NewDeviceMarker returns an unrecorded marker of this backend. Markers
	// are reusable: record, read, record again. Cost: one event creation
	// (microseconds); keep markers rather than making one per use.
	NewDeviceMarker() (DeviceMarker, error)
}

// DeviceMarker is a reusable timestamp on a backend's stream. A marker is
// used by one goroutine at a time.
type DeviceMarker interface {
	// Record queues the marker on the stream, replacing its previous
	// recording: it completes when the device has finished every operation
	// queued before it. Not allowed while a graph is captured. Cost: one
	// host call (about a microsecond on CUDA), no device work.
	Record() error
	// Since returns the device time from earlier's completion to m's
	// completion. Both must be recorded on the same backend, earlier first;
	// an unrecorded or foreign marker is an error wrapping
	// ErrMarkerNotRecorded or ErrForeignMarker. Since blocks until m has
	// completed: read a marker only once work queued after it has been
	// waited for (a Sync or Download since), and it returns at once.
	// Resolution: about half a microsecond on CUDA.
	Since(earlier DeviceMarker) (time.Duration, error)
	// Close releases the marker; it cannot be used afterwards.
	Close() error
}

// Errors of DeviceMarker.Since.
var (
	// ErrMarkerNotRecorded: a marker was read before it was recorded.
	ErrMarkerNotRecorded = errors.New("device marker not recorded")
	// ErrForeignMarker: a marker was made by another backend.
	ErrForeignMarker = errors.New("device marker from another backend")
)

// DeviceTimerOf returns ops's DeviceTimer, or false when the backend has no
// device stream to time (a wrapper of a backend must implement the
// interface itself to expose it).
func DeviceTimerOf(ops Ops) (DeviceTimer, bool) {
	t, ok := ops.(DeviceTimer)
	return t, ok
}

// TimeDevice returns the device time of the work fn queues: it records a
// marker before and after fn, waits for the second and reads the
// difference. Meant for benchmarks and tests; it blocks until fn's work is
// done (a step loop records markers and reads them a step later instead).
// Cost: two markers created and released, one wait.
func TimeDevice(t DeviceTimer, fn func() error) (time.Duration, error) {
	start, err := t.NewDeviceMarker()
	if err != nil {
		return 0, fmt.Errorf("kernels: time device: %w", err)
	}
	defer start.Close()
	end, err := t.NewDeviceMarker()
	if err != nil {
		return 0, fmt.Errorf("kernels: time device: %w", err)
	}
	defer end.Close()
	if err := start.Record(); err != nil {
		return 0, fmt.Errorf("kernels: time device: start marker: %w", err)
	}
	if err := fn(); err != nil {
		return 0, err
	}
	if err := end.Record(); err != nil {
		return 0, fmt.Errorf("kernels: time device: end marker: %w", err)
	}
	d, err := end.Since(start)
	if err != nil {
		return 0, fmt.Errorf("kernels: time device: %w", err)
	}
	return d, nil
}
