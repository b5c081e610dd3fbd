package demoauth_test

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/oncekey/oncekey/examples/internal/demoauth"
)

func TestTenant(t *testing.T) {
	t.Parallel()
	for header, want := range map[string]string{
		"Bearer acme":                        "acme",
		"bearer acme-1.a_b":                  "acme-1.a_b",
		"Bearer ":                            "",
		"Basic YWNtZQ==":                     "",
		"Bearer two words":                   "",
		"Bearer {tag}":                       "",
		"":                                   "",
		"Bearer " + string(make([]byte, 65)): "",
	} {
		var got string
		var err error
		h := demoauth.Middleware(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			got, err = demoauth.Tenant(r)
		}))
		r := httptest.NewRequest(http.MethodGet, "/", nil)
		if header != "" {
			r.Header.Set("Authorization", header)
		}
		h.ServeHTTP(httptest.NewRecorder(), r)
		if got != want || (want == "") != errors.Is(err, demoauth.ErrUnauthenticated) {
			t.Errorf("Authorization %q: tenant %q, err %v; want %q", header, got, err, want)
		}
	}
}
