package canon_test

import (
	"bytes"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"

	"github.com/oncekey/oncekey/canon"
)

type reqSpec struct {
	method, target, contentType, body string
	header                            http.Header
}

func newReq(s reqSpec) *http.Request {
	if s.method == "" {
		s.method = http.MethodPost
	}
	if s.target == "" {
		s.target = "/v1/orders"
	}
	var body io.Reader
	if s.body != "" {
		body = strings.NewReader(s.body)
	}
	r := httptest.NewRequest(s.method, s.target, body)
	if s.contentType != "" {
		r.Header.Set("Content-Type", s.contentType)
	}
	for k, vs := range s.header {
		for _, v := range vs {
			r.Header.Add(k, v)
		}
	}
	return r
}

func fingerprint(t *testing.T, s reqSpec, opts canon.Options) canon.Fingerprint {
	t.Helper()
	fp, err := canon.Request(newReq(s), opts)
	if err != nil {
		t.Fatalf("Request(%+v): %v", s, err)
	}
	return fp
}

const orderBody = `{"amount":{"value":1250,"currency":"EUR"},"customer":"cus_42","items":[{"sku":"A-1","qty":2},{"sku":"B-7","qty":1}],"client_ts":"2026-03-14T15:09:26Z","meta":{"trace_id":"abc","source":"web"}}`

var orderOpts = canon.Options{
	Operation: "orders.create",
	Headers:   []string{"Content-Language", "X-Tenant-Region"},
	Exclude:   []string{"/client_ts", "/meta/trace_id"},
}

func TestRequest_SameIntentSameFingerprint(t *testing.T) {
	t.Parallel()
	base := reqSpec{
		target: "/v1/orders?b=2&a=1&a=0", contentType: "application/json", body: orderBody,
		header: http.Header{"Content-Language": {"de"}, "Traceparent": {"00-aaaa-01"}, "User-Agent": {"curl/8"}},
	}
	want := fingerprint(t, base, orderOpts)
	same := []reqSpec{
		{ // members reordered, whitespace, escapes, number spellings; other trace headers
			target: "/v1/orders?a=0&b=2&a=1", contentType: "application/json; charset=utf-8",
			body: "{\n  \"meta\": {\"source\": \"w\\u0065b\", \"trace_id\": \"zzz\"},\n  \"items\": [{\"qty\": 2.0, \"sku\": \"A-1\"}, {\"sku\": \"B-7\", \"qty\": 1e0}],\n  \"customer\": \"cus_42\",\n  \"amount\": {\"currency\": \"EUR\", \"value\": 1.25e3},\n  \"client_ts\": \"2026-12-31T00:00:00Z\"\n}",
			header: http.Header{
				"Content-Language": {"  de\t"}, "Traceparent": {"00-bbbb-01"}, "Tracestate": {"x=y"},
				"User-Agent": {"Go-http-client/1.1"}, "Accept-Encoding": {"gzip"}, "Content-Length": {"999"},
				"Idempotency-Key": {"other"}, "Cookie": {"session=1"},
			},
		},
		{ // the same without the excluded members at all, and Content-Type in capitals
			target: "/v1/orders?a=1&a=0&b=2", contentType: "APPLICATION/JSON",
			body:   `{"amount":{"value":1250,"currency":"EUR"},"customer":"cus_42","items":[{"sku":"A-1","qty":2},{"sku":"B-7","qty":1}],"meta":{"source":"web"}}`,
			header: http.Header{"Content-Language": {"de"}},
		},
	}
	for i, s := range same {
		if got := fingerprint(t, s, orderOpts); got != want {
			t.Errorf("variant %d: fingerprint %s, want %s", i, got, want)
		}
	}
	// The order and case of Options.Headers do not matter either.
	opts := orderOpts
	opts.Headers = []string{"x-tenant-region", "content-language", "CONTENT-LANGUAGE"}
	if got := fingerprint(t, base, opts); got != want {
		t.Errorf("reordered Options.Headers: %s, want %s", got, want)
	}
}

