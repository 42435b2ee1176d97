package jsonschema

import (
	"encoding/json"
	"math/big"
	"strconv"
	"strings"
)

func ratOf(n json.Number) (*big.Rat, bool) {
	r, ok := new(big.Rat).SetString(string(n))
	return r, ok
}

// stringChar is one JSON string character in any valid encoding.
func (c *converter) stringChar() string {
	hex := c.define("hex", `[0-9a-fA-F]`)
	esc := c.define("esc", `"\\" (["\\/bfnrt] | "u" ([0-9a-cA-CeEfF] `+hex+` `+hex+` `+hex+
		` | [dD] [0-7] `+hex+` `+hex+`) | "u" [dD] [89abAB] `+hex+` `+hex+` "\\u" [dD] [c-fC-F] `+hex+` `+hex+`)`)
	return c.define("char", `[^"\\\u0000-\u001F] | `+esc)
}

func (c *converter) stringRule() string {
	return c.define("string", `"\"" `+c.stringChar()+`* "\""`)
}

func (c *converter) numberRule() string {
	return c.define("number", `"-"? ("0" | [1-9] [0-9]*) ("." [0-9]+)? ([eE] [-+]? [0-9]+)?`)
}

// anyValue is any JSON value.
func (c *converter) anyValue() string {
	if n, ok := c.refs["<any>"]; ok {
		return n
	}
	value := c.reserve("value")
	c.refs["<any>"] = value
	str := c.stringRule()
	obj := c.define("object", seq(`"{"`, c.ws, "("+seq(str, c.colon, value, "("+seq(c.comma, str, c.colon, value)+")*")+")?", c.ws, `"}"`))
	arr := c.define("array", seq(`"["`, c.ws, "("+seq(value, "("+seq(c.comma, value)+")*")+")?", c.ws, `"]"`))
	c.setRule(value, strings.Join([]string{obj, arr, str, c.numberRule(), `"true"`, `"false"`, `"null"`}, " | "))
	return value
}

func intKW(o *object, k, path string) (int, bool, error) {
	v, ok := o.get(k)
	if !ok {
		return 0, false, nil
	}
	n, isNum := v.(json.Number)
	if !isNum {
		return 0, false, errorf(k, path, "must be a number")
	}
	r, ok := ratOf(n)
	if !ok || !r.IsInt() || r.Sign() < 0 || !r.Num().IsInt64() || r.Num().Int64() > 1<<20 {
		return 0, false, errorf(k, path, "must be a small non-negative integer")
	}
	return int(r.Num().Int64()), true, nil
}

func (c *converter) genString(o *object, path string) (string, error) {
	minL, hasMin, err := intKW(o, "minLength", path)
	if err != nil {
		return "", err
	}
	maxL, hasMax, err := intKW(o, "maxLength", path)
	if err != nil {
		return "", err
	}
	if hasMax && maxL < minL {
		return "", &Error{Keyword: "maxLength", Path: path, Msg: "schema accepts no value"}
	}
	lengthKW := ""
	if hasMin && minL > 0 {
		lengthKW = "minLength"
	}
	if hasMax {
		lengthKW = "maxLength"
	}
	if pv, ok := o.get("pattern"); ok {
		p, ok := pv.(string)
		if !ok {
			return "", errorf("pattern", path, "must be a string")
		}
		if lengthKW != "" {
			return "", errorf(lengthKW, path, "cannot be combined with pattern")
		}
		body, err := c.regexToGBNF(p, child(path, "pattern"))
		if err != nil {
			return "", err
		}
		return c.define("pattern", `"\"" `+body+` "\""`), nil
	}
	if fv, ok := o.get("format"); ok {
		f, _ := fv.(string)
		if body, ok := c.formatRule(f); ok {
			if lengthKW != "" {
				return "", errorf(lengthKW, path, "cannot be combined with format %q", f)
			}
			return c.define(sanitize(f), `"\"" `+body+` "\""`), nil
		}
		if standardFormats[f] {
			return "", errorf("format", path, "format %q is not enforced", f)
		}
	}
	if lengthKW == "" {
		return c.stringRule(), nil
	}
	mx := -1
	if hasMax {
		mx = maxL
	}
	return c.define("string", seq(`"\""`, rep(c.stringChar(), minL, mx), `"\""`)), nil
}

// numeric bounds ---------------------------------------------------------

type bound struct {
	set  bool
	v    *big.Rat
	excl bool
}

