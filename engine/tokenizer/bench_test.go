package tokenizer

import "testing"

// BenchmarkEncodeCorpus measures single-goroutine encode throughput over the
// parity corpus (MB/s of UTF-8 text), the figure compared with HF tokenizers.
// One op is one pass over the corpus; the piece cache is warm after the first.
func BenchmarkEncodeCorpus(b *testing.B) {
	corpus := loadCorpus(b)
	n := 0
	for _, s := range corpus {
		n += len(s)
	}
	for _, name := range parityNames {
		b.Run(name, func(b *testing.B) {
			tk := loadNamed(b, name)
			for _, s := range corpus {
				tk.Encode(s, true)
			}
			b.SetBytes(int64(n))
			b.ResetTimer()
			for range b.N {
				for _, s := range corpus {
					tk.Encode(s, true)
				}
			}
		})
	}
}

// BenchmarkEncodeCold measures encode with an empty piece cache on each pass.
func BenchmarkEncodeCold(b *testing.B) {
	corpus := loadCorpus(b)
	n := 0
	for _, s := range corpus {
		n += len(s)
	}
	for _, name := range []string{"qwen3", "llama3"} {
		b.Run(name, func(b *testing.B) {
			tk := loadNamed(b, name)
			b.SetBytes(int64(n))
			b.ResetTimer()
			for range b.N {
				b.StopTimer()
				tk.model.cache = pieceCache{}
				b.StartTimer()
				for _, s := range corpus {
					tk.Encode(s, true)
				}
			}
		})
	}
}
