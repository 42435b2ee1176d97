package weights

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"math"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"unsafe"
)

// stImage builds a safetensors image from a header and a body, with the
// header length field set to len(header)+lenDelta (wrapping, so any 64-bit
// value is reachable).
func stImage(header, body []byte, lenDelta int64) []byte {
	out := make([]byte, 8, 8+len(header)+len(body))
	binary.LittleEndian.PutUint64(out, uint64(int64(len(header))+lenDelta))
	out = append(out, header...)
	return append(out, body...)
}

// fuzzShapeProduct is the product of the non-zero dimensions of shape, or
// false when it overflows.
func fuzzShapeProduct(shape []int) (int64, bool) {
	p := int64(1)
	for _, d := range shape {
		if d == 0 {
			continue
		}
		if d < 0 || p > math.MaxInt64/int64(d) {
			return 0, false
		}
		p *= int64(d)
	}
	return p, true
}

// FuzzSafetensorsHeader feeds arbitrary header JSON, data bytes and header
// length fields to the safetensors parser. It must never panic; errors wrap
// ErrFormat or ErrDType; an accepted file's tensors lie inside the data, have
// exactly the bytes their shape and dtype need, do not overlap, and convert.
func FuzzSafetensorsHeader(f *testing.F) {
	good, err := Encode([]Tensor{
		F32Tensor("a", []int{2, 2}, []float32{1, 2, 3, 4}),
		I32Tensor("b", []int{3}, []int32{-1, 0, 1}),
		{Name: "h", DType: BF16, Shape: []int{2}, Data: []byte{0x80, 0x3f, 0, 0xc0}},
		{Name: "e", DType: F16, Shape: []int{0, 5}, Data: []byte{}},
		{Name: "s", DType: I64, Shape: []int{}, Data: make([]byte, 8)},
		{Name: "m", DType: Bool, Shape: []int{3}, Data: []byte{0, 1, 1}},
		{Name: "u", DType: U8, Shape: []int{1, 1, 1}, Data: []byte{7}},
	}, map[string]string{"format": "pt"})
	if err != nil {
		f.Fatal(err)
	}
	hlen := binary.LittleEndian.Uint64(good[:8])
	f.Add(good[8:8+hlen], good[8+hlen:], int64(0))
	body16 := make([]byte, 16)
	for _, h := range []string{
		`{}`,
		`{"__metadata__":{"format":"pt"}}`,
		`{"__metadata__":{"format":1}}`,
		`{"__metadata__":null}`,
		`{"x":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}}`,
		`{"x":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]},"__metadata__":{}}`,
		`{"x":{"dtype":"F32","shape":[4],"data_offsets":[0,12]}}`,
		`{"x":{"dtype":"F32","shape":[4],"data_offsets":[4,20]}}`,
		`{"x":{"dtype":"F32","shape":[4],"data_offsets":[16,0]}}`,
		`{"x":{"dtype":"F32","shape":[4],"data_offsets":[-16,0]}}`,
		`{"x":{"dtype":"F32","shape":[4],"data_offsets":[0]}}`,
		`{"x":{"dtype":"F32","shape":[4],"data_offsets":[0,16,32]}}`,
		`{"x":{"dtype":"F32","shape":[4]}}`,
		`{"x":{"dtype":"F8_E4M3","shape":[16],"data_offsets":[0,16]}}`,
		`{"x":{"dtype":"f32","shape":[4],"data_offsets":[0,16]}}`,
		`{"x":{"dtype":"F32","shape":[-4],"data_offsets":[0,16]}}`,
		`{"x":{"dtype":"F32","shape":[4.5],"data_offsets":[0,16]}}`,
		`{"x":{"dtype":"F32","shape":"4","data_offsets":[0,16]}}`,
		`{"x":{"dtype":"F32","shape":[9223372036854775807,9223372036854775807],"data_offsets":[0,16]}}`,
		`{"x":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,16]}}`,
		`{"x":{"dtype":"F32","shape":[0,9223372036854775807,9223372036854775807],"data_offsets":[0,0]}}`,
		`{"x":{"dtype":"F32","shape":[1152921504606846976],"data_offsets":[0,16]}}`,
		`{"x":{"dtype":"F32","shape":[18446744073709551616],"data_offsets":[0,16]}}`,
		`{"x":{"dtype":"F32","shape":[4],"data_offsets":[0,9223372036854775807]}}`,
		`{"x":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"y":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}}`,
		`{"x":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"y":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}}`,
		`{"x":{"dtype":"F32","shape":[0],"data_offsets":[4,4]},"y":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}`,
		`{"x":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"x":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}`,
		`{"x":null}`,
		`{"x":[]}`,
		`{"":{"dtype":"U8","shape":[16],"data_offsets":[0,16]}}`,
		`{"\u0000\ud800":{"dtype":"BOOL","shape":[16],"data_offsets":[0,16]}}`,
		`[]`,
		`null`,
		`"x"`,
		`{`,
		`{"x":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}}` + "        ",
	} {
		f.Add([]byte(h), body16, int64(0))
	}
	f.Add([]byte(`{}`), []byte{}, int64(1))
	f.Add([]byte(`{}`), []byte{}, int64(-2))
	f.Add([]byte(`{}`), []byte{}, int64(math.MaxInt64))
	f.Add([]byte(`{}`), []byte{}, int64(-1)<<63)
	f.Add([]byte{}, []byte{}, int64(-8))
	f.Fuzz(func(t *testing.T, header, body []byte, lenDelta int64) {
		data := stImage(header, body, lenDelta)
		checkSafetensors(t, data)
		// The raw concatenation, so the fuzzer can also reach images whose
		// length field is part of what it mutates.
		checkSafetensors(t, slices.Concat(header, body))
	})
}

