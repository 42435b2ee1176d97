package gguf

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"testing"
)

var writeSeeds = flag.Bool("write-seeds", false, "rewrite the committed FuzzParse seed corpus under testdata/fuzz")

// seeds are small valid files and near misses: the fuzzer mutates them.
func seeds(t testing.TB) [][]byte {
	pad := make([]byte, 64)
	return [][]byte{
		sampleFile(t, 0),
		sampleFile(t, 64),
		header(3, 0, 0),
		header(2, 0, 1, gstr("general.alignment"), u32(4), u32(16)),
		header(3, 1, 1, gstr("general.architecture"), u32(8), gstr("llama"),
			tensorInfo("token_embd.weight", []uint64{32, 2}, uint32(TypeQ8_0), 0), pad, pad),
		header(3, 0, 1, gstr("tokenizer.ggml.tokens"), u32(9), u32(8), u64(2), gstr("a"), gstr("b")),
	}
}

// FuzzParse checks that Parse never panics and that what it accepts is
// consistent: every tensor's data lies in the file and the config mapping
// runs without panicking.
//
//	go test -fuzz FuzzParse -fuzztime 3m ./engine/gguf/
func FuzzParse(f *testing.F) {
	for _, s := range seeds(f) {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		file, err := Parse(data)
		if err != nil {
			if !errors.Is(err, ErrFormat) {
				t.Fatalf("error %v does not wrap ErrFormat", err)
			}
			return
		}
		for _, ti := range file.Tensors {
			info, b, err := file.TensorData(ti.Name)
			if err != nil || int64(len(b)) != info.Size {
				t.Fatalf("tensor %q: %d bytes, err %v", ti.Name, len(b), err)
			}
			if !bytes.Equal(b, data[file.DataOffset+info.Offset:file.DataOffset+info.Offset+info.Size]) {
				t.Fatalf("tensor %q: data is not the file's", ti.Name)
			}
		}
		_, _ = file.Config()
	})
}

// TestWriteSeeds rewrites the committed seed corpus when -write-seeds is set.
func TestWriteSeeds(t *testing.T) {
	if !*writeSeeds {
		t.Skip("run with -write-seeds to rewrite testdata/fuzz/FuzzParse")
	}
	dir := filepath.Join("testdata", "fuzz", "FuzzParse")
	must(t, os.MkdirAll(dir, 0o755))
	for i, s := range seeds(t) {
		body := fmt.Sprintf("go test fuzz v1\n[]byte(%q)\n", s)
		must(t, os.WriteFile(filepath.Join(dir, fmt.Sprintf("seed-%d", i)), []byte(body), 0o644))
	}
}
