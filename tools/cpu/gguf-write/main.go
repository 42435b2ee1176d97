// Command gguf-write writes a GGUF file (version 3) from a Hugging Face
// model directory (config.json, *.safetensors, tokenizer.json), with the
// weight types of llama.cpp's presets (see package ggufwrite), so that
// llama.cpp and this engine can run the same weights:
//
//	go run ./tools/cpu/gguf-write -model DIR [-tokenizer DIR] -type q4_k_m -out model.gguf
//
// Types: f32, bf16, q8_0 and q4_k_m. Architectures: Llama, Qwen2, Qwen3,
// Qwen3-MoE, Mixtral (as llama with experts) and DeepSeek V2/V3 (as
// deepseek2); a model directory without tokenizer.json (and no -tokenizer)
// gives a file without a vocabulary, which this engine runs on token ids.
package main

import (
	"bytes"
	"flag"
	"fmt"
	"os"
	"strings"

	"github.com/deepinfer/deepinfer-go/engine/models/ggufwrite"
)

func main() {
	model := flag.String("model", "", "Hugging Face model directory")
	tokDir := flag.String("tokenizer", "", "directory of tokenizer.json (default: -model)")
	typ := flag.String("type", "f32", "weight type: f32, bf16, q8_0, q4_k_m")
	out := flag.String("out", "", "output GGUF file")
	flag.Parse()
	if *model == "" || *out == "" {
		flag.Usage()
		os.Exit(2)
	}
	var buf bytes.Buffer
	err := ggufwrite.Write(&buf, *model, *tokDir, strings.ToLower(*typ))
	if err == nil {
		err = os.WriteFile(*out, buf.Bytes(), 0o644)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "gguf-write:", err)
		os.Exit(1)
	}
}
