//go:build !linux

package cpu

// mapOffHeap maps nothing off Linux: (nil, nil), and callers use Go memory.
func mapOffHeap(int) ([]byte, *mapping) { return nil, nil }
