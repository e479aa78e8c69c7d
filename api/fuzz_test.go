package api

import (
	"bytes"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/riverqueue/river"
	"github.com/stretchr/testify/require"

	"github.com/postguard/postguard/api/abuse"
	"github.com/postguard/postguard/db/dbtest"
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
	dbtest.ConfigureRiver(f, store, &river.Config{})
	limiter := abuse.NewLimiter(store, testSecret, generousRules(), nil)
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
