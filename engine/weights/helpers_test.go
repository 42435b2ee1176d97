package weights

import (
	"encoding/binary"
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"testing"
)

// testTensor is one tensor to write into a test safetensors file.
type testTensor struct {
	name  string
	dtype string
	shape []int
	data  []byte
}

func f32Bytes(vals ...float32) []byte {
	b := make([]byte, 4*len(vals))
	for i, v := range vals {
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(v))
	}
	return b
}

func u16Bytes(vals ...uint16) []byte {
	b := make([]byte, 2*len(vals))
	for i, v := range vals {
		binary.LittleEndian.PutUint16(b[2*i:], v)
	}
	return b
}

func i32Bytes(vals ...int32) []byte {
	b := make([]byte, 4*len(vals))
	for i, v := range vals {
		binary.LittleEndian.PutUint32(b[4*i:], uint32(v))
	}
	return b
}

func i64Bytes(vals ...int64) []byte {
	b := make([]byte, 8*len(vals))
	for i, v := range vals {
		binary.LittleEndian.PutUint64(b[8*i:], uint64(v))
	}
	return b
}

// encodeSafetensors lays tensors out back to back after a header padded to a
// multiple of 8 bytes, as the reference writer does.
func encodeSafetensors(t testing.TB, tensors []testTensor, metadata map[string]string) []byte {
	t.Helper()
	header := map[string]any{}
	if metadata != nil {
		header["__metadata__"] = metadata
	}
	var body []byte
	for _, tt := range tensors {
		begin := len(body)
		body = append(body, tt.data...)
		header[tt.name] = map[string]any{
			"dtype":        tt.dtype,
			"shape":        tt.shape,
			"data_offsets": []int{begin, len(body)},
		}
	}
	return encodeRaw(t, header, body)
}

// encodeRaw writes an arbitrary header object followed by body.
func encodeRaw(t testing.TB, header any, body []byte) []byte {
	t.Helper()
	h, err := json.Marshal(header)
	if err != nil {
		t.Fatal(err)
	}
	return encodeHeaderBytes(h, body)
}

func encodeHeaderBytes(h, body []byte) []byte {
	for len(h)%8 != 0 {
		h = append(h, ' ')
	}
	out := make([]byte, 8, 8+len(h)+len(body))
	binary.LittleEndian.PutUint64(out, uint64(len(h)))
	out = append(out, h...)
	return append(out, body...)
}

func writeFile(t testing.TB, path string, data []byte) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
}

// tinyConfig is a small valid Llama config.json.
const tinyConfig = `{
  "architectures": ["LlamaForCausalLM"],
  "model_type": "llama",
  "vocab_size": 8,
  "hidden_size": 4,
  "intermediate_size": 8,
  "num_hidden_layers": 1,
  "num_attention_heads": 2,
  "num_key_value_heads": 1
}`
