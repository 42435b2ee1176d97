//go:build linux || darwin || freebsd || netbsd || openbsd

package gguf

import (
	"os"
	"syscall"
)

// mmapFile maps size bytes of fh read-only and shared.
func mmapFile(fh *os.File, size int) ([]byte, func([]byte) error, error) {
	if size == 0 {
		return nil, func([]byte) error { return nil }, nil
	}
	data, err := syscall.Mmap(int(fh.Fd()), 0, size, syscall.PROT_READ, syscall.MAP_SHARED)
	if err != nil {
		return nil, nil, &os.PathError{Op: "mmap", Path: fh.Name(), Err: err}
	}
	return data, syscall.Munmap, nil
}
