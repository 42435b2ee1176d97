package weights

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// writeSharded writes config.json, two shards and an index into dir.
func writeSharded(t *testing.T, dir string, weight_map map[string]string) {
	t.Helper()
	writeFile(t, filepath.Join(dir, ConfigFile), []byte(tinyConfig))
	writeFile(t, filepath.Join(dir, "model-00001-of-00002.safetensors"), encodeSafetensors(t, []testTensor{
		{"model.embed_tokens.weight", "BF16", []int{8, 4}, make([]byte, 64)},
		{"model.norm.weight", "F32", []int{4}, f32Bytes(1, 1, 1, 1)},
	}, nil))
	writeFile(t, filepath.Join(dir, "model-00002-of-00002.safetensors"), encodeSafetensors(t, []testTensor{
		{"lm_head.weight", "BF16", []int{8, 4}, make([]byte, 64)},
	}, nil))
	index, err := json.Marshal(map[string]any{"metadata": map[string]any{"total_size": 132}, "weight_map": weight_map})
	if err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(dir, IndexFile), index)
}

var goodWeightMap = map[string]string{
	"model.embed_tokens.weight": "model-00001-of-00002.safetensors",
	"model.norm.weight":         "model-00001-of-00002.safetensors",
	"lm_head.weight":            "model-00002-of-00002.safetensors",
}

func TestOpenSingleFile(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, ConfigFile), []byte(tinyConfig))
	writeFile(t, filepath.Join(dir, SingleFile), encodeSafetensors(t, []testTensor{
		{"model.norm.weight", "F32", []int{4}, f32Bytes(1, 2, 3, 4)},
		{"lm_head.weight", "F16", []int{8, 4}, make([]byte, 64)},
	}, nil))
	ck, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer ck.Close()
	if ck.Config.ModelType != "llama" || ck.Config.NumKeyValueHeads != 1 {
		t.Errorf("Config = %+v", ck.Config)
	}
	if got, want := ck.Names(), []string{"lm_head.weight", "model.norm.weight"}; !slices.Equal(got, want) {
		t.Errorf("Names() = %v, want %v", got, want)
	}
	norm, err := ck.Expect("model.norm.weight", 4)
	if err != nil {
		t.Fatal(err)
	}
	if got := norm.Float32s(); !slices.Equal(got, []float32{1, 2, 3, 4}) {
		t.Errorf("norm = %v", got)
	}
	if len(ck.Files()) != 1 {
		t.Errorf("Files() = %d files, want 1", len(ck.Files()))
	}
}

func TestOpenSharded(t *testing.T) {
	dir := t.TempDir()
	writeSharded(t, dir, goodWeightMap)
	ck, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer ck.Close()
	if got, want := ck.Names(), []string{"lm_head.weight", "model.embed_tokens.weight", "model.norm.weight"}; !slices.Equal(got, want) {
		t.Errorf("Names() = %v, want %v", got, want)
	}
	head, err := ck.Expect("lm_head.weight", 8, 4)
	if err != nil {
		t.Fatal(err)
	}
	if filepath.Base(head.File) != "model-00002-of-00002.safetensors" || head.DType != BF16 {
		t.Errorf("lm_head in %s as %s", head.File, head.DType)
	}
	if !ck.Has("model.norm.weight") || ck.Has("model.layers.0.mlp.up_proj.weight") {
		t.Error("Has() wrong")
	}
	if err := ck.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := ck.Tensor("lm_head.weight"); !errors.Is(err, ErrClosed) {
		t.Errorf("Tensor after Close: err = %v, want ErrClosed", err)
	}
}

