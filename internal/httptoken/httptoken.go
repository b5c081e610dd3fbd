// Package httptoken checks the RFC 9110 token syntax (field names and
// methods), for the packages that validate header names and methods.
package httptoken

import "strings"

// Valid reports whether s is an RFC 9110 token.
func Valid(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9':
		case strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0:
		default:
			return false
		}
	}
	return true
}
