package cuda

import (
	"errors"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// These tests need no GPU: they check how New reports libraries it cannot
// use, with stand-ins compiled from testdata/fake_lib.c by the C compiler
// that cgo uses.

func cc(t *testing.T) string {
	t.Helper()
	out, err := exec.Command("go", "env", "CC").Output()
	if err != nil {
		t.Fatalf("go env CC: %v", err)
	}
	c := strings.Fields(string(out))
	if len(c) == 0 {
		t.Fatal("go env CC is empty")
	}
	return c[0]
}

// fakeLib compiles testdata/fake_lib.c in the given mode into a shared library.
func fakeLib(t *testing.T, mode int) string {
	t.Helper()
	so := filepath.Join(t.TempDir(), "libfake.so")
	args := []string{"-shared", "-fPIC", "-o", so, "-I", "../../csrc", "-DFAKE_MODE=" + string(rune('0'+mode)), "testdata/fake_lib.c"}
	if out, err := exec.Command(cc(t), args...).CombinedOutput(); err != nil {
		t.Fatalf("compile fake library: %v\n%s", err, out)
	}
	return so
}

func TestNewReportsUnusableLibraries(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "libdeepinfer_cuda.so")
	notLib := filepath.Join(t.TempDir(), "libdeepinfer_cuda.so")
	if err := os.WriteFile(notLib, []byte("not an ELF file"), 0o644); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name    string
		lib     func(t *testing.T) string
		want    error
		message []string // substrings the error must contain
	}{
		{"missing file", func(*testing.T) string { return missing }, ErrNoLibrary,
			[]string{missing, "csrc/build.sh", LibraryEnv, "device: cpu"}},
		{"not a shared object", func(*testing.T) string { return notLib }, ErrNoLibrary,
			[]string{notLib, "csrc/build.sh"}},
		{"no entry point", func(t *testing.T) string { return fakeLib(t, 3) }, ErrNoLibrary,
			[]string{"not a DeepInfer CUDA library", "di_get_api"}},
		{"other ABI version", func(t *testing.T) string { return fakeLib(t, 1) }, ErrABIMismatch,
			[]string{"ABI version 999", "rebuild"}},
		{"no device", func(t *testing.T) string { return fakeLib(t, 2) }, ErrNoDevice,
			[]string{"no CUDA-capable device", "nvidia-smi", "device: cpu"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			b, err := New(Options{Library: tc.lib(t)})
			if err == nil {
				b.Close()
				t.Fatal("New succeeded")
			}
			if !errors.Is(err, tc.want) {
				t.Fatalf("error %q does not wrap %v", err, tc.want)
			}
			for _, s := range tc.message {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("error %q does not mention %q", err, s)
				}
			}
		})
	}
}

// A decode chunk that is not a positive multiple of 128 is refused before
// the library is opened, naming the setting.
func TestNewRejectsBadDecodeChunk(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "libdeepinfer_cuda.so")
	for _, chunk := range []int{-128, 64, 300} {
		b, err := New(Options{Library: missing, DecodeChunk: chunk})
		if err == nil {
			b.Close()
			t.Fatalf("DecodeChunk %d: New succeeded", chunk)
		}
		if !errors.Is(err, ErrUnsupported) || !strings.Contains(err.Error(), "decode chunk of "+strconv.Itoa(chunk)+" keys") {
			t.Errorf("DecodeChunk %d: error %q, want ErrUnsupported naming the chunk", chunk, err)
		}
	}
}

func TestLibraryCandidates(t *testing.T) {
	t.Setenv(LibraryEnv, "")
	got := candidates("")
	if len(got) < 1 || got[len(got)-1] != LibraryName {
		t.Errorf("candidates without a path end in %v, want the bare %s for the loader's search", got, LibraryName)
	}
	t.Setenv(LibraryEnv, "/x/lib.so")
	if got := candidates(""); len(got) != 1 || got[0] != "/x/lib.so" {
		t.Errorf("with %s set: %v", LibraryEnv, got)
	}
	if got := candidates("/y/lib.so"); len(got) != 1 || got[0] != "/y/lib.so" {
		t.Errorf("explicit path: %v", got)
	}
}

func TestGEMMModeString(t *testing.T) {
	for m, want := range map[GEMMMode]string{GEMMRound: "round", GEMMSplit: "split", 7: "GEMMMode(7)"} {
		if got := m.String(); got != want {
			t.Errorf("%d: %q, want %q", int(m), got, want)
		}
	}
}

func TestSkipSet(t *testing.T) {
	for _, tc := range []struct {
		env     string
		want    []string
		wantErr string
	}{
		{env: "", want: nil},
		{env: "attention", want: []string{"attention"}},
		{env: "silu_mul, add_rms_norm", want: []string{"add_rms_norm", "silu_mul"}},
		{env: "attention,gemv", wantErr: `"gemv" is not an operation`},
		{env: "upload", wantErr: `"upload" is not an operation`},
	} {
		t.Run(tc.env, func(t *testing.T) {
			t.Setenv(SkipEnv, tc.env)
			set, err := skipSet()
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) || !errors.Is(err, ErrUnsupported) {
					t.Fatalf("skipSet() error = %v, want one containing %q wrapping ErrUnsupported", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			got := slices.Sorted(maps.Keys(set))
			if !slices.Equal(got, tc.want) {
				t.Errorf("skipSet() = %v, want %v", got, tc.want)
			}
		})
	}
	t.Setenv(SkipEnv, "nonsense")
	if _, err := New(Options{Library: filepath.Join(t.TempDir(), "missing.so")}); err == nil || !strings.Contains(err.Error(), SkipEnv) {
		t.Errorf("New with %s=nonsense: error %v, want one naming the variable", SkipEnv, err)
	}
}

// MLPNarrowEnv: unset means the default row count, 0 turns the 16-bit
// intermediates off, anything but a count is refused with its value named.
func TestMLPNarrowRows(t *testing.T) {
	for _, tc := range []struct {
		env     string
		want    int
		wantErr bool
	}{
		{"", defaultMLPNarrowRows, false}, {"0", 0, false}, {"256", 256, false},
		{"-1", 0, true}, {"many", 0, true},
	} {
		t.Setenv(MLPNarrowEnv, tc.env)
		got, err := mlpNarrowRows()
		if tc.wantErr {
			if err == nil || !errors.Is(err, ErrUnsupported) || !strings.Contains(err.Error(), strconv.Quote(tc.env)) {
				t.Errorf("%s=%q: error = %v, want one naming the value, wrapping ErrUnsupported", MLPNarrowEnv, tc.env, err)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("%s=%q: mlpNarrowRows() = %d, %v; want %d", MLPNarrowEnv, tc.env, got, err, tc.want)
		}
	}
}
