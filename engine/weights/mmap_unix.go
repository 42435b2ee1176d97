//go:build linux || darwin || freebsd || netbsd || openbsd

package weights

import (
	"os"
	"syscall"
)

// mmapFile maps size bytes of fh read-only and shared.
func mmapFile(fh *os.File, size int) ([]byte, func([]byte) error, error) {
	data, err := syscall.Mmap(int(fh.Fd()), 0, size, syscall.PROT_READ, syscall.MAP_SHARED)
	if err != nil {
		return nil, nil, &os.PathError{Op: "mmap", Path: fh.Name(), Err: err}
	}
	return data, syscall.Munmap, nil
}
