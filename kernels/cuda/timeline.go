package cuda

import (
	"fmt"
	"time"

	"github.com/deepinfer/deepinfer-go/kernels"
)

var _ kernels.DeviceTimer = (*Backend)(nil)

// NewDeviceMarker implements kernels.DeviceTimer with a timing CUDA event
// on the backend's stream. Cost: one cudaEventCreate.
func (b *Backend) NewDeviceMarker() (kernels.DeviceMarker, error) {
	ev, err := b.NewEvent()
	if err != nil {
		return nil, err
	}
	return &marker{ev: ev}, nil
}

// marker is a CUDA event with the bookkeeping kernels.DeviceMarker asks for.
type marker struct {
	ev       *Event
	recorded bool
}

// Record queues the event on the stream (cudaEventRecord). While a graph
// is captured the call fails with ErrCapturing or records into the graph,
// as the CUDA runtime decides; markers belong outside captures.
func (m *marker) Record() error {
	if m.ev.ev == nil {
		return fmt.Errorf("cuda: marker record: marker closed: %w", ErrCUDA)
	}
	if err := m.ev.Record(); err != nil {
		return err
	}
	m.recorded = true
	return nil
}

// Since waits for m's event (cudaEventSynchronize, immediate once it has
// completed) and returns the device time since earlier's
// (cudaEventElapsedTime, about 0.5 us resolution).
func (m *marker) Since(earlier kernels.DeviceMarker) (time.Duration, error) {
	e, ok := earlier.(*marker)
	if !ok || e == nil {
		return 0, fmt.Errorf("cuda: marker since %T: %w", earlier, kernels.ErrForeignMarker)
	}
	if e.ev.b != m.ev.b {
		return 0, fmt.Errorf("cuda: marker since a marker of another backend: %w", kernels.ErrForeignMarker)
	}
	if e.ev.ev == nil || m.ev.ev == nil {
		return 0, fmt.Errorf("cuda: marker since: marker closed: %w", ErrCUDA)
	}
	if !e.recorded || !m.recorded {
		return 0, fmt.Errorf("cuda: marker since (earlier recorded %v, later recorded %v): %w", e.recorded, m.recorded, kernels.ErrMarkerNotRecorded)
	}
	ms, err := e.ev.Elapsed(m.ev)
	if err != nil {
		return 0, err
	}
	return time.Duration(ms * float64(time.Millisecond)), nil
}

// Close destroys the event.
func (m *marker) Close() error {
	m.recorded = false
	return m.ev.Close()
}