func numBounds(o *object, path string) (lo, hi bound, err error) {
	get := func(k string) (*big.Rat, bool, error) {
		v, ok := o.get(k)
		if !ok {
			return nil, false, nil
		}
		n, ok := v.(json.Number)
		if !ok {
			return nil, false, nil
		}
		r, ok := ratOf(n)
		if !ok {
			return nil, false, errorf(k, path, "bad number")
		}
		return r, true, nil
	}
	tighter := func(b *bound, r *big.Rat, excl bool, lower bool) {
		if !b.set {
			*b = bound{true, r, excl}
			return
		}
		cmp := r.Cmp(b.v)
		if !lower {
			cmp = -cmp
		}
		if cmp > 0 || (cmp == 0 && excl) {
			*b = bound{true, r, excl}
		}
	}
	boolExcl := func(k string) bool {
		v, _ := o.get(k)
		t, _ := v.(bool)
		return t
	}
	if r, ok, e := get("minimum"); e != nil {
		return lo, hi, e
	} else if ok {
		tighter(&lo, r, boolExcl("exclusiveMinimum"), true)
	}
	if r, ok, e := get("maximum"); e != nil {
		return lo, hi, e
	} else if ok {
		tighter(&hi, r, boolExcl("exclusiveMaximum"), false)
	}
	if r, ok, e := get("exclusiveMinimum"); e != nil {
		return lo, hi, e
	} else if ok {
		tighter(&lo, r, true, true)
	}
	if r, ok, e := get("exclusiveMaximum"); e != nil {
		return lo, hi, e
	} else if ok {
		tighter(&hi, r, true, false)
	}
	return lo, hi, nil
}

func boundKW(b bound, lower bool) string {
	if lower {
		if b.excl {
			return "exclusiveMinimum"
		}
		return "minimum"
	}
	if b.excl {
		return "exclusiveMaximum"
	}
	return "maximum"
}

func (c *converter) checkMultipleOf(o *object, path string, integer bool) error {
	mv, ok := o.get("multipleOf")
	if !ok {
		return nil
	}
	n, ok := mv.(json.Number)
	if !ok {
		return errorf("multipleOf", path, "must be a number")
	}
	r, ok := ratOf(n)
	if !ok || r.Sign() <= 0 {
		return errorf("multipleOf", path, "must be positive")
	}
	if isOne(mv) {
		return nil
	}
	// For integers, 1/k (k integer) is implied.
	if integer && r.Num().IsInt64() && r.Num().Int64() == 1 {
		return nil
	}
	return unsupported("multipleOf", path)
}

func (c *converter) genInteger(o *object, path string) (string, error) {
	if err := c.checkMultipleOf(o, path, true); err != nil {
		return "", err
	}
	lo, hi, err := numBounds(o, path)
	if err != nil {
		return "", err
	}
	if !lo.set && !hi.set {
		return c.define("integer", `"-"? ("0" | [1-9] [0-9]*)`), nil
	}
	var l, h *big.Int
	if lo.set {
		l = ceilInt(lo.v)
		if lo.excl && lo.v.IsInt() {
			l.Add(l, big.NewInt(1))
		}
	}
	if hi.set {
		h = floorInt(hi.v)
		if hi.excl && hi.v.IsInt() {
			h.Sub(h, big.NewInt(1))
		}
	}
	if l != nil && h != nil && l.Cmp(h) > 0 {
		return "", &Error{Keyword: "maximum", Path: path, Msg: "schema accepts no value"}
	}
	var alts []string
	zero := big.NewInt(0)
	// non-negative part
	if h == nil || h.Sign() >= 0 {
		a := zero
		if l != nil && l.Sign() > 0 {
			a = l
		}
		alts = append(alts, uintRange(a, h))
	}
	// negative part: "-" magnitude in [max(-h,1), -l]
	if l == nil || l.Sign() < 0 {
		a := big.NewInt(1)
		if h != nil && h.Sign() < 0 {
			a = new(big.Int).Neg(h)
		}
		var b *big.Int
		if l != nil {
			b = new(big.Int).Neg(l)
		}
		alts = append(alts, `"-" `+group(uintRange(a, b)))
	}
	return c.define("integer", alt(alts...)), nil
}

func group(e string) string {
	if isAtom(e) {
		return e
	}
	return "(" + e + ")"
}

func ceilInt(r *big.Rat) *big.Int {
	q, m := new(big.Int).DivMod(r.Num(), r.Denom(), new(big.Int))
	if m.Sign() != 0 {
		q.Add(q, big.NewInt(1))
	}
	return q
}

func floorInt(r *big.Rat) *big.Int {
	q, _ := new(big.Int).DivMod(r.Num(), r.Denom(), new(big.Int)) // Euclidean: floor for positive denominators
	return q
}

// uintRange matches decimal naturals (no leading zeros) in [a, b]; b nil is
// unbounded.
func uintRange(a, b *big.Int) string {
	as := a.String()
	if b == nil {
		if a.Sign() == 0 {
			return `("0" | [1-9] [0-9]*)`
		}
		return alt(sameLen(as, strings.Repeat("9", len(as))), `[1-9] [0-9]{`+strconv.Itoa(len(as))+`,}`)
	}
	bs := b.String()
	var alts []string
	for L := len(as); L <= len(bs); L++ {
		lo := as
		if L > len(as) {
			lo = "1" + strings.Repeat("0", L-1)
		}
		hi := bs
		if L < len(bs) {
			hi = strings.Repeat("9", L)
		}
		alts = append(alts, sameLen(lo, hi))
	}
	return alt(alts...)
}

func digitClass(lo, hi byte) string {
	if lo == hi {
		return `"` + string(lo) + `"`
	}
	return "[" + string(lo) + "-" + string(hi) + "]"
}

