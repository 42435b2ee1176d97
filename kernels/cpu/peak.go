package cpu

import "sync"

// peakOnce caches the measured compute ceiling of a backend.
type peakOnce struct {
	once sync.Once
	v    float64
}

// PeakFLOPS is the float32 FMA throughput of this backend's threads in
// its path's vectors (cpu.simd: AVX2's 8 lanes under avx2 even where the
// CPU has AVX-512; the pure-Go path gets the widest the CPU has),
// measured once on first use (simd.Impl.PeakFLOPS, a few tens of
// milliseconds); 0 when the CPU offers no probe. MFU figures divide by it.
func (b *Backend) PeakFLOPS() float64 {
	b.peak.once.Do(func() {
		if v, ok := b.k.peak(b.threads); ok {
			b.peak.v = v
		}
	})
	return b.peak.v
}
