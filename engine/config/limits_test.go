package config

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// Impossible values are refused when the file loads, naming the key; the
// switches of the hardening keys load.
func TestLoadBoundsAndSwitches(t *testing.T) {
	tests := []struct {
		name, yaml string
		want       string // "" loads
		check      func(*Config) bool
	}{
		{name: "cpu_memory_gib past the bound", yaml: "model: m\ncache: {cpu_memory_gib: 100000}\n",
			want: "cache.cpu_memory_gib: must be in (0, 65536] GiB"},
		{name: "cpu_memory_gib at the bound", yaml: "model: m\ncache: {cpu_memory_gib: 65536}\n",
			check: func(c *Config) bool { return c.Cache.CPUMemoryGiB == MaxCPUMemoryGiB }},
		{name: "cpu_memory_gib zero", yaml: "model: m\ncache: {cpu_memory_gib: 0}\n", want: "cache.cpu_memory_gib"},
		{name: "allow_long_max_model_len", yaml: "model: m\nengine: {max_model_len: 100000, allow_long_max_model_len: true}\n",
			check: func(c *Config) bool { return c.Engine.AllowLongMaxModelLen && c.Engine.MaxModelLen == 100000 }},
		{name: "parse_special_tokens_in_content", yaml: "model: m\nchat: {parse_special_tokens_in_content: true}\n",
			check: func(c *Config) bool { return c.Chat.ParseSpecialTokensInContent }},
		{name: "defaults off", yaml: "model: m\n",
			check: func(c *Config) bool { return !c.Chat.ParseSpecialTokensInContent && !c.Engine.AllowLongMaxModelLen }},
		{name: "mistyped switch", yaml: "model: m\nchat: {parse_special_tokens_in_content: maybe}\n",
			want: "chat.parse_special_tokens_in_content: expected true or false"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "c.yaml")
			if err := os.WriteFile(path, []byte(tc.yaml), 0o644); err != nil {
				t.Fatal(err)
			}
			cfg, err := Load(path)
			if tc.want != "" {
				if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), tc.want) {
					t.Fatalf("Load = %v, want ErrInvalid with %q", err, tc.want)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !tc.check(cfg) {
				t.Fatalf("loaded %+v", cfg)
			}
		})
	}
}
