package weights

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// A config.json with a negative special-token id is refused, naming the
// key; pad_token_id -1 is the old spelling of "none".
func TestReadConfigSpecialTokenIDs(t *testing.T) {
	const base = `"model_type": "llama", "vocab_size": 64, "hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 4`
	tests := []struct {
		name, ids string
		want      string // "" loads
		check     func(*Config) bool
	}{
		{name: "eos -5", ids: `"eos_token_id": -5`, want: "eos_token_id[0] = -5, want >= 0"},
		{name: "eos list with a negative", ids: `"eos_token_id": [2, -5]`, want: "eos_token_id[1] = -5"},
		{name: "bos -1", ids: `"bos_token_id": -1`, want: "bos_token_id = -1"},
		{name: "pad -3", ids: `"pad_token_id": -3`, want: "pad_token_id = -3"},
		{name: "pad -1 is none", ids: `"pad_token_id": -1`, check: func(c *Config) bool { return c.PadTokenID == nil }},
		{name: "valid ids", ids: `"bos_token_id": 1, "eos_token_id": [2, 3], "pad_token_id": 0`,
			check: func(c *Config) bool { return *c.BOSTokenID == 1 && len(c.EOSTokenIDs) == 2 && *c.PadTokenID == 0 }},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "config.json")
			if err := os.WriteFile(path, []byte("{"+base+", "+tc.ids+"}"), 0o644); err != nil {
				t.Fatal(err)
			}
			cfg, err := ReadConfig(path)
			if tc.want != "" {
				if !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), tc.want) {
					t.Fatalf("ReadConfig = %v, want ErrConfig with %q", err, tc.want)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !tc.check(cfg) {
				t.Fatalf("parsed %+v", cfg)
			}
		})
	}
}