func checkSafetensors(t *testing.T, data []byte) {
	file, err := parseSafetensors("fuzz.safetensors", data)
	if err != nil {
		if file != nil {
			t.Fatalf("returned a file and an error: %v", err)
		}
		if !errors.Is(err, ErrFormat) && !errors.Is(err, ErrDType) {
			t.Fatalf("error wraps neither ErrFormat nor ErrDType: %v", err)
		}
		return
	}
	hlen := binary.LittleEndian.Uint64(data[:8])
	body := data[8+hlen:]
	if !slices.IsSorted(file.Names()) || len(file.Names()) != len(file.tensors) {
		t.Fatalf("names %q not sorted or not one per tensor (%d)", file.Names(), len(file.tensors))
	}
	type span struct{ begin, end int }
	var spans []span
	for _, name := range file.Names() {
		tn, err := file.Tensor(name)
		if err != nil {
			t.Fatal(err)
		}
		if name == "__metadata__" {
			t.Fatal("__metadata__ taken as a tensor")
		}
		if _, ok := fuzzShapeProduct(tn.Shape); !ok && tn.NumElements() != 0 {
			t.Fatalf("tensor %q: shape %v overflows", name, tn.Shape)
		}
		if n := tn.NumElements(); n < 0 || len(tn.Data) != n*tn.DType.Size() {
			t.Fatalf("tensor %q: %d bytes for shape %v of %s", name, len(tn.Data), tn.Shape, tn.DType)
		}
		if cap(tn.Data) != len(tn.Data) {
			t.Fatalf("tensor %q: data can be extended past its end", name)
		}
		if len(tn.Data) > 0 {
			begin := int(uintptrDiff(tn.Data, body))
			if begin < 0 || begin+len(tn.Data) > len(body) {
				t.Fatalf("tensor %q: data [%d, %d) outside the %d data bytes", name, begin, begin+len(tn.Data), len(body))
			}
			spans = append(spans, span{begin, begin + len(tn.Data)})
		}
		if vals := tn.Float32s(); len(vals) != tn.NumElements() {
			t.Fatalf("tensor %q: Float32s gave %d values, want %d", name, len(vals), tn.NumElements())
		}
		if !tn.DType.IsFloat() {
			if vals, err := tn.Ints(); err != nil || len(vals) != tn.NumElements() {
				t.Fatalf("tensor %q: Ints gave %d values, %v", name, len(vals), err)
			}
		}
		_, _ = tn.AsFloat32()
		_, _ = tn.AsUint16()
	}
	slices.SortFunc(spans, func(a, b span) int { return a.begin - b.begin })
	for i := 1; i < len(spans); i++ {
		if spans[i].begin < spans[i-1].end {
			t.Fatalf("tensor data overlaps: %v", spans)
		}
	}
}