func TestRequest_DifferentIntentDifferentFingerprint(t *testing.T) {
	t.Parallel()
	base := reqSpec{
		target: "/v1/orders?a=1", contentType: "application/json", body: orderBody,
		header: http.Header{"Content-Language": {"de"}},
	}
	changes := map[string]func(*reqSpec, *canon.Options){
		"Amount":           func(s *reqSpec, _ *canon.Options) { s.body = strings.Replace(s.body, "1250", "1251", 1) },
		"Currency":         func(s *reqSpec, _ *canon.Options) { s.body = strings.Replace(s.body, "EUR", "USD", 1) },
		"ArrayOrder":       func(s *reqSpec, _ *canon.Options) { s.body = strings.Replace(s.body, `"A-1"`, `"B-7x"`, 1) },
		"NumberAsString":   func(s *reqSpec, _ *canon.Options) { s.body = strings.Replace(s.body, "1250", `"1250"`, 1) },
		"NonExcluded":      func(s *reqSpec, _ *canon.Options) { s.body = strings.Replace(s.body, `"web"`, `"app"`, 1) },
		"Path":             func(s *reqSpec, _ *canon.Options) { s.target = "/v1/refunds?a=1" },
		"PathEscapedSlash": func(s *reqSpec, _ *canon.Options) { s.target = "/v1%2Forders?a=1" },
		"QueryValue":       func(s *reqSpec, _ *canon.Options) { s.target = "/v1/orders?a=2" },
		"QueryName":        func(s *reqSpec, _ *canon.Options) { s.target = "/v1/orders?b=1" },
		"QueryRepeated":    func(s *reqSpec, _ *canon.Options) { s.target = "/v1/orders?a=1&a=1" },
		"QueryAdded":       func(s *reqSpec, _ *canon.Options) { s.target = "/v1/orders?a=1&c=" },
		"Method":           func(s *reqSpec, _ *canon.Options) { s.method = http.MethodPut },
		"Operation":        func(_ *reqSpec, o *canon.Options) { o.Operation = "orders.replace" },
		"IncludedHeader":   func(s *reqSpec, _ *canon.Options) { s.header = http.Header{"Content-Language": {"fr"}} },
		"HeaderAbsent":     func(s *reqSpec, _ *canon.Options) { s.header = nil },
		"HeaderEmpty":      func(s *reqSpec, _ *canon.Options) { s.header = http.Header{"Content-Language": {""}} },
		"HeaderTwice":      func(s *reqSpec, _ *canon.Options) { s.header = http.Header{"Content-Language": {"de", "de"}} },
		"OtherIncluded":    func(s *reqSpec, _ *canon.Options) { s.header.Set("X-Tenant-Region", "eu") },
		"MergePatchType":   func(s *reqSpec, _ *canon.Options) { s.contentType = "application/merge-patch+json" },
		"RawType":          func(s *reqSpec, _ *canon.Options) { s.contentType = "text/plain" },
		"NoBody":           func(s *reqSpec, _ *canon.Options) { s.body = "" },
		"ExcludeNothing":   func(_ *reqSpec, o *canon.Options) { o.Exclude = nil },
		"Precision":        func(_ *reqSpec, o *canon.Options) { o.AllowImpreciseNumbers = true; o.Operation = "x" },
	}
	seen := map[canon.Fingerprint]string{}
	opts := orderOpts
	opts.Exclude = append([]string(nil), orderOpts.Exclude...)
	seen[fingerprint(t, base, opts)] = "base"
	for name, change := range changes {
		s := base
		s.header = base.header.Clone()
		o := orderOpts
		o.Exclude = append([]string(nil), orderOpts.Exclude...)
		change(&s, &o)
		fp := fingerprint(t, s, o)
		if other, dup := seen[fp]; dup {
			t.Errorf("%s: same fingerprint as %s", name, other)
		}
		seen[fp] = name
	}
}