// sameLen matches digit strings of len(lo) between lo and hi inclusive.
func sameLen(lo, hi string) string {
	n := len(lo)
	if n == 0 {
		return ""
	}
	if lo == hi {
		return `"` + lo + `"`
	}
	if strings.Trim(lo[1:], "0") == "" && strings.Trim(hi[1:], "9") == "" {
		return seq(digitClass(lo[0], hi[0]), rep("[0-9]", n-1, n-1))
	}
	if lo[0] == hi[0] {
		return seq(`"`+lo[:1]+`"`, group(sameLen(lo[1:], hi[1:])))
	}
	var alts []string
	alts = append(alts, seq(`"`+lo[:1]+`"`, group(sameLen(lo[1:], strings.Repeat("9", n-1)))))
	if lo[0]+1 <= hi[0]-1 {
		alts = append(alts, seq(digitClass(lo[0]+1, hi[0]-1), rep("[0-9]", n-1, n-1)))
	}
	alts = append(alts, seq(`"`+hi[:1]+`"`, group(sameLen(strings.Repeat("0", n-1), hi[1:]))))
	return alt(alts...)
}

const (
	anyFrac     = `("." [0-9]+)?`
	zeroFrac    = `("." "0"+)?`
	nonzeroFrac = `"." [0-9]* [1-9] [0-9]*`
)

// magRange matches plain decimals (no sign, no exponent) with value in the
// interval between integers k and m (m nil: unbounded) with the given
// exclusivity.
func magRange(k *big.Int, kExcl bool, m *big.Int, mExcl bool) string {
	one := big.NewInt(1)
	if m != nil && k.Cmp(m) == 0 {
		if kExcl || mExcl {
			return ""
		}
		return seq(`"`+k.String()+`"`, zeroFrac)
	}
	var alts []string
	if kExcl {
		alts = append(alts, seq(`"`+k.String()+`"`, nonzeroFrac))
	} else {
		alts = append(alts, seq(`"`+k.String()+`"`, anyFrac))
	}
	k1 := new(big.Int).Add(k, one)
	if m == nil {
		alts = append(alts, seq(group(uintRange(k1, nil)), anyFrac))
	} else {
		m1 := new(big.Int).Sub(m, one)
		if k1.Cmp(m1) <= 0 {
			alts = append(alts, seq(group(uintRange(k1, m1)), anyFrac))
		}
		if !mExcl {
			alts = append(alts, seq(`"`+m.String()+`"`, zeroFrac))
		}
	}
	return alt(alts...)
}

func (c *converter) genNumber(o *object, path string) (string, error) {
	if err := c.checkMultipleOf(o, path, false); err != nil {
		return "", err
	}
	lo, hi, err := numBounds(o, path)
	if err != nil {
		return "", err
	}
	if !lo.set && !hi.set {
		return c.numberRule(), nil
	}
	if lo.set && !hi.set && lo.v.Sign() == 0 {
		if lo.excl {
			return c.define("positive", `([1-9] [0-9]* ("." [0-9]+)? | "0." [0-9]* [1-9] [0-9]*) ([eE] [-+]? [0-9]+)?`), nil
		}
		return c.define("nonnegative", `("0" | [1-9] [0-9]*) ("." [0-9]+)? ([eE] [-+]? [0-9]+)?`), nil
	}
	if lo.set && !lo.v.IsInt() {
		return "", errorf(boundKW(lo, true), path, "non-integer bounds on numbers are not supported")
	}
	if hi.set && !hi.v.IsInt() {
		return "", errorf(boundKW(hi, false), path, "non-integer bounds on numbers are not supported")
	}
	if lo.set && hi.set {
		cmp := lo.v.Cmp(hi.v)
		if cmp > 0 || (cmp == 0 && (lo.excl || hi.excl)) {
			return "", &Error{Keyword: "maximum", Path: path, Msg: "schema accepts no value"}
		}
	}
	var l, h *big.Int
	if lo.set {
		l = lo.v.Num()
	}
	if hi.set {
		h = hi.v.Num()
	}
	var alts []string
	zero := big.NewInt(0)
	if h == nil || h.Sign() > 0 || (h.Sign() == 0 && !hi.excl) {
		k, kExcl := zero, false
		if l != nil && l.Sign() >= 0 {
			k, kExcl = l, lo.excl
		}
		if e := magRange(k, kExcl, h, hi.excl); e != "" {
			alts = append(alts, e)
		}
	}
	if l == nil || l.Sign() < 0 {
		k, kExcl := zero, false
		if h != nil && (h.Sign() < 0 || (h.Sign() == 0 && hi.excl)) {
			k, kExcl = new(big.Int).Neg(h), hi.excl
		}
		var m *big.Int
		if l != nil {
			m = new(big.Int).Neg(l)
		}
		if e := magRange(k, kExcl, m, lo.excl); e != "" {
			alts = append(alts, `"-" `+group(e))
		}
	}
	if len(alts) == 0 {
		return "", &Error{Keyword: "maximum", Path: path, Msg: "schema accepts no value"}
	}
	return c.define("number", alt(alts...)), nil
}