// uintptrDiff is the offset of the first byte of sub from the first byte of
// whole.
func uintptrDiff(sub, whole []byte) int64 {
	return int64(uintptr(unsafe.Pointer(unsafe.SliceData(sub))) - uintptr(unsafe.Pointer(unsafe.SliceData(whole))))
}

// FuzzShardIndex feeds arbitrary model.safetensors.index.json bytes to the
// sharded loader, over a directory holding two real shards. It must never
// panic (errors are fine); on success every tensor the weight map names is
// present, in the shard it names.
func FuzzShardIndex(f *testing.F) {
	dir := f.TempDir()
	shards := map[string][]Tensor{
		"model-00001-of-00002.safetensors": {
			F32Tensor("embed.weight", []int{2, 2}, []float32{1, 2, 3, 4}),
			F32Tensor("layers.0.w", []int{2}, []float32{5, 6}),
		},
		"model-00002-of-00002.safetensors": {
			F32Tensor("lm_head.weight", []int{2, 2}, []float32{7, 8, 9, 10}),
		},
		"bad.safetensors": nil,
	}
	for name, ts := range shards {
		data := []byte("not a safetensors file")
		if ts != nil {
			var err error
			if data, err = Encode(ts, nil); err != nil {
				f.Fatal(err)
			}
		}
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o644); err != nil {
			f.Fatal(err)
		}
	}
	if err := os.Mkdir(filepath.Join(dir, "sub"), 0o755); err != nil {
		f.Fatal(err)
	}
	for _, s := range []string{
		`{"metadata":{"total_size":28},"weight_map":{"embed.weight":"model-00001-of-00002.safetensors","layers.0.w":"model-00001-of-00002.safetensors","lm_head.weight":"model-00002-of-00002.safetensors"}}`,
		`{"weight_map":{"embed.weight":"model-00001-of-00002.safetensors"}}`,
		`{"weight_map":{}}`,
		`{"weight_map":null}`,
		`{"weight_map":[]}`,
		`{"weight_map":{"a":1}}`,
		`{"weight_map":{"embed.weight":"model-00002-of-00002.safetensors"}}`,
		`{"weight_map":{"x":"model-00003-of-00003.safetensors"}}`,
		`{"weight_map":{"x":""}}`,
		`{"weight_map":{"x":"."}}`,
		`{"weight_map":{"x":".."}}`,
		`{"weight_map":{"x":"sub"}}`,
		`{"weight_map":{"x":"../etc/passwd"}}`,
		`{"weight_map":{"x":"/etc/passwd"}}`,
		`{"weight_map":{"x":"bad.safetensors"}}`,
		`{"weight_map":{"x":"a\u0000b"}}`,
		`{"weight_map":{"embed.weight":"model-00001-of-00002.safetensors","embed.weight":"model-00002-of-00002.safetensors"}}`,
		`{}`,
		`[]`,
		`null`,
		`{`,
		``,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		path := filepath.Join(dir, IndexFile)
		ck := &Checkpoint{Dir: dir, tensors: make(map[string]entry)}
		defer ck.Close()
		err := ck.openSharded(path, data)
		if err != nil {
			return
		}
		var index struct {
			WeightMap map[string]string `json:"weight_map"`
		}
		if err := json.Unmarshal(data, &index); err != nil {
			t.Fatalf("accepted an index that does not decode: %v", err)
		}
		for name, shard := range index.WeightMap {
			if !ck.Has(name) {
				t.Fatalf("tensor %q named by the index is missing", name)
			}
			tn, err := ck.Tensor(name)
			if err != nil {
				t.Fatal(err)
			}
			if filepath.Base(tn.File) != shard || filepath.Dir(tn.File) != dir {
				t.Fatalf("tensor %q from %s, index names %s", name, tn.File, shard)
			}
		}
		if !slices.IsSorted(ck.Names()) {
			t.Fatalf("names not sorted: %q", ck.Names())
		}
	})
}