func TestRequest_Exclude(t *testing.T) {
	t.Parallel()
	opts := canon.Options{Exclude: []string{"/client_ts", "/a~1b", "/m~0n", "/items/1/note", "/missing/deeper", "/items/x", "/items/01/note", "/s/t"}}
	fp := func(body string) canon.Fingerprint {
		return fingerprint(t, reqSpec{contentType: "application/json", body: body}, opts)
	}
	base := fp(`{"client_ts":1,"a/b":1,"m~n":1,"items":[{"note":"keep"},{"note":"drop","q":1}],"s":"str"}`)
	same := []string{
		`{"client_ts":2,"a/b":2,"m~n":2,"items":[{"note":"keep"},{"note":"other","q":1}],"s":"str"}`,
		`{"items":[{"note":"keep"},{"q":1}],"s":"str"}`,
		// An excluded member's content is not checked for precision.
		`{"client_ts":9007199254740993,"items":[{"note":"keep"},{"q":1}],"s":"str"}`,
	}
	for _, b := range same {
		if got := fp(b); got != base {
			t.Errorf("body %s: fingerprint differs although only excluded members changed", b)
		}
	}
	different := []string{
		`{"client_ts":1,"a/b":1,"m~n":1,"items":[{"note":"changed"},{"note":"drop","q":1}],"s":"str"}`, // index 0 is not excluded
		`{"client_ts":1,"a/b":1,"m~n":1,"items":[{"note":"keep"},{"note":"drop","q":2}],"s":"str"}`,
		`{"client_ts":1,"a/b":1,"m~n":1,"items":[{"note":"keep"},{"note":"drop","q":1}],"s":"str","a~1b":1}`,
	}
	for _, b := range different {
		if got := fp(b); got == base {
			t.Errorf("body %s: same fingerprint although a kept member changed", b)
		}
	}
	// A pointer whose last step is an array index excludes nothing.
	o := canon.Options{Exclude: []string{"/items/0"}}
	a := fingerprint(t, reqSpec{contentType: "application/json", body: `{"items":[1,2]}`}, o)
	b := fingerprint(t, reqSpec{contentType: "application/json", body: `{"items":[3,2]}`}, o)
	if a == b {
		t.Error("an array element was excluded")
	}
	// Exclusions apply to JSON bodies only.
	form1 := fingerprint(t, reqSpec{contentType: "application/x-www-form-urlencoded", body: "client_ts=1"}, opts)
	form2 := fingerprint(t, reqSpec{contentType: "application/x-www-form-urlencoded", body: "client_ts=2"}, opts)
	if form1 == form2 {
		t.Error("Exclude applied to a form body")
	}
}

func TestRequest_Precision(t *testing.T) {
	t.Parallel()
	json := func(body string) reqSpec { return reqSpec{contentType: "application/json", body: body} }
	_, err := canon.Request(newReq(json(`{"id":9007199254740993}`)), canon.Options{})
	if !errors.Is(err, canon.ErrPrecision) || !errors.Is(err, canon.ErrInvalid) {
		t.Fatalf(`{"id":9007199254740993}: err = %v, want ErrInvalid (precision)`, err)
	}
	if errors.Is(err, canon.ErrTooLarge) || errors.Is(err, canon.ErrConfig) {
		t.Fatalf("precision error %v must map to 400", err)
	}
	asString := fingerprint(t, json(`{"id":"9007199254740993"}`), canon.Options{})
	exact := fingerprint(t, json(`{"id":9007199254740992}`), canon.Options{})
	if asString == exact {
		t.Fatal(`"9007199254740993" and 9007199254740992 share a fingerprint`)
	}
	if fingerprint(t, json(`{"id":"9007199254740992"}`), canon.Options{}) == exact {
		t.Fatal("a string and a number share a fingerprint")
	}
	// The rule can be turned off: the RFC then merges the two integers.
	loose := canon.Options{AllowImpreciseNumbers: true}
	if fingerprint(t, json(`{"id":9007199254740993}`), loose) != fingerprint(t, json(`{"id":9007199254740992}`), loose) {
		t.Fatal("AllowImpreciseNumbers: 9007199254740993 should round to 9007199254740992")
	}
}

