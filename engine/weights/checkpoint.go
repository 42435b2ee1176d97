package weights

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
)

// File names of a Hugging Face model directory.
const (
	ConfigFile      = "config.json"
	SingleFile      = "model.safetensors"
	IndexFile       = "model.safetensors.index.json"
	indexWeightsKey = "weight_map"
)

// Checkpoint is an opened Hugging Face model directory: its parsed config.json
// and the tensors of all its safetensors files, memory-mapped. It is safe for
// concurrent use; tensors alias the mappings and are valid until Close.
type Checkpoint struct {
	// Dir is the directory given to Open.
	Dir string
	// Config is the parsed config.json.
	Config *Config

	files   []*File
	tensors map[string]entry
	names   []string // sorted
	index   string   // path of the index file; "" for a single file
}

// entry is one tensor and the file that maps it.
type entry struct {
	tensor Tensor
	file   *File
}

// Open reads dir/config.json and maps the weights: dir/model.safetensors, or
// when dir/model.safetensors.index.json exists, every shard its weight_map
// names. Every tensor the index names must be in the shard it names
// (ErrMissingShard otherwise), and no tensor may appear in two files
// (ErrFormat). Cost: one read of config.json and of the index, one mmap and
// header parse per file; no weight bytes are read.
func Open(dir string) (*Checkpoint, error) {
	cfg, err := ReadConfig(filepath.Join(dir, ConfigFile))
	if err != nil {
		return nil, err
	}
	ck := &Checkpoint{Dir: dir, Config: cfg, tensors: make(map[string]entry)}
	if err := ck.openWeights(); err != nil {
		_ = ck.Close()
		return nil, err
	}
	return ck, nil
}

func (ck *Checkpoint) openWeights() error {
	index_path := filepath.Join(ck.Dir, IndexFile)
	index_data, err := os.ReadFile(index_path)
	switch {
	case err == nil:
		ck.index = index_path
		return ck.openSharded(index_path, index_data)
	case !errors.Is(err, fs.ErrNotExist):
		return fmt.Errorf("weights: %w", err)
	}
	single := filepath.Join(ck.Dir, SingleFile)
	if _, err := os.Stat(single); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("weights: %s: neither %s nor %s: %w", ck.Dir, SingleFile, IndexFile, ErrNoWeights)
		}
		return fmt.Errorf("weights: %w", err)
	}
	return ck.addFile(single)
}

func (ck *Checkpoint) openSharded(index_path string, index_data []byte) error {
	var index map[string]json.RawMessage
	if err := json.Unmarshal(index_data, &index); err != nil {
		return fmt.Errorf("weights: %s: not a JSON object: %v: %w", index_path, err, ErrFormat)
	}
	var weight_map map[string]string
	raw, ok := index[indexWeightsKey]
	if !ok {
		return fmt.Errorf("weights: %s: no %q: %w", index_path, indexWeightsKey, ErrFormat)
	}
	if err := json.Unmarshal(raw, &weight_map); err != nil {
		return fmt.Errorf("weights: %s: %q is not a map of strings: %v: %w", index_path, indexWeightsKey, err, ErrFormat)
	}
	by_shard := make(map[string][]string)
	for name, shard := range weight_map {
		if shard == "" || filepath.Base(shard) != shard {
			return fmt.Errorf("weights: %s: tensor %q: shard name %q is not a plain file name: %w",
				index_path, name, shard, ErrFormat)
		}
		by_shard[shard] = append(by_shard[shard], name)
	}
	shards := make([]string, 0, len(by_shard))
	for shard := range by_shard {
		shards = append(shards, shard)
	}
	slices.Sort(shards)
	for _, shard := range shards {
		names := by_shard[shard]
		slices.Sort(names)
		path := filepath.Join(ck.Dir, shard)
		if _, err := os.Stat(path); err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return fmt.Errorf("weights: %s: shard %s (named for tensor %q and %d more) is absent: %w",
					index_path, path, names[0], len(names)-1, ErrMissingShard)
			}
			return fmt.Errorf("weights: %w", err)
		}
		if err := ck.addFile(path); err != nil {
			return err
		}
		f := ck.files[len(ck.files)-1]
		for _, name := range names {
			if !f.Has(name) {
				return fmt.Errorf("weights: %s: tensor %q: index names shard %s, which lacks it: %w",
					index_path, name, path, ErrMissingShard)
			}
		}
	}
	return nil
}

// addFile maps one safetensors file and merges its tensors.
func (ck *Checkpoint) addFile(path string) error {
	f, err := OpenFile(path)
	if err != nil {
		return err
	}
	ck.files = append(ck.files, f)
	for _, name := range f.Names() {
		if prev, dup := ck.tensors[name]; dup {
			return fmt.Errorf("weights: tensor %q: in both %s and %s: %w", name, prev.file.path, path, ErrFormat)
		}
		ck.tensors[name] = entry{tensor: f.tensors[name], file: f}
	}
	ck.names = ck.names[:0]
	for name := range ck.tensors {
		ck.names = append(ck.names, name)
	}
	slices.Sort(ck.names)
	return nil
}

// Files returns the opened safetensors files in the order they were mapped.
func (ck *Checkpoint) Files() []*File { return ck.files }

// Names returns all tensor names in sorted order. The caller must not modify
// the slice.
func (ck *Checkpoint) Names() []string { return ck.names }

// Has reports whether the checkpoint holds a tensor called name.
func (ck *Checkpoint) Has(name string) bool {
	_, ok := ck.tensors[name]
	return ok
}

// Tensor returns the tensor called name; its Data aliases the mapping. A
// missing name is an error wrapping ErrNotFound that names the index file
// (sharded) or the single file it was looked for in. Cost: a map lookup.
func (ck *Checkpoint) Tensor(name string) (Tensor, error) {
	e, ok := ck.tensors[name]
	if !ok {
		if ck.index != "" {
			return Tensor{}, fmt.Errorf("weights: %s: tensor %q: in neither the index nor any of its %d shards: %w",
				ck.index, name, len(ck.files), ErrNotFound)
		}
		where := ck.Dir
		if len(ck.files) == 1 {
			where = ck.files[0].path
		}
		return Tensor{}, fmt.Errorf("weights: %s: tensor %q: %w", where, name, ErrNotFound)
	}
	if err := e.file.checkOpen(); err != nil {
		return Tensor{}, err
	}
	return e.tensor, nil
}

// Expect returns the tensor called name after checking that its shape is
// exactly shape; a mismatch is an error wrapping ErrShape that names the file,
// the tensor, and both shapes.
func (ck *Checkpoint) Expect(name string, shape ...int) (Tensor, error) {
	t, err := ck.Tensor(name)
	if err != nil {
		return Tensor{}, err
	}
	return expectShape(t, shape)
}

// Close unmaps every file. Tensors obtained from the checkpoint must no longer
// be used. Closing twice returns nil.
func (ck *Checkpoint) Close() error {
	var errs []error
	for _, f := range ck.files {
		errs = append(errs, f.Close())
	}
	return errors.Join(errs...)
}