// FuzzParseConfig feeds arbitrary bytes to the config.json parser. It must
// never panic; errors wrap ErrConfig; an accepted config has the positive
// sizes every model needs.
func FuzzParseConfig(f *testing.F) {
	files, _ := filepath.Glob(filepath.Join("..", "..", "testdata", "models", "*", "*", ConfigFile))
	files2, _ := filepath.Glob(filepath.Join("..", "..", "testdata", "*", ConfigFile))
	for _, name := range append(files, files2...) {
		if data, err := os.ReadFile(name); err == nil {
			f.Add(data)
		}
	}
	base := `"vocab_size":8,"hidden_size":4,"intermediate_size":8,"num_hidden_layers":1,"num_attention_heads":2`
	for _, s := range []string{
		`{"model_type":"llama",` + base + `}`,
		`{"model_type":"llama",` + base + `,"num_key_value_heads":null,"head_dim":null}`,
		`{"model_type":"llama",` + base + `,"num_key_value_heads":3}`,
		`{"model_type":"llama",` + base + `,"num_key_value_heads":0}`,
		`{"model_type":"llama",` + base + `,"num_key_value_heads":-2}`,
		`{"model_type":"llama",` + base + `,"hidden_size":1}`,
		`{"model_type":"llama",` + base + `,"num_attention_heads":0}`,
		`{"model_type":"llama",` + base + `,"vocab_size":1e3}`,
		`{"model_type":"llama",` + base + `,"vocab_size":1.5}`,
		`{"model_type":"llama",` + base + `,"vocab_size":1e300}`,
		`{"model_type":"llama",` + base + `,"vocab_size":9007199254740993}`,
		`{"model_type":"llama",` + base + `,"vocab_size":"8"}`,
		`{"model_type":"llama",` + base + `,"rms_norm_eps":0}`,
		`{"model_type":"llama",` + base + `,"eos_token_id":[1,2,3],"bos_token_id":null,"pad_token_id":0}`,
		`{"model_type":"llama",` + base + `,"eos_token_id":[1,"2"]}`,
		`{"model_type":"llama",` + base + `,"rope_scaling":{"rope_type":"llama3","factor":8.0,"low_freq_factor":1.0,"high_freq_factor":4.0,"original_max_position_embeddings":8192}}`,
		`{"model_type":"llama",` + base + `,"rope_scaling":{"type":"yarn","factor":4,"beta_fast":32,"beta_slow":1,"mscale":1,"mscale_all_dim":0}}`,
		`{"model_type":"llama",` + base + `,"rope_parameters":{"rope_type":"default","rope_theta":500000}}`,
		`{"model_type":"llama",` + base + `,"rope_scaling":[]}`,
		`{"model_type":"llama",` + base + `,"rope_scaling":{"factor":"x"}}`,
		`{"model_type":"qwen3",` + base + `,"use_sliding_window":true,"sliding_window":4096,"layer_types":["full_attention","sliding_attention"]}`,
		`{"model_type":"qwen3"}`,
		`{"model_type":"deepseek_v3"}`,
		`{"model_type":"deepseek_v2",` + base + `,"qk_rope_head_dim":0}`,
		`{"model_type":"deepseek_v3",` + base + `,"n_routed_experts":3,"n_group":2}`,
		`{"model_type":"deepseek_v3",` + base + `,"n_routed_experts":4,"n_group":0}`,
		`{"model_type":"mistral"}`,
		`{"model_type":7}`,
		`{"architectures":"LlamaForCausalLM"}`,
		`{}`,
		`null`,
		`[]`,
		`"x"`,
		`{"a":1}{"b":2}`,
		`{`,
		``,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		cfg, err := ParseConfig(data)
		if err != nil {
			if cfg != nil {
				t.Fatalf("returned a config and an error: %v", err)
			}
			if !errors.Is(err, ErrConfig) {
				t.Fatalf("error does not wrap ErrConfig: %v", err)
			}
			return
		}
		if err := cfg.validate(); err != nil {
			t.Fatalf("accepted a config that does not validate: %v", err)
		}
		if cfg.NumAttentionHeads%cfg.NumKeyValueHeads != 0 {
			t.Fatalf("heads %d not a multiple of kv heads %d", cfg.NumAttentionHeads, cfg.NumKeyValueHeads)
		}
		for i := range min(cfg.NumHiddenLayers, 64) {
			_ = cfg.IsMoELayer(i)
		}
	})
}