// countingReader yields n bytes of '7' and counts what was read.
type countingReader struct{ left, read int64 }

func (c *countingReader) Read(p []byte) (int, error) {
	if c.left == 0 {
		return 0, io.EOF
	}
	n := min(int64(len(p)), c.left)
	for i := range n {
		p[i] = '7'
	}
	c.left -= n
	c.read += n
	return int(n), nil
}

func (c *countingReader) Close() error { return nil }

func TestRequest_TooLarge(t *testing.T) {
	t.Parallel()
	t.Run("StreamStopsAtLimit", func(t *testing.T) {
		t.Parallel()
		src := &countingReader{left: 100 << 20}
		r := httptest.NewRequest(http.MethodPost, "/", nil)
		r.Body, r.ContentLength = src, -1 // unknown length, like chunked
		r.Header.Set("Content-Type", "application/json")
		_, err := canon.Request(r, canon.Options{MaxBody: 1000})
		if !errors.Is(err, canon.ErrTooLarge) || canon.TooLargeLimit(err) != 1000 {
			t.Fatalf("err = %v, want ErrTooLarge with limit 1000", err)
		}
		if src.read != 1001 {
			t.Fatalf("read %d bytes; want the limit plus one", src.read)
		}
		// The body still yields everything, from the first byte.
		n, err := io.Copy(io.Discard, r.Body)
		if err != nil || n != 100<<20 {
			t.Fatalf("body after the error: %d bytes, %v", n, err)
		}
	})
	t.Run("DefaultLimitIsOneMiB", func(t *testing.T) {
		t.Parallel()
		body := `"` + strings.Repeat("a", 1<<20-2) + `"`
		if _, err := canon.Request(newReq(reqSpec{contentType: "application/json", body: body}), canon.Options{}); err != nil {
			t.Fatalf("a body of exactly 1 MiB: %v", err)
		}
		body = `"` + strings.Repeat("a", 1<<20-1) + `"`
		_, err := canon.Request(newReq(reqSpec{contentType: "application/json", body: body}), canon.Options{})
		if !errors.Is(err, canon.ErrTooLarge) {
			t.Fatalf("1 MiB + 1: err = %v, want ErrTooLarge", err)
		}
	})
	t.Run("ContentLengthIsCheckedFirst", func(t *testing.T) {
		t.Parallel()
		src := &countingReader{left: 5000}
		r := httptest.NewRequest(http.MethodPost, "/", nil)
		r.Body, r.ContentLength = src, 5000
		if _, err := canon.Request(r, canon.Options{MaxBody: 10}); !errors.Is(err, canon.ErrTooLarge) {
			t.Fatalf("err = %v", err)
		}
		if src.read != 0 || r.Body != src {
			t.Fatalf("read %d bytes or replaced the body although Content-Length was over the limit", src.read)
		}
	})
	t.Run("MaxBytesReader", func(t *testing.T) {
		t.Parallel()
		r := newReq(reqSpec{contentType: "text/plain", body: strings.Repeat("x", 100)})
		r.ContentLength = -1
		r.Body = http.MaxBytesReader(httptest.NewRecorder(), r.Body, 50)
		_, err := canon.Request(r, canon.Options{})
		if !errors.Is(err, canon.ErrTooLarge) || canon.TooLargeLimit(err) != 50 {
			t.Fatalf("err = %v, want ErrTooLarge with limit 50", err)
		}
	})
	t.Run("NegativeMaxBody", func(t *testing.T) {
		t.Parallel()
		if _, err := canon.Request(newReq(reqSpec{}), canon.Options{MaxBody: -1}); !errors.Is(err, canon.ErrConfig) {
			t.Fatalf("err = %v", err)
		}
	})
}

type closeRecorder struct {
	io.Reader
	closed bool
}

func (c *closeRecorder) Close() error { c.closed = true; return nil }

