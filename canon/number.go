package canon

import (
	"math"
	"strconv"
)

// appendNumber appends f as ECMAScript's Number.prototype.toString writes it
// (ECMA-262 Number::toString, which RFC 8785 section 3.2.2.3 adopts): the
// shortest digits that round-trip, in fixed notation for magnitudes in
// [1e-6, 1e21) and in exponent notation ("1e+21", "1.5e-7") otherwise, with
// -0 written as 0. f must be finite.
//
// strconv's shortest formatting (precision -1) yields the same digits as
// ECMAScript; only the layout differs, and only in the exponent, which Go
// pads to two digits ("e-07") where ECMAScript does not ("e-7").
func appendNumber(dst []byte, f float64) []byte {
	if f == 0 { // both 0 and -0
		return append(dst, '0')
	}
	if a := math.Abs(f); a >= 1e-6 && a < 1e21 {
		return strconv.AppendFloat(dst, f, 'f', -1, 64)
	}
	start := len(dst)
	dst = strconv.AppendFloat(dst, f, 'e', -1, 64)
	// The exponent is "e+DD", "e-DD" or "e±DDD"; drop a leading zero of a
	// two-digit exponent.
	for i := len(dst) - 1; i > start; i-- {
		if dst[i] == 'e' {
			if len(dst)-i == 4 && dst[i+2] == '0' {
				dst[i+2] = dst[i+3]
				dst = dst[:len(dst)-1]
			}
			break
		}
	}
	return dst
}
