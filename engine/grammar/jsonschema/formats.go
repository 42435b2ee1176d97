package jsonschema

// formatRule returns the string-content grammar for a known format.
// The patterns are conservative: they accept only well-formed values and may
// reject some exotic valid ones (e.g. leap seconds, lowercase "t"/"z",
// quoted local parts in emails).
func (c *converter) formatRule(f string) (string, bool) {
	d := "[0-9]"
	switch f {
	case "date":
		return c.dateRule(), true
	case "time":
		return c.timeRule(), true
	case "date-time":
		return c.define("date-time", c.dateRule()+` "T" `+c.timeRule()), true
	case "uuid":
		h := c.define("hex", `[0-9a-fA-F]`)
		return c.define("uuid", h+`{8} "-" `+h+`{4} "-" `+h+`{4} "-" `+h+`{4} "-" `+h+`{12}`), true
	case "email":
		atom := `[A-Za-z0-9!#$%&'*+/=?^_{|}~\u0060\u002D]{1,64}`
		label := `[A-Za-z0-9] ([A-Za-z0-9\u002D]{0,61} [A-Za-z0-9])?`
		// local part at most 64 chars is enforced per atom only; keep the
		// whole address short enough for every validator we know of.
		return c.define("email", atom+` ("." `+atom+`){0,3} "@" `+label+` ("." `+label+`){1,4}`), true
	case "hostname":
		label := `[A-Za-z0-9] ([A-Za-z0-9\u002D]{0,61} [A-Za-z0-9])?`
		return c.define("hostname", label+` ("." `+label+`){0,3}`), true
	case "ipv4":
		oct := c.define("ipv4-octet", `("25" [0-5] | "2" [0-4] `+d+` | "1" `+d+` `+d+` | [1-9] `+d+` | `+d+`)`)
		return c.define("ipv4", oct+` "." `+oct+` "." `+oct+` "." `+oct), true
	case "json-pointer":
		return c.jsonPointerRule(), true
	case "relative-json-pointer":
		return c.define("relative-json-pointer", `("0" | [1-9] [0-9]*) ("#" | `+c.jsonPointerRule()+`)`), true
	case "uri":
		h := c.define("hex", `[0-9a-fA-F]`)
		uc := c.define("uri-char", `([A-Za-z0-9._~:/?#@!$&'()*+,;=\u005B\u005D-] | "%" `+h+` `+h+`)`)
		return c.define("uri", `[A-Za-z] [A-Za-z0-9+.\u002D]* ":" `+uc+`+`), true
	}
	return "", false
}

// jsonPointerRule is RFC 6901's JSON pointer: "/"-prefixed reference tokens
// where "~" only starts "~0" or "~1". Characters are in their json.dumps
// (ensure_ascii=False) form.
func (c *converter) jsonPointerRule() string {
	ch := c.define("json-pointer-char", `[^"\\\u0000-\u001F/~] | "~" [01] | "\\\\" | "\\\""`)
	return c.define("json-pointer", `("/" `+ch+`*)*`)
}

// standardFormats are the formats of JSON Schema's format vocabulary (draft
// 2020-12 and earlier), which validators check; formatRule implements some.
// Another of these is a compile error (an instance could violate it);
// formats outside the list are annotations and ignored.
var standardFormats = map[string]bool{
	"date-time": true, "date": true, "time": true, "duration": true, "email": true,
	"idn-email": true, "hostname": true, "idn-hostname": true, "ipv4": true, "ipv6": true,
	"uri": true, "uri-reference": true, "iri": true, "iri-reference": true, "uuid": true,
	"uri-template": true, "json-pointer": true, "relative-json-pointer": true, "regex": true,
}

func (c *converter) dateRule() string {
	d := "[0-9]"
	year := d + `{4}`
	leap := `(` + d + d + ` ("0" [48] | [2468] [048] | [13579] [26]) | ("0" [48] | [2468] [048] | [13579] [26]) "00")`
	body := `(` + year + ` "-" (("0" [13578] | "1" [02]) "-" ("0" [1-9] | [12] ` + d + ` | "3" [01]) | ("0" [469] | "11") "-" ("0" [1-9] | [12] ` + d + ` | "30") | "02-" ("0" [1-9] | "1" ` + d + ` | "2" [0-8])) | ` + leap + ` "-02-29")`
	return c.define("date", body)
}

func (c *converter) timeRule() string {
	d := "[0-9]"
	hh := `([01] ` + d + ` | "2" [0-3])`
	mm := `[0-5] ` + d
	return c.define("time", hh+` ":" `+mm+` ":" `+mm+` ("." `+d+`+)? ("Z" | [+\u002D] `+hh+` ":" `+mm+`)`)
}