func TestRequest_LeavesBodyReadable(t *testing.T) {
	t.Parallel()
	const body = `{"b":1, "a":2}`
	for _, ct := range []string{"application/json", "application/x-www-form-urlencoded", "image/png", ""} {
		r := newReq(reqSpec{contentType: ct, body: body})
		orig := &closeRecorder{Reader: strings.NewReader(body)}
		r.Body = orig
		method, url, header := r.Method, r.URL.String(), r.Header.Clone()
		// As a form, `{"b":1, "a":2}` is valid: one name, no value.
		if _, err := canon.Request(r, canon.Options{}); err != nil {
			t.Fatalf("%s: %v", ct, err)
		}
		got, err := io.ReadAll(r.Body)
		if err != nil || string(got) != body {
			t.Fatalf("%s: body after Request = %q, %v", ct, got, err)
		}
		if r.Method != method || r.URL.String() != url || len(r.Header) != len(header) {
			t.Fatalf("%s: Request changed more than the body", ct)
		}
		if err := r.Body.Close(); err != nil || !orig.closed {
			t.Fatalf("%s: closing the new body must close the original", ct)
		}
	}
}

func TestRequest_OverHTTP(t *testing.T) {
	t.Parallel()
	// A real server: chunked and sized bodies, and the handler reads the
	// body after fingerprinting.
	type result struct {
		fp   canon.Fingerprint
		body string
		err  error
	}
	results := make(chan result, 4)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fp, err := canon.Request(r, orderOpts)
		b, _ := io.ReadAll(r.Body)
		results <- result{fp, string(b), err}
	}))
	defer srv.Close()
	post := func(body io.Reader, traceparent string) result {
		t.Helper()
		req, err := http.NewRequest(http.MethodPost, srv.URL+"/v1/orders?a=1", body)
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Traceparent", traceparent)
		resp, err := srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return <-results
	}
	sized := post(strings.NewReader(orderBody), "00-1")
	chunked := post(io.MultiReader(strings.NewReader(orderBody)), "00-2") // unknown length: chunked
	if sized.err != nil || chunked.err != nil {
		t.Fatal(sized.err, chunked.err)
	}
	if sized.fp != chunked.fp || sized.body != orderBody || chunked.body != orderBody {
		t.Fatalf("sized %v / chunked %v", sized, chunked)
	}
	direct := fingerprint(t, reqSpec{target: "/v1/orders?a=1", contentType: "application/json", body: orderBody}, orderOpts)
	if sized.fp != direct {
		t.Fatalf("over HTTP %s, direct %s", sized.fp, direct)
	}
}

func TestRequest_Forms(t *testing.T) {
	t.Parallel()
	form := func(body string) canon.Fingerprint {
		return fingerprint(t, reqSpec{contentType: "application/x-www-form-urlencoded", body: body}, canon.Options{})
	}
	base := form("amount=10&currency=EUR&tag=a&tag=b")
	for _, b := range []string{"tag=b&currency=EUR&tag=a&amount=10", "currency=EUR&amount=10&tag=b&tag=a", "amount=1%30&currency=%45UR&tag=a&tag=b"} {
		if form(b) != base {
			t.Errorf("form %q: fingerprint differs", b)
		}
	}
	for _, b := range []string{"amount=11&currency=EUR&tag=a&tag=b", "amount=10&currency=EUR&tag=a", "amount=10&currency=EUR&tag=a&tag=b&tag=b"} {
		if form(b) == base {
			t.Errorf("form %q: same fingerprint", b)
		}
	}
	raw := fingerprint(t, reqSpec{contentType: "text/plain", body: "amount=10&currency=EUR&tag=a&tag=b"}, canon.Options{})
	if raw == base {
		t.Error("a raw body shares the form's fingerprint")
	}
	for _, b := range []string{"a=%zz", "a=1;b=2"} {
		_, err := canon.Request(newReq(reqSpec{contentType: "application/x-www-form-urlencoded", body: b}), canon.Options{})
		if !errors.Is(err, canon.ErrForm) || !errors.Is(err, canon.ErrInvalid) {
			t.Errorf("form %q: err = %v, want ErrInvalidForm", b, err)
		}
	}
}

