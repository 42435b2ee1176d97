package assets

import (
	"bytes"
	"io/fs"
	"os"
	"path/filepath"
	"testing"
)

// ExtractTo writes every shipped file once, returns the same directory on
// the next call, and rewrites a copy that lost a file.
func TestExtractTo(t *testing.T) {
	root := t.TempDir()
	tests := []struct {
		name  string
		setup func(dir string)
	}{
		{"first", nil},
		{"reuse", nil},
		{"repair", func(dir string) {
			os.RemoveAll(dir) // an incomplete copy must be written again
			os.MkdirAll(dir, 0o755)
			os.WriteFile(filepath.Join(dir, "config.json"), []byte("{}"), 0o644)
		}},
	}
	var first string
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if tc.setup != nil {
				tc.setup(first)
			}
			dir, err := ExtractTo(root)
			if err != nil {
				t.Fatal(err)
			}
			if first == "" {
				first = dir
			}
			if dir != first || filepath.Base(dir) != DefaultModelName || filepath.Base(filepath.Dir(dir)) != ContentHash() {
				t.Fatalf("dir = %s, want %s (…/<hash>/%s)", dir, first, DefaultModelName)
			}
			if !complete(dir) {
				t.Errorf("%s is incomplete", dir)
			}
		})
	}
}

// A complete copy holds every embedded file byte for byte.
func TestExtractedFilesMatch(t *testing.T) {
	dir, err := ExtractTo(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	names, _ := fs.Glob(FS(), "*")
	if len(names) < 5 {
		t.Fatalf("embedded files: %v", names)
	}
	for _, name := range names {
		want, _ := fs.ReadFile(FS(), name)
		got, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil || !bytes.Equal(got, want) {
			t.Errorf("%s: %d bytes, %v; want %d bytes", name, len(got), err, len(want))
		}
	}
	if h := ContentHash(); len(h) != 16 || h != ContentHash() {
		t.Errorf("ContentHash = %q", h)
	}
}
