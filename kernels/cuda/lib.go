package cuda

/*
#cgo CFLAGS: -I${SRCDIR}/../../csrc
#cgo LDFLAGS: -ldl
#include <stdlib.h>
#include "api.h"
*/
import "C"

import (
	"fmt"
	"os"
	"path/filepath"
	"unsafe"
)

// LibraryEnv names the environment variable that gives the library's path.
const LibraryEnv = "DEEPINFER_CUDA_LIB"

// LibraryName is the file the build script writes.
const LibraryName = "libdeepinfer_cuda.so"

// library is an opened libdeepinfer_cuda.so and its function table (in C
// memory, so that C code may keep pointers into it).
type library struct {
	path string
	api  *C.di_api
}

// status codes of the ABI (enum di_status).
const (
	stOK          = 0
	stCUDA        = 1
	stOOM         = 2
	stNoDevice    = 3
	stInvalid     = 4
	stUnsupported = 5
	stCUBLAS      = 6
	stDeviceCheck = 7
	stOutOfRange  = 8
	stArch        = 9
	stCapturing   = 10
)

// candidates lists where to look for the library, in order: the explicit
// path, $DEEPINFER_CUDA_LIB, next to the executable, then the dynamic
// loader's search path.
func candidates(path string) []string {
	if path != "" {
		return []string{path}
	}
	if p := os.Getenv(LibraryEnv); p != "" {
		return []string{p}
	}
	var out []string
	if exe, err := os.Executable(); err == nil {
		out = append(out, filepath.Join(filepath.Dir(exe), LibraryName))
	}
	return append(out, LibraryName)
}

// openLibrary dlopens the first candidate that exists and checks its ABI
// version.
func openLibrary(path string) (*library, error) {
	var errs []string
	for _, p := range candidates(path) {
		if filepath.IsAbs(p) || filepath.Dir(p) != "." {
			if _, err := os.Stat(p); err != nil {
				errs = append(errs, fmt.Sprintf("%s: %v", p, err))
				continue
			}
		}
		lib, missing, err := load(p)
		if missing != "" {
			errs = append(errs, missing)
			continue
		}
		if err != nil {
			return nil, err
		}
		return lib, nil
	}
	return nil, fmt.Errorf("cuda: cannot open %s (%s): build it on a machine with nvcc (csrc/build.sh) and set %s to its path, or use device: cpu: %w",
		LibraryName, joinErrs(errs), LibraryEnv, ErrNoLibrary)
}

func joinErrs(errs []string) string {
	s := ""
	for i, e := range errs {
		if i > 0 {
			s += "; "
		}
		s += e
	}
	return s
}

// load opens one candidate. missing is set (and err nil) when the file
// cannot be opened as a DeepInfer library, so that the next candidate is tried.
func load(path string) (lib *library, missing string, err error) {
	cpath := C.CString(path)
	defer C.free(unsafe.Pointer(cpath))
	var buf [512]C.char
	h := C.di_dlopen(cpath, &buf[0], C.int(len(buf)))
	if h == nil {
		return nil, C.GoString(&buf[0]), nil
	}
	api := (*C.di_api)(C.calloc(1, C.size_t(unsafe.Sizeof(C.di_api{}))))
	rc := C.di_load(h, api, &buf[0], C.int(len(buf)))
	switch {
	case rc == -1:
		C.free(unsafe.Pointer(api))
		C.dlclose(h)
		return nil, fmt.Sprintf("%s: not a DeepInfer CUDA library: %s", path, C.GoString(&buf[0])), nil
	case rc == stUnsupported:
		v := uint32(api.abi_version)
		C.free(unsafe.Pointer(api))
		C.dlclose(h)
		return nil, "", fmt.Errorf("cuda: %s has ABI version %d, this program needs %d: rebuild the library from this source tree (csrc/build.sh): %w",
			path, v, C.DI_ABI_VERSION, ErrABIMismatch)
	case rc != stOK:
		C.free(unsafe.Pointer(api))
		C.dlclose(h)
		return nil, "", fmt.Errorf("cuda: %s: di_get_api failed with status %d: %w", path, int(rc), ErrABIMismatch)
	case uintptr(api.size) != unsafe.Sizeof(C.di_api{}):
		sz := uint32(api.size)
		C.free(unsafe.Pointer(api))
		C.dlclose(h)
		return nil, "", fmt.Errorf("cuda: %s: function table of %d bytes, want %d: rebuild the library: %w",
			path, sz, unsafe.Sizeof(C.di_api{}), ErrABIMismatch)
	}
	// The handle stays open for the life of the process: unloading CUDA
	// libraries while the driver holds state is not worth the risk.
	return &library{path: path, api: api}, "", nil
}