func TestRequest_URL(t *testing.T) {
	t.Parallel()
	fp := func(target string) canon.Fingerprint {
		return fingerprint(t, reqSpec{method: http.MethodGet, target: target}, canon.Options{})
	}
	pairs := []struct {
		a, b string
		same bool
	}{
		{"/~user", "/%7Euser", true},
		{"/a%2fb", "/a%2Fb", true},
		{"/a%2Fb", "/a/b", false},
		{"/x?q=a+b", "/x?q=a%20b", true},
		{"/x?q=1&r=2", "/x?r=2&q=1", true},
		{"/x?q=1&q=2", "/x?q=2&q=1", true},
		{"/x?q=1", "/x?q=2", false},
		{"/x", "/x?", true},
		{"/x", "/x?q", false},
		{"/x", "/x/", false},
	}
	for _, p := range pairs {
		if got := fp(p.a) == fp(p.b); got != p.same {
			t.Errorf("%s vs %s: same = %v, want %v", p.a, p.b, got, p.same)
		}
	}
	// Clients never send a fragment; if a URL carries one, it is ignored.
	r := newReq(reqSpec{method: http.MethodGet, target: "/x"})
	r.URL.Fragment = "frag"
	if f, _ := canon.Request(r, canon.Options{}); f != fp("/x") {
		t.Error("the fragment entered the fingerprint")
	}
	for _, q := range []string{"/x?a=%zz", "/x?a=1;b=2"} {
		r := httptest.NewRequest(http.MethodGet, "/x", nil)
		r.URL.RawQuery = q[3:]
		if _, err := canon.Request(r, canon.Options{}); !errors.Is(err, canon.ErrQuery) || !errors.Is(err, canon.ErrInvalid) {
			t.Errorf("%s: err = %v, want ErrInvalidQuery", q, err)
		}
	}
}

func TestRequest_HeadersAndBodies(t *testing.T) {
	t.Parallel()
	opts := canon.Options{Headers: []string{"Host", "Prefer"}}
	a := newReq(reqSpec{method: http.MethodGet})
	a.Host = "api.example.com"
	b := newReq(reqSpec{method: http.MethodGet})
	b.Host = "api.example.org"
	fa, _ := canon.Request(a, opts)
	fb, _ := canon.Request(b, opts)
	if fa == fb {
		t.Error("Host listed but ignored")
	}
	fa, _ = canon.Request(a, canon.Options{})
	fb, _ = canon.Request(b, canon.Options{})
	if fa != fb {
		t.Error("Host not listed but included")
	}
	// Header values keep their order.
	p1 := fingerprint(t, reqSpec{header: http.Header{"Prefer": {"a", "b"}}}, opts)
	p2 := fingerprint(t, reqSpec{header: http.Header{"Prefer": {"b", "a"}}}, opts)
	if p1 == p2 {
		t.Error("header values reordered without effect")
	}

	// Empty bodies are alike, whatever their Content-Type.
	e1 := fingerprint(t, reqSpec{}, canon.Options{})
	r := newReq(reqSpec{contentType: "application/json"})
	r.Body = http.NoBody
	e2, err := canon.Request(r, canon.Options{})
	if err != nil || e1 != e2 {
		t.Errorf("empty bodies: %s vs %s, %v", e1, e2, err)
	}
	r = newReq(reqSpec{})
	r.Body = io.NopCloser(bytes.NewReader(nil))
	if e3, _ := canon.Request(r, canon.Options{}); e3 != e1 {
		t.Error("an empty reader differs from no body")
	}

	// Raw bodies: bytes and media type parameters count, parameter order
	// and case do not.
	raw := func(ct, body string) canon.Fingerprint {
		return fingerprint(t, reqSpec{contentType: ct, body: body}, canon.Options{})
	}
	if raw("text/plain; charset=utf-8; format=flowed", "hi") != raw("Text/Plain; Format=flowed; charset=utf-8", "hi") {
		t.Error("parameter order changed a raw fingerprint")
	}
	if raw("text/plain; charset=utf-8", "hi") == raw("text/plain; charset=latin1", "hi") {
		t.Error("charset ignored for a raw body")
	}
	if raw("application/octet-stream", "hi") == raw("application/octet-stream", "hj") {
		t.Error("raw bytes ignored")
	}
	if raw("", "{}") == raw("application/json", "{}") {
		t.Error("a body without Content-Type was treated as JSON")
	}
	if raw("application/problem+json", `{"b":1,"a":2}`) != raw("application/problem+json", `{"a":2,"b":1}`) {
		t.Error("+json body not canonicalized")
	}
	if _, err := canon.Request(newReq(reqSpec{contentType: "application/json", body: `{"a":1,"a":2}`}), canon.Options{}); !errors.Is(err, canon.ErrDuplicate) || !errors.Is(err, canon.ErrInvalid) {
		t.Errorf("duplicate keys: err = %v", err)
	}
	if _, err := canon.Request(newReq(reqSpec{contentType: "application/vnd.api+json", body: `{`}), canon.Options{}); !errors.Is(err, canon.ErrSyntax) {
		t.Errorf("broken +json body: err = %v", err)
	}
}

