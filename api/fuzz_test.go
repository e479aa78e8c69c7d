package api

import (
	"bytes"
	"net/http"
	"net/http/httptest"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/postguard/postguard/internal/dbtest"
)

// FuzzDecodeRegister sends random bodies to the register route of a router on a real SQLite
// store: whatever the body, the answer is documented in openapi.yaml, never a 5xx, and never a
// panic (the recoverer would turn one into a 500). The seed corpus is in
// testdata/fuzz/FuzzDecodeRegister.
func FuzzDecodeRegister(f *testing.F) {
	f.Add([]byte(`{"email":"ada@example.com","password":"correct horse battery","name":"Ada"}`))
	f.Add([]byte(`{"email":"ada@example.com","password":"short"}`))
	f.Add([]byte(`{"email":`))

	store := dbtest.NewSQLite(f)
	limiter := newLimiter(f, store, generousRules(), nil)
	router, err := New(&Config{
		Store:           store,
		Limiter:         limiter,
		Secret:          testSecret,
		Logger:          dbtest.Logger(f),
		HashConcurrency: 1,
	})
	require.NoError(f, err)

	f.Fuzz(func(t *testing.T, body []byte) {
		req := httptest.NewRequest(http.MethodPost, "/v1/auth/register", bytes.NewReader(body))
		req.Header.Set("Content-Type", mediaJSON)
		rec := serve(t, router, req)
		switch rec.Code {
		case http.StatusCreated, http.StatusBadRequest, http.StatusConflict,
			http.StatusRequestEntityTooLarge, http.StatusUnprocessableEntity:
		default:
			t.Fatalf("answer %d to %q: %s", rec.Code, body, rec.Body.String())
		}
	})
}

// newFuzzRouter is a router on a real SQLite store, with rate limits no fuzz run reaches, for
// the fuzz tests of the request decoders.
func newFuzzRouter(f *testing.F) http.Handler {
	f.Helper()
	store := dbtest.NewSQLite(f)
	router, err := New(&Config{
		Store:           store,
		Limiter:         newLimiter(f, store, generousRules(), nil),
		Secret:          testSecret,
		Logger:          dbtest.Logger(f),
		HashConcurrency: 1,
	})
	require.NoError(f, err)
	return router
}

// fuzzPost posts body to path, as JSON or (form) urlencoded, and fails unless the answer is one
// of want and documented in openapi.yaml. want never holds a 5xx: whatever the body, the
// answer is not a server error, and a panic (the recoverer's 500) fails too.
func fuzzPost(t *testing.T, router http.Handler, path string, form bool, body []byte, want ...int) {
	req := httptest.NewRequest(http.MethodPost, path, bytes.NewReader(body))
	req.Header.Set("Content-Type", mediaJSON)
	if form {
		req.Header.Set("Content-Type", mediaURLEncoded)
	}
	rec := serve(t, router, req)
	if !slices.Contains(want, rec.Code) {
		t.Fatalf("answer %d to %q (form %t), want one of %v: %s", rec.Code, body, form, want, rec.Body.String())
	}
}

// FuzzDecodeForgotPassword sends random bodies to forgot-password: the answer is 202 (the same
// for any well-formed email, known or not) or a 4xx. Seed corpus: testdata/fuzz/FuzzDecodeForgotPassword.
func FuzzDecodeForgotPassword(f *testing.F) {
	f.Add([]byte(`{"email":"ada@example.com"}`))
	router := newFuzzRouter(f)
	f.Fuzz(func(t *testing.T, body []byte) {
		fuzzPost(t, router, "/v1/auth/forgot-password", false, body,
			http.StatusAccepted, http.StatusBadRequest, http.StatusRequestEntityTooLarge, http.StatusUnprocessableEntity)
	})
}

// FuzzDecodeResendVerification is FuzzDecodeForgotPassword for resend-verification. Seed
// corpus: testdata/fuzz/FuzzDecodeResendVerification.
func FuzzDecodeResendVerification(f *testing.F) {
	f.Add([]byte(`{"email":"ada@example.com"}`))
	router := newFuzzRouter(f)
	f.Fuzz(func(t *testing.T, body []byte) {
		fuzzPost(t, router, "/v1/auth/resend-verification", false, body,
			http.StatusAccepted, http.StatusBadRequest, http.StatusRequestEntityTooLarge, http.StatusUnprocessableEntity)
	})
}

// FuzzDecodeVerifyEmail sends random JSON or form bodies to verify-email. No token is stored,
// so no body is a valid request: every answer is a 4xx (400, 413 or 422), as a problem or, for
// a form, an HTML page. Seed corpus: testdata/fuzz/FuzzDecodeVerifyEmail.
func FuzzDecodeVerifyEmail(f *testing.F) {
	f.Add(false, []byte(`{"token":"abc"}`))
	f.Add(true, []byte(`token=abc`))
	router := newFuzzRouter(f)
	f.Fuzz(func(t *testing.T, form bool, body []byte) {
		fuzzPost(t, router, "/v1/auth/verify-email", form, body,
			http.StatusBadRequest, http.StatusRequestEntityTooLarge, http.StatusUnprocessableEntity)
	})
}

// FuzzDecodeResetPassword is FuzzDecodeVerifyEmail for reset-password (token and new password).
// Seed corpus: testdata/fuzz/FuzzDecodeResetPassword.
func FuzzDecodeResetPassword(f *testing.F) {
	f.Add(false, []byte(`{"token":"abc","password":"correct horse battery"}`))
	f.Add(true, []byte(`token=abc&password=correct+horse+battery`))
	router := newFuzzRouter(f)
	f.Fuzz(func(t *testing.T, form bool, body []byte) {
		fuzzPost(t, router, "/v1/auth/reset-password", form, body,
			http.StatusBadRequest, http.StatusRequestEntityTooLarge, http.StatusUnprocessableEntity)
	})
}
