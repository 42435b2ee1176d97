package cpu

import (
	"sync"

	"github.com/deepinfer/deepinfer-go/kernels/cpu/simd"
)

// peakOnce caches the measured compute ceiling of a backend.
type peakOnce struct {
	once sync.Once
	v    float64
}

// PeakFLOPS is the float32 FMA throughput of this backend's threads
// (AVX-512, else AVX2 with FMA), measured once on first use
// (simd.PeakFLOPS, a few tens of milliseconds); 0 when the CPU offers
// neither. MFU figures divide by it.
func (b *Backend) PeakFLOPS() float64 {
	b.peak.once.Do(func() {
		if v, ok := simd.PeakFLOPS(b.threads); ok {
			b.peak.v = v
		}
	})
	return b.peak.v
}
