package cli

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// generate --json-schema, --regex, --choice and --grammar constrain the
// shipped model's output; bad flags are refused naming the flag.
func TestGenerateStructuredOutput(t *testing.T) {
	model, err := filepath.Abs(defaultModelDir)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	write := func(name, data string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	schema := write("schema.json", `{"type":"object","properties":{"name":{"type":"string","maxLength":8},"n":{"type":"integer","minimum":0,"maximum":99}},"required":["name","n"],"additionalProperties":false}`)
	gbnf := write("g.gbnf", `root ::= "go" [0-9] [0-9]`)
	tests := []struct {
		args  []string
		check func(string) bool
	}{
		{[]string{"--json-schema", schema, "--json-whitespace", "compact"}, func(s string) bool {
			var v struct {
				Name *string
				N    *int
			}
			d := json.NewDecoder(strings.NewReader(s))
			d.DisallowUnknownFields()
			return d.Decode(&v) == nil && v.Name != nil && len(*v.Name) <= 8 && v.N != nil && *v.N <= 99
		}},
		{[]string{"--regex", "[a-f]{4}"}, func(s string) bool { return len(s) == 4 && strings.Trim(s, "abcdef") == "" }},
		{[]string{"--choice", "left", "--choice", "right"}, func(s string) bool { return s == "left" || s == "right" }},
		{[]string{"--grammar", gbnf}, func(s string) bool { return len(s) == 4 && strings.HasPrefix(s, "go") }},
	}
	for _, tc := range tests {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			args := append([]string{"generate", "--model", model, "-p", "func main() {", "-n", "48", "-t", "0.8", "--seed", "7"}, tc.args...)
			out, err := run(t, args...)
			if err != nil {
				t.Fatal(err)
			}
			text, _, _ := strings.Cut(out, "\nstats:")
			text = strings.TrimSuffix(strings.TrimPrefix(text, "func main() {"), "\n")
			if !tc.check(text) {
				t.Fatalf("output %q", text)
			}
		})
	}
	for _, bad := range []struct {
		args []string
		want string
	}{
		{[]string{"--json-schema", filepath.Join(dir, "missing.json")}, "--json-schema: open"},
		{[]string{"--json-whitespace", "compact"}, "--json-whitespace needs --json-schema"},
		{[]string{"--regex", "a", "--choice", "b"}, "set only one of regex, choice"},
		{[]string{"--json-schema", write("bad.json", `{"type":"object","properties":{"x":{"not":{"minimum":1}}}}`)}, `unsupported keyword "not"`},
	} {
		// A constraint that does not compile fails its output: the reason
		// is printed, and the command fails.
		out, err := run(t, append([]string{"generate", "--model", model, "-p", "x", "-n", "4"}, bad.args...)...)
		if err == nil || !strings.Contains(err.Error()+out, bad.want) {
			t.Errorf("%v: error %v (output %q), want %q", bad.args, err, out, bad.want)
		}
	}
}
