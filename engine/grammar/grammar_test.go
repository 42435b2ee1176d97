package grammar

import (
	"strings"
	"testing"
)

// jsonGBNF is a JSON value grammar in llama.cpp's style (as json.gbnf, with
// unbounded whitespace and numbers).
const jsonGBNF = `
root   ::= ws value ws
value  ::= object | array | string | number | ("true" | "false" | "null")
object ::= "{" ws ( member ( ws "," ws member )* )? ws "}"
member ::= string ws ":" ws value
array  ::= "[" ws ( value ( ws "," ws value )* )? ws "]"
string ::= "\"" (
    [^"\\\x7F\x00-\x1F] |
    "\\" (["\\/bfnrt] | "u" [0-9a-fA-F]{4}) # escapes
  )* "\""
number ::= "-"? ("0" | [1-9] [0-9]*) ("." [0-9]+)? ([eE] [-+]? [0-9]+)?
ws     ::= [ \t\n]*
`

func mustGBNF(t testing.TB, src string) *Grammar {
	t.Helper()
	g, err := ParseGBNF(src)
	if err != nil {
		t.Fatalf("ParseGBNF: %v\n%s", err, src)
	}
	return g
}

func TestParseGBNFErrors(t *testing.T) {
	tests := []struct {
		name, src, want string
	}{
		{"undefined rule", "root ::= foo", `1:10: undefined rule "foo"`},
		{"undefined rule line 2", "root ::= \"a\"\n  x\nx ::= y", `3:7: undefined rule "y"`},
		{"bad escape literal", `root ::= "a\q"`, `1:12: bad escape \q`},
		{"bad escape class", `root ::= [\z]`, `1:11: bad escape \z`},
		{"short hex", `root ::= "\x4"`, `needs 2 hex digits`},
		{"surrogate", `root ::= "\uD800"`, `not a Unicode scalar value`},
		{"unterminated literal", "root ::= \"abc\n", `1:10: unterminated string literal`},
		{"unterminated class", "root ::= [abc", `1:10: unterminated character class`},
		{"missing ::=", "root = \"a\"", `1:6: expected ::= after rule name "root"`},
		{"missing paren", `root ::= ("a" | "b"`, `missing ')'`},
		{"extra paren", `root ::= "a" )`, `unbalanced ')'`},
		{"no root", `foo ::= "a"`, `no "root" rule`},
		{"defined twice", "root ::= \"a\"\nroot ::= \"b\"", `2:1: rule "root" defined twice`},
		{"left recursion", `root ::= root "a" | "b"`, `left recursion through rule "root"`},
		{"indirect left recursion", "root ::= a \"x\"\na ::= b? root | \"y\"\nb ::= \"z\"", `left recursion`},
		{"bad bounds", `root ::= "a"{3,2}`, `minimum exceeds maximum`},
		{"bad range", `root ::= [z-a]`, `bad range`},
		{"unexpected", `root ::= "a" @`, `1:14: unexpected '@'`},
		{"matches nothing", `root ::= "a" root`, `matches no finite string`},
		{"missing count", `root ::= "a"{x}`, `expected a count`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParseGBNF(tc.src)
			if err == nil {
				t.Fatalf("no error, want %q", tc.want)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %q, want it to contain %q", err, tc.want)
			}
		})
	}
}

