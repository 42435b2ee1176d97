//go:build !linux

package cpu

// adviseHugePages does nothing off Linux.
func adviseHugePages([]byte) {}
