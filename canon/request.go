package canon

import (
	"bytes"
	"cmp"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"net/url"
	"slices"
	"strings"

	"github.com/oncekey/oncekey/internal/httptoken"
)

// defaultMaxBody is the body limit when Options.MaxBody is zero: 1 MiB.
const defaultMaxBody int64 = 1 << 20

// Options says what [Request] puts into a fingerprint beyond the fixed
// parts (method, path, query, body). The zero value is usable: no
// operation name, no headers, no exclusions, a 1 MiB body limit and the
// precision rule on.
type Options struct {
	// Operation names the logical operation, for example "orders.create".
	// It is part of the fingerprint, as given. Defaults to "".
	Operation string

	// Headers lists the semantic request headers to include, such as
	// "Content-Language" or "Prefer", case-insensitively and in any order
	// (the package documentation says how they enter). A listed header
	// that is absent differs from one present with an empty value.
	// Defaults to none: transport headers never enter unless listed here.
	Headers []string

	// Exclude lists RFC 6901 JSON Pointers to object members of a JSON body
	// to leave out, such as "/client_timestamp" or "/meta/trace_id"; array
	// elements on the way are addressed by index ("/items/0/note"). A
	// pointer that matches nothing excludes nothing. Defaults to none.
	Exclude []string

	// MaxBody is the largest body, in bytes, that is read; a longer one
	// fails with [ErrTooLarge] without the rest being read. Defaults to
	// 1 MiB.
	MaxBody int64

	// AllowImpreciseNumbers turns off the precision rule (see [JSONStrict]):
	// integer literals beyond a double's precision are then rounded as
	// RFC 8785 says, so 9007199254740993 and 9007199254740992 share a
	// fingerprint. Defaults to false.
	AllowImpreciseNumbers bool
}

// Request returns the fingerprint of r's intent: what enters it, and how
// each kind of body does, is listed in the package documentation.
//
// Request reads the body and replaces r.Body with one that yields the same
// bytes (closing it closes the original), so the handler reads the body as
// sent; on a too-large or read error it yields what was read followed by the
// unread rest. It changes nothing else in r.
//
// Errors match [ErrConfig] (a programming error), [ErrTooLarge]
// (also for an http.MaxBytesReader that trips) or [ErrInvalid]; an error
// reading the body matches none of them.
func Request(r *http.Request, opts Options) (Fingerprint, error) {
	maxBody := opts.MaxBody
	switch {
	case maxBody < 0:
		return "", fmt.Errorf("%w: MaxBody must not be negative", ErrConfig)
	case maxBody == 0:
		maxBody = defaultMaxBody
	}
	headers, err := headerNames(opts.Headers)
	if err != nil {
		return "", err
	}
	var exclude []pointer
	for _, s := range opts.Exclude {
		ptr, err := parsePointer(s)
		if err != nil {
			return "", err
		}
		exclude = append(exclude, ptr)
	}

	b := make([]byte, 0, 256)
	b = append(b, tagRequest...)

	method := r.Method
	if method == "" {
		method = http.MethodGet // as net/http reads it
	}
	b = appendField(b, method)
	b = appendField(b, opts.Operation)
	var path, rawQuery string
	if r.URL != nil {
		path, rawQuery = normalizePath(r.URL.EscapedPath()), r.URL.RawQuery
	}
	b = appendField(b, path)
	query, err := url.ParseQuery(rawQuery)
	if err != nil {
		return "", errQuery
	}
	b = appendValues(b, query)

	b = binary.AppendUvarint(b, uint64(len(headers)))
	for _, name := range headers {
		var vals []string
		if name == "host" {
			if r.Host != "" {
				vals = []string{r.Host}
			}
		} else {
			vals = r.Header.Values(name)
		}
		b = appendField(b, name)
		b = binary.AppendUvarint(b, uint64(len(vals)))
		for _, v := range vals {
			b = appendField(b, strings.Trim(v, " \t"))
		}
	}

	body, err := readBody(r, maxBody)
	if err != nil {
		return "", err
	}
	// The body comes last and is not length-prefixed: everything before it
	// is, so the encoding stays unambiguous.
	if len(body) == 0 {
		b = appendField(b, "none")
	} else {
		kind, mediaType := bodyKind(r.Header.Get("Content-Type"))
		// Canonical JSON is rarely much longer than its input.
		b = slices.Grow(b, len(body)+len(body)/8+len(mediaType)+16)
		b = appendField(b, kind)
		b = appendField(b, mediaType)
		switch kind {
		case "json":
			b, err = canonicalJSON(b, body, !opts.AllowImpreciseNumbers, exclude)
			if err != nil {
				return "", err
			}
		case "form":
			form, err := url.ParseQuery(string(body))
			if err != nil {
				return "", errForm
			}
			b = appendValues(b, form)
		default:
			b = append(b, body...)
		}
	}
	return encode(sha256Sum(b)), nil
}

func sha256Sum(b []byte) []byte {
	sum := sha256.Sum256(b)
	return sum[:]
}

