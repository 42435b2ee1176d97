//go:build unix

package engine

import "syscall"

// processCPUTime returns the CPU time (user + system) the process has used,
// in nanoseconds: unlike wall time, it does not grow while the machine is
// busy with other work.
func processCPUTime() int64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return ru.Utime.Nano() + ru.Stime.Nano()
}