func TestOpenErrors(t *testing.T) {
	tests := []struct {
		name  string
		setup func(t *testing.T, dir string)
		is    []error
		wants []string // substrings; "$DIR" is replaced by the directory
	}{
		{
			name:  "missing config.json",
			setup: func(t *testing.T, dir string) {},
			is:    []error{ErrConfig, fs.ErrNotExist},
			wants: []string{"$DIR/config.json"},
		},
		{
			name: "config.json not JSON",
			setup: func(t *testing.T, dir string) {
				writeFile(t, filepath.Join(dir, ConfigFile), []byte(`{"vocab_size": 8,`))
			},
			is:    []error{ErrConfig},
			wants: []string{"$DIR/config.json", "not a JSON object"},
		},
		{
			name: "no weights",
			setup: func(t *testing.T, dir string) {
				writeFile(t, filepath.Join(dir, ConfigFile), []byte(tinyConfig))
			},
			is:    []error{ErrNoWeights},
			wants: []string{"$DIR", SingleFile, IndexFile},
		},
		{
			name: "truncated single file",
			setup: func(t *testing.T, dir string) {
				writeFile(t, filepath.Join(dir, ConfigFile), []byte(tinyConfig))
				data := encodeSafetensors(t, []testTensor{{"w", "F32", []int{4}, f32Bytes(1, 2, 3, 4)}}, nil)
				writeFile(t, filepath.Join(dir, SingleFile), data[:len(data)-1])
			},
			is:    []error{ErrFormat},
			wants: []string{"$DIR/model.safetensors", `tensor "w"`, "out of range"},
		},
		{
			name: "shard absent",
			setup: func(t *testing.T, dir string) {
				m := maps(goodWeightMap)
				m["model.layers.0.mlp.up_proj.weight"] = "model-00003-of-00003.safetensors"
				writeSharded(t, dir, m)
			},
			is:    []error{ErrMissingShard},
			wants: []string{"$DIR/model-00003-of-00003.safetensors", "model.layers.0.mlp.up_proj.weight", "absent"},
		},
		{
			name: "tensor not in its shard",
			setup: func(t *testing.T, dir string) {
				m := maps(goodWeightMap)
				m["model.layers.0.mlp.up_proj.weight"] = "model-00002-of-00002.safetensors"
				writeSharded(t, dir, m)
			},
			is:    []error{ErrMissingShard},
			wants: []string{"model-00002-of-00002.safetensors", `tensor "model.layers.0.mlp.up_proj.weight"`, "lacks it"},
		},
		{
			name: "index not JSON",
			setup: func(t *testing.T, dir string) {
				writeSharded(t, dir, goodWeightMap)
				writeFile(t, filepath.Join(dir, IndexFile), []byte(`{"weight_map": `))
			},
			is:    []error{ErrFormat},
			wants: []string{"$DIR/" + IndexFile},
		},
		{
			name: "index without weight_map",
			setup: func(t *testing.T, dir string) {
				writeSharded(t, dir, goodWeightMap)
				writeFile(t, filepath.Join(dir, IndexFile), []byte(`{"metadata": {}}`))
			},
			is:    []error{ErrFormat},
			wants: []string{"$DIR/" + IndexFile, "weight_map"},
		},
		{
			name: "shard name escapes the directory",
			setup: func(t *testing.T, dir string) {
				m := maps(goodWeightMap)
				m["lm_head.weight"] = "../model-00002-of-00002.safetensors"
				writeSharded(t, dir, m)
			},
			is:    []error{ErrFormat},
			wants: []string{`tensor "lm_head.weight"`, "not a plain file name"},
		},
		{
			name: "tensor in two shards",
			setup: func(t *testing.T, dir string) {
				writeSharded(t, dir, goodWeightMap)
				writeFile(t, filepath.Join(dir, "model-00002-of-00002.safetensors"), encodeSafetensors(t, []testTensor{
					{"lm_head.weight", "BF16", []int{8, 4}, make([]byte, 64)},
					{"model.norm.weight", "F32", []int{4}, make([]byte, 16)},
				}, nil))
			},
			is:    []error{ErrFormat},
			wants: []string{`tensor "model.norm.weight"`, "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"},
		},
		{
			name: "unsupported dtype in a shard",
			setup: func(t *testing.T, dir string) {
				writeSharded(t, dir, goodWeightMap)
				writeFile(t, filepath.Join(dir, "model-00002-of-00002.safetensors"), encodeRaw(t, map[string]any{
					"lm_head.weight": map[string]any{"dtype": "C64", "shape": []int{4}, "data_offsets": []int{0, 32}},
				}, make([]byte, 32)))
			},
			is:    []error{ErrDType},
			wants: []string{"model-00002-of-00002.safetensors", `tensor "lm_head.weight"`, `"C64"`},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			tc.setup(t, dir)
			ck, err := Open(dir)
			if err == nil {
				ck.Close()
				t.Fatal("Open succeeded, want an error")
			}
			for _, is := range tc.is {
				if !errors.Is(err, is) {
					t.Errorf("err = %v, want errors.Is %v", err, is)
				}
			}
			for _, want := range tc.wants {
				want = strings.ReplaceAll(want, "$DIR", dir)
				if !strings.Contains(err.Error(), want) {
					t.Errorf("err = %q, want it to mention %q", err, want)
				}
			}
		})
	}
}

func TestCheckpointLookupErrors(t *testing.T) {
	dir := t.TempDir()
	writeSharded(t, dir, goodWeightMap)
	ck, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer ck.Close()

	_, err = ck.Tensor("model.layers.0.self_attn.q_proj.weight")
	if !errors.Is(err, ErrNotFound) {
		t.Errorf("missing tensor: err = %v, want ErrNotFound", err)
	}
	for _, want := range []string{dir, `tensor "model.layers.0.self_attn.q_proj.weight"`} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("missing tensor: err = %v, want it to mention %q", err, want)
		}
	}

	_, err = ck.Expect("model.embed_tokens.weight", 4, 8)
	if !errors.Is(err, ErrShape) {
		t.Errorf("wrong shape: err = %v, want ErrShape", err)
	}
	for _, want := range []string{"model-00001-of-00002.safetensors", `tensor "model.embed_tokens.weight"`, "shape [8 4]", "want [4 8]"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("wrong shape: err = %v, want it to mention %q", err, want)
		}
	}
}

func maps(m map[string]string) map[string]string {
	out := make(map[string]string, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

func ExampleOpen() {
	dir, err := os.MkdirTemp("", "weights-example")
	if err != nil {
		panic(err)
	}
	defer os.RemoveAll(dir)
	// A model directory: config.json plus model.safetensors.
	if err := os.WriteFile(filepath.Join(dir, "config.json"), []byte(`{
	  "model_type": "llama", "vocab_size": 4, "hidden_size": 2,
	  "num_hidden_layers": 1, "num_attention_heads": 1,
	  "rope_scaling": {"rope_type": "linear", "factor": 2.0}
	}`), 0o644); err != nil {
		panic(err)
	}
	norm := F32Tensor("model.norm.weight", []int{2}, []float32{1, 2})
	if err := WriteFile(filepath.Join(dir, "model.safetensors"), []Tensor{norm}, nil); err != nil {
		panic(err)
	}

	ck, err := Open(dir)
	if err != nil {
		panic(err)
	}
	defer ck.Close()
	fmt.Println(ck.Config.ModelType, ck.Config.HeadDim, ck.Config.Rope.Type, ck.Config.Rope.Factor)
	w, err := ck.Expect("model.norm.weight", 2)
	if err != nil {
		panic(err)
	}
	fmt.Println(w.DType, w.Float32s())
	_, err = ck.Expect("model.norm.weight", 3)
	fmt.Println(errors.Is(err, ErrShape))
	// Output:
	// llama 2 linear 2
	// F32 [1 2]
	// true
}
