//go:build !unix

package engine

func processCPUTime() int64 { return 0 }