func appendField(b []byte, s string) []byte {
	b = binary.AppendUvarint(b, uint64(len(s)))
	return append(b, s...)
}

// appendValues appends query or form parameters sorted by name, then value.
func appendValues(b []byte, vs url.Values) []byte {
	type pair struct{ k, v string }
	pairs := make([]pair, 0, len(vs))
	for k, list := range vs {
		for _, v := range list {
			pairs = append(pairs, pair{k, v})
		}
	}
	slices.SortFunc(pairs, func(a, b pair) int {
		return cmp.Or(strings.Compare(a.k, b.k), strings.Compare(a.v, b.v))
	})
	b = binary.AppendUvarint(b, uint64(len(pairs)))
	for _, p := range pairs {
		b = appendField(b, p.k)
		b = appendField(b, p.v)
	}
	return b
}

// headerNames lowercases, validates, sorts and deduplicates names.
func headerNames(names []string) ([]string, error) {
	out := make([]string, 0, len(names))
	for _, name := range names {
		n := strings.ToLower(strings.TrimSpace(name))
		if !httptoken.Valid(n) {
			return nil, fmt.Errorf("%w: header name %q", ErrConfig, name)
		}
		out = append(out, n)
	}
	slices.Sort(out)
	return slices.Compact(out), nil
}

// normalizePath applies RFC 3986 section 6.2.2 normalization to an escaped
// path: percent escapes of unreserved characters are decoded and the hex of
// the others is uppercased. So "/%7euser" and "/~user" agree, while "/a%2Fb"
// and "/a/b", which a router may treat differently, do not.
func normalizePath(p string) string {
	if strings.IndexByte(p, '%') < 0 {
		return p
	}
	var sb strings.Builder
	sb.Grow(len(p))
	for i := 0; i < len(p); i++ {
		c := p[i]
		if c != '%' || i+2 >= len(p) || !isHex(p[i+1]) || !isHex(p[i+2]) {
			sb.WriteByte(c)
			continue
		}
		d := unhex(p[i+1])<<4 | unhex(p[i+2])
		if isUnreserved(d) {
			sb.WriteByte(d)
		} else {
			const upper = "0123456789ABCDEF"
			sb.WriteByte('%')
			sb.WriteByte(upper[d>>4])
			sb.WriteByte(upper[d&0xF])
		}
		i += 2
	}
	return sb.String()
}

func isHex(c byte) bool {
	return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F')
}

func unhex(c byte) byte {
	switch {
	case c >= 'a':
		return c - 'a' + 10
	case c >= 'A':
		return c - 'A' + 10
	default:
		return c - '0'
	}
}

func isUnreserved(c byte) bool {
	return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
		c == '-' || c == '.' || c == '_' || c == '~'
}

// bodyKind classifies a Content-Type value, returning the kind and the media
// type text that enters the fingerprint.
func bodyKind(contentType string) (kind, mediaType string) {
	mt, params, err := mime.ParseMediaType(contentType)
	if mt == "" {
		// Missing or unparseable: raw bytes, under the header as sent.
		return "raw", strings.ToLower(strings.TrimSpace(contentType))
	}
	switch {
	case mt == "application/json" || (strings.HasSuffix(mt, "+json") && strings.Contains(mt, "/")):
		return "json", mt
	case mt == "application/x-www-form-urlencoded":
		return "form", mt
	}
	if err == nil {
		// FormatMediaType sorts the parameters: one spelling per meaning.
		if s := mime.FormatMediaType(mt, params); s != "" {
			return "raw", s
		}
	}
	return "raw", strings.ToLower(strings.TrimSpace(contentType))
}

// readBody reads at most limit bytes of r.Body and replaces r.Body so the
// handler can read them again.
func readBody(r *http.Request, limit int64) ([]byte, error) {
	if r.Body == nil || r.Body == http.NoBody {
		return nil, nil
	}
	if r.ContentLength > limit {
		return nil, &tooLargeError{limit: limit} // nothing read, r.Body untouched
	}
	orig := r.Body
	var buf bytes.Buffer
	if r.ContentLength > 0 {
		buf.Grow(int(r.ContentLength) + bytes.MinRead) // room to see EOF
	}
	_, err := buf.ReadFrom(io.LimitReader(orig, limit+1))
	data := buf.Bytes()
	if err != nil || int64(len(data)) > limit {
		r.Body = &replayBody{Reader: io.MultiReader(bytes.NewReader(data), orig), orig: orig}
		var mbe *http.MaxBytesError
		switch {
		case err == nil:
			return nil, &tooLargeError{limit: limit}
		case errors.As(err, &mbe):
			return nil, &tooLargeError{limit: min(limit, mbe.Limit)}
		default:
			return nil, fmt.Errorf("%w: %w", errReadBody, err)
		}
	}
	r.Body = &replayBody{Reader: bytes.NewReader(data), orig: orig}
	return data, nil
}

// replayBody serves bytes already read from orig (and, after an error, the
// rest of orig); Close closes orig.
type replayBody struct {
	io.Reader
	orig io.ReadCloser
}

func (b *replayBody) Close() error { return b.orig.Close() }