func TestGBNFMatches(t *testing.T) {
	tests := []struct {
		name   string
		src    string
		accept []string
		reject []string
	}{
		{"literal", `root ::= "hello"`, []string{"hello"}, []string{"", "hell", "hello!", "Hello"}},
		{"escapes", `root ::= "a\n\t\"\\\x41\u00e9\U0001F600"`, []string{"a\n\t\"\\Aé😀"}, []string{"a"}},
		{"class", `root ::= [a-c0-9_]`, []string{"a", "c", "5", "_"}, []string{"d", "", "ab", "-"}},
		{"negated class", `root ::= [^a-c]`, []string{"d", "é", "😀", "\n"}, []string{"a", "b", "", "\xc3", "\xff"}},
		{"unicode class", `root ::= [é-ê€]+`, []string{"é", "êé€"}, []string{"e", "ë", ""}},
		{"dot", `root ::= . .`, []string{"ab", "é😀"}, []string{"a", "abc", "\xc3\xc3"}},
		{"alternation", `root ::= "cat" | "dog" | "do"`, []string{"cat", "dog", "do"}, []string{"ca", "d", "dogs"}},
		{"grouping", `root ::= ("a" | "b") "c"`, []string{"ac", "bc"}, []string{"c", "abc"}},
		{"star", `root ::= "a"*`, []string{"", "a", "aaaa"}, []string{"b", "ab"}},
		{"plus", `root ::= "ab"+`, []string{"ab", "abab"}, []string{"", "a", "aba"}},
		{"optional", `root ::= "a" "b"? "c"`, []string{"ac", "abc"}, []string{"abbc", "a"}},
		{"exact", `root ::= [0-9]{3}`, []string{"123"}, []string{"12", "1234"}},
		{"at least", `root ::= "x"{2,}`, []string{"xx", "xxxxx"}, []string{"x", ""}},
		{"between", `root ::= "x"{1,3}`, []string{"x", "xx", "xxx"}, []string{"", "xxxx"}},
		{"zero to n", `root ::= "x"{0,2} "y"`, []string{"y", "xy", "xxy"}, []string{"xxxy"}},
		{"nested repetition", `root ::= ("a"? "b"?)*`, []string{"", "ab", "ba", "aab"}, []string{"c"}},
		{"comments and lines", "# top\nroot ::= a   # tail\n  a\na ::=\n  \"x\" |\n  \"y\"", []string{"xx", "yx"}, []string{"x"}},
		{"parens", "root ::= p\np ::= \"(\" p* \")\"", []string{"()", "(())", "(()())"}, []string{"(", "())", ")(", "(()"}},
		{"right recursion", `root ::= "a" root | "b"`, []string{"b", "aaab"}, []string{"a", "ba"}},
		{"json", jsonGBNF,
			[]string{`{}`, ` {"a": [1, -2.5e+3, true, null, "x\"\u00e9y"]} `, `[[[[[]]]]]`, `"é😀"`, `0`, `{"k":{"k":{"k":{}}}}`},
			[]string{`{`, `{"a"}`, `[1,]`, `01`, `"\x"`, "\"a\x01\"", `tru`, `{} {}`, `"\u12"`},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			g := mustGBNF(t, tc.src)
			for _, s := range tc.accept {
				if !g.AcceptsString(s) {
					t.Errorf("rejects %q\n%s", s, g)
				}
			}
			for _, s := range tc.reject {
				if g.AcceptsString(s) {
					t.Errorf("accepts %q", s)
				}
			}
		})
	}
}

func TestParseRegex(t *testing.T) {
	tests := []struct {
		expr   string
		accept []string
		reject []string
	}{
		{`abc`, []string{"abc"}, []string{"ab", "abcd", ""}},
		{`^abc$`, []string{"abc"}, []string{"xabc"}},
		{`\Aa|b\z`, []string{"a", "b"}, []string{"ab"}},
		{`[a-z]+@[a-z]+\.(com|org)`, []string{"me@x.com", "a@bc.org"}, []string{"@x.com", "me@x.net"}},
		{`\d{3}-\d{4}`, []string{"555-1234"}, []string{"5551234", "55-1234"}},
		{`a{2,3}b?`, []string{"aa", "aaab"}, []string{"a", "aaaa"}},
		{`(?i)hi`, []string{"hi", "HI", "hI"}, []string{"h"}},
		{`.+`, []string{"x", "é"}, []string{"", "\n"}},
		{`(?s).`, []string{"\n"}, []string{""}},
		{`[^0-9]*`, []string{"", "abc", "é"}, []string{"a1"}},
		{`(a*)*b`, []string{"b", "aab"}, []string{"a"}},
		{`x*?y+?`, []string{"y", "xxyy"}, []string{"x"}},
		{`\p{Greek}+`, []string{"αβ"}, []string{"a"}},
		{`(true|false|null)`, []string{"true", "null"}, []string{"nul"}},
	}
	for _, tc := range tests {
		t.Run(tc.expr, func(t *testing.T) {
			g, err := ParseRegex(tc.expr)
			if err != nil {
				t.Fatal(err)
			}
			for _, s := range tc.accept {
				if !g.AcceptsString(s) {
					t.Errorf("rejects %q\n%s", s, g)
				}
			}
			for _, s := range tc.reject {
				if g.AcceptsString(s) {
					t.Errorf("accepts %q", s)
				}
			}
		})
	}
}

func TestParseRegexErrors(t *testing.T) {
	tests := []struct{ expr, want string }{
		{`a\bc`, `word boundary \b`},
		{`a\Bc`, `non-word boundary \B`},
		{`a^b`, `^ or \A anchor not at the start`},
		{`a$b`, `$ or \z anchor not at the end`},
		{`(?m)a$b`, `$ (multi-line)`},
		{`(a`, `missing closing )`},
		{`a{20000}`, `invalid repeat count`},
		{`[^\x00-\x{10FFFF}]`, `matches no finite string`},
	}
	for _, tc := range tests {
		t.Run(tc.expr, func(t *testing.T) {
			_, err := ParseRegex(tc.expr)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want %q", err, tc.want)
			}
		})
	}
}