func TestRequest_InvalidOptions(t *testing.T) {
	t.Parallel()
	for _, o := range []canon.Options{
		{Headers: []string{""}},
		{Headers: []string{"Bad Header"}},
		{Headers: []string{"x:y"}},
		{Exclude: []string{""}},
		{Exclude: []string{"a"}},
		{Exclude: []string{"/a~2"}},
		{Exclude: []string{"/a~"}},
		{MaxBody: -5},
	} {
		_, err := canon.Request(newReq(reqSpec{contentType: "application/json", body: "{}"}), o)
		if !errors.Is(err, canon.ErrConfig) {
			t.Errorf("%+v: err = %v, want ErrConfig", o, err)
		}
	}
}

func TestFingerprint(t *testing.T) {
	t.Parallel()
	fp := fingerprint(t, reqSpec{}, canon.Options{})
	if !regexp.MustCompile(`^v1:[A-Za-z0-9_-]{43}$`).MatchString(string(fp)) {
		t.Fatalf("fingerprint %q is not v1: + 43 base64url characters", fp)
	}
	if fp.Version() != "v1" || canon.Fingerprint("garbage").Version() != "" || canon.Fingerprint("v2:x").Version() != "v2" {
		t.Fatal("Version")
	}
	if fingerprint(t, reqSpec{}, canon.Options{}) != fp {
		t.Fatal("not deterministic")
	}
	s := canon.Sum([]byte("ab"), []byte("c"))
	if s == canon.Sum([]byte("a"), []byte("bc")) || s == canon.Sum([]byte("abc")) || s == canon.Sum([]byte("ab"), []byte("c"), nil) {
		t.Fatal("Sum is ambiguous")
	}
	if s != canon.Sum([]byte("ab"), []byte("c")) || s.Version() != "v1" || len(s) != 46 {
		t.Fatal("Sum")
	}
}

type failingReader struct{ err error }

func (f failingReader) Read([]byte) (int, error) { return 0, f.err }
func (f failingReader) Close() error             { return nil }

// A read error is neither the client's input nor a size or configuration
// problem: it matches none of the three sentinels and wraps the reader's
// error.
func TestRequest_ReadError(t *testing.T) {
	t.Parallel()
	gone := errors.New("client went away")
	r := httptest.NewRequest(http.MethodPost, "/", nil)
	r.Body, r.ContentLength = failingReader{gone}, -1
	_, err := canon.Request(r, canon.Options{})
	if !errors.Is(err, canon.ErrReadBody) || !errors.Is(err, gone) {
		t.Fatalf("err = %v, want a read error wrapping the reader's", err)
	}
	if errors.Is(err, canon.ErrInvalid) || errors.Is(err, canon.ErrTooLarge) || errors.Is(err, canon.ErrConfig) {
		t.Fatalf("read error %v matches a sentinel", err)
	}
}
