//go:build !(linux || darwin || freebsd || netbsd || openbsd)

package gguf

import (
	"io"
	"os"
)

// mmapFile reads the whole file where mmap is not available: same contract,
// but the tensors are copied into memory.
func mmapFile(fh *os.File, size int) ([]byte, func([]byte) error, error) {
	data := make([]byte, size)
	if _, err := io.ReadFull(fh, data); err != nil {
		return nil, nil, err
	}
	return data, func([]byte) error { return nil }, nil
}
