package api

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/postguard/postguard/api/abuse"
	"github.com/postguard/postguard/email"
	"github.com/postguard/postguard/internal/dbtest"
)

// Every IDNA spelling of one mailbox is one account and one rate-limit bucket.
func TestServer_EmailDomainTwinsAreOneAccount(t *testing.T) {
	t.Parallel()

	register := func(t *testing.T, router http.Handler, email, ip string) *httptest.ResponseRecorder {
		t.Helper()
		req := jsonRequest(t, "/v1/auth/register", map[string]string{"email": email, "password": "correct horse battery"})
		req.RemoteAddr = ip + ":1234"
		return serve(t, router, req)
	}

	dbtest.Engines(t, func(t *testing.T, newStore dbtest.NewStoreFunc) {
		t.Run("OneAccount", func(t *testing.T) {
			t.Parallel()
			bundle := setup(t, newStore(t), nil)

			for _, twins := range [][]string{
				{"ada@bücher.de", "ada@xn--bcher-kva.de", "ADA@BÜCHER.DE", "ada@bücher。de"},
				{"ada@ｅxample.com", "ada@example.com", "ada@ⓔxample.com"},
			} {
				rec := register(t, bundle.router, twins[0], "192.0.2.1")
				require.Equal(t, http.StatusCreated, rec.Code, rec.Body.String())
				var resp registerResponse
				require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &resp))
				ascii, err := email.Normalize(twins[1])
				require.NoError(t, err)
				require.Equal(t, ascii, resp.Email, "the answer carries the ASCII domain")
				for _, twin := range twins[1:] {
					decodeProblem(t, register(t, bundle.router, twin, "192.0.2.1"), http.StatusConflict)
				}
				user, err := bundle.store.UserGetByEmail(t.Context(), ascii)
				require.NoError(t, err)
				require.Equal(t, resp.ID, user.ID)
			}
			require.Equal(t, 2, jobCount(t, bundle.store, "welcome_email"))
		})

		t.Run("OneBucket", func(t *testing.T) {
			t.Parallel()
			rules := generousRules().With(abuse.Rule{Action: abuse.ActionRegister, Scope: abuse.ScopeEmail, Limit: 1, Window: time.Hour})
			bundle := setup(t, newStore(t), &setupOpts{rules: &rules})

			require.Equal(t, http.StatusCreated, register(t, bundle.router, "grace@bücher.de", "192.0.2.1").Code)
			// From other IPs, each twin meets the same email bucket, refused before the 409.
			for i, twin := range []string{"grace@xn--bcher-kva.de", "grace@BÜCHER.de", "grace@bücher．de"} {
				rec := register(t, bundle.router, twin, "198.51.100."+itoa(int64(i+1)))
				decodeProblem(t, rec, http.StatusTooManyRequests)
				require.InDelta(t, i+1, decisions(t, bundle.registry, "register", "email", "refused"), 0)
			}
		})

		t.Run("RefusesLiteralsAndDotless", func(t *testing.T) {
			t.Parallel()
			bundle := setup(t, newStore(t), nil)

			for _, email := range []string{"ada@[127.0.0.1]", "ada@[IPv6:::1]", "ada@example", "ada@localhost", "ada@10.0.0.1"} {
				problem := decodeProblem(t, register(t, bundle.router, email, "192.0.2.1"), http.StatusUnprocessableEntity)
				require.Equal(t, "#/email", problem["errors"].([]any)[0].(map[string]any)["pointer"], email)
			}
			require.Zero(t, bundle.consumer.calls.Load())
			require.Equal(t, 0, jobCount(t, bundle.store, ""))
		})
	})
}
