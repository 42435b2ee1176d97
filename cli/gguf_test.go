package cli

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/deepinfer/deepinfer-go/engine/models/ggufwrite"
	"github.com/deepinfer/deepinfer-go/engine/models/random"
)

// TestGenerateGGUF: `generate -m FILE.gguf` runs a GGUF file written from a
// model directory, with the tokenizer from the file's metadata: the F32
// file generates what the directory generates (text prompt and ids,
// greedy; the file's K/V caches in half by default, the directory's in
// float32, the same tokens on these prompts), the Q8_0 file runs from its
// blocks (its stats line says Q8_0).
func TestGenerateGGUF(t *testing.T) {
	dir := t.TempDir()
	// A random Llama with the shipped model's byte-level BPE tokenizer
	// (8192 tokens) and chat template.
	if err := random.WriteLlamaWithTokenizer(dir, random.SmallLlama(8192), 7, filepath.Join("..", "assets", "deepseek-tiny")); err != nil {
		t.Fatal(err)
	}
	cfg := filepath.Join(dir, "run.yaml")
	if err := os.WriteFile(cfg, []byte("model: .\ncpu: {threads: 2}\ncache: {num_blocks: 64}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	files := map[string]string{}
	for _, preset := range []string{"f32", "q8_0"} {
		var buf bytes.Buffer
		if err := ggufwrite.Write(&buf, dir, "", preset); err != nil {
			t.Fatal(err)
		}
		files[preset] = filepath.Join(dir, "model-"+preset+".gguf")
		if err := os.WriteFile(files[preset], buf.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	// output drops the stats line (timings) and returns it apart.
	output := func(args ...string) (string, string) {
		t.Helper()
		out, err := run(t, append([]string{"generate", "-c", cfg}, args...)...)
		if err != nil {
			t.Fatalf("%v: %v\n%s", args, err, out)
		}
		var keep []string
		stats := ""
		for _, line := range strings.Split(out, "\n") {
			if strings.HasPrefix(line, "stats:") {
				stats = line
				continue
			}
			keep = append(keep, line)
		}
		return strings.Join(keep, "\n"), stats
	}
	for _, prompt := range [][]string{{"-p", "hello world", "-n", "12"}, {"--token-ids", "-p", "5 9 17 3", "-n", "12", "--ignore-eos"}} {
		want, _ := output(append([]string{"-m", dir}, prompt...)...)
		got, stats := output(append([]string{"-m", files["f32"]}, prompt...)...)
		if got != want {
			t.Errorf("%v: GGUF F32 output\n%q\nwant the directory's\n%q", prompt, got, want)
		}
		if !strings.Contains(stats, "F32") {
			t.Errorf("stats line %q does not name F32", stats)
		}
		q, stats := output(append([]string{"-m", files["q8_0"]}, prompt...)...)
		if q == "" || !strings.Contains(stats, "Q8_0") {
			t.Errorf("Q8_0 file: output %q, stats %q (want Q8_0 named)", q, stats)
		}
	}
	if _, err := run(t, "generate", "-c", cfg, "-m", files["f32"], "-p", "hi", "--chat-template", cfg); err == nil ||
		!strings.Contains(err.Error(), "--chat-template") {
		t.Errorf("--chat-template with a GGUF file: err = %v, want one naming the flag", err)
	}
}
