// Package assets ships the default model, deepseek-tiny, inside every
// binary that imports it, so that a deepinfer built with go install runs
// from any directory without the source tree.
//
// The model's files (about 38 MB) are embedded with go:embed. Loading code
// reads a model from a directory, so DefaultModelDir writes them once into
// the user's cache directory, under a name that carries a hash of their
// content: a binary with a different model never reads a stale copy, and a
// second run (or a second binary with the same model) reuses the first
// one's files. A binary built with the tag nomodel leaves them out and runs
// models from directories only.
package assets

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"sort"
	"sync"
)

// errNotEmbedded is what a binary built without the model says when asked
// for it.
var errNotEmbedded = errors.New("assets: this binary was built without the default model (build tag nomodel): give a model directory")

// DefaultModelName is the name of the shipped default model.
const DefaultModelName = "deepseek-tiny"

// FS returns the shipped model's files, rooted at the model directory
// (config.json, model.safetensors, tokenizer.json, ...).
func FS() fs.FS {
	sub, err := fs.Sub(files, DefaultModelName)
	if err != nil {
		panic(err) // the embedded directory always exists
	}
	return sub
}

var (
	hashOnce sync.Once
	hashHex  string
)

// ContentHash returns the first 16 hex digits of a SHA-256 over the
// shipped model's file names and contents, in name order. Cost: one pass
// over the embedded bytes (tens of milliseconds) on the first call, then
// free.
func ContentHash() string {
	hashOnce.Do(func() {
		h := sha256.New()
		names, _ := fs.Glob(FS(), "*")
		sort.Strings(names)
		for _, name := range names {
			// Streamed: a copy of a 38 MB file would be garbage that the
			// process's first collections wait for.
			f, err := FS().Open(name)
			if err != nil {
				panic(err) // embedded files always open
			}
			st, err := f.Stat()
			if err != nil {
				panic(err)
			}
			fmt.Fprintf(h, "%s\x00%d\x00", name, st.Size())
			if _, err := io.Copy(h, f); err != nil {
				panic(err) // embedded files always read
			}
			f.Close()
		}
		hashHex = hex.EncodeToString(h.Sum(nil))[:16]
	})
	return hashHex
}

// DefaultModelDir returns a directory holding the shipped default model,
// writing it first when it is not there yet: <cache>/deepinfer/<hash>/<name>
// (the directory keeps the model's name, which servers show as its default
// name), where <cache> is os.UserCacheDir (or the temporary directory when there
// is none). The directory appears whole or not at all: the files are written
// into a fresh directory next to it which is then renamed, so concurrent
// first runs are safe (the loser of the rename removes its copy and uses the
// winner's), and an incomplete copy is written again. Cost: the content
// hash on the first call in a process, plus one write of about 38 MB the
// first time on a machine.
func DefaultModelDir() (string, error) {
	base, err := os.UserCacheDir()
	if err != nil || base == "" {
		base = os.TempDir()
	}
	return ExtractTo(filepath.Join(base, "deepinfer"))
}

// ExtractTo is DefaultModelDir with the cache directory given: it returns
// root/<hash>/<name>, creating the directories when missing.
func ExtractTo(root string) (string, error) {
	if !embedded {
		return "", errNotEmbedded
	}
	parent := filepath.Join(root, ContentHash())
	dir := filepath.Join(parent, DefaultModelName)
	if complete(dir) {
		return dir, nil
	}
	if err := os.MkdirAll(parent, 0o755); err != nil {
		return "", fmt.Errorf("assets: %w", err)
	}
	tmp, err := os.MkdirTemp(parent, ".tmp-"+DefaultModelName+"-")
	if err != nil {
		return "", fmt.Errorf("assets: %w", err)
	}
	defer os.RemoveAll(tmp) // a no-op once renamed
	names, _ := fs.Glob(FS(), "*")
	for _, name := range names {
		data, err := fs.ReadFile(FS(), name)
		if err != nil {
			return "", fmt.Errorf("assets: %w", err)
		}
		if err := os.WriteFile(filepath.Join(tmp, path.Base(name)), data, 0o644); err != nil {
			return "", fmt.Errorf("assets: writing the default model: %w", err)
		}
	}
	if err := os.Chmod(tmp, 0o755); err != nil {
		return "", fmt.Errorf("assets: %w", err)
	}
	if err := os.Rename(tmp, dir); err != nil {
		if complete(dir) { // another process got there first
			return dir, nil
		}
		// An incomplete copy (files removed by hand) is replaced.
		os.RemoveAll(dir)
		if err := os.Rename(tmp, dir); err != nil && !complete(dir) {
			return "", fmt.Errorf("assets: writing the default model: %w", err)
		}
	}
	return dir, nil
}

// complete reports whether dir holds every shipped file at its size.
func complete(dir string) bool {
	names, _ := fs.Glob(FS(), "*")
	for _, name := range names {
		want, err := fs.Stat(FS(), name)
		if err != nil {
			return false
		}
		got, err := os.Stat(filepath.Join(dir, name))
		if err != nil || got.Size() != want.Size() {
			return false
		}
	}
	return len(names) > 0
}
