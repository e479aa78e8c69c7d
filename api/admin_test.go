package api

import (
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/postguard/postguard/db"
	"github.com/postguard/postguard/email"
	"github.com/postguard/postguard/internal/dbtest"
	"github.com/postguard/postguard/internal/riverstore"
	"github.com/postguard/postguard/jobs/mail/resendfake"
	"github.com/postguard/postguard/tokens"
)

// testAdminToken is ADMIN_TOKEN in tests.
const testAdminToken = "admin-token-0123456789abcdef-0123456789"

func adminConfig(config *Config) { config.AdminToken = testAdminToken }

// adminRequest is a request to the admin API with the admin token.
func adminRequest(method, path string) *http.Request {
	req := httptest.NewRequest(method, path, nil)
	req.Header.Set("Authorization", "Bearer "+testAdminToken)
	return req
}

func decodeJSONAnswer(t *testing.T, rec *httptest.ResponseRecorder, status int, v any) {
	t.Helper()
	require.Equal(t, status, rec.Code, "body: %s", rec.Body.String())
	require.Equal(t, mediaJSON, rec.Header().Get("Content-Type"))
	require.Equal(t, "no-store", rec.Header().Get("Cache-Control"))
	require.NoError(t, json.Unmarshal(rec.Body.Bytes(), v))
}

// adminRoutes are a request to each admin route.
func adminRoutes(userID int64) []struct{ method, path string } {
	return []struct{ method, path string }{
		{http.MethodGet, "/v1/admin/users/" + strconv.FormatInt(userID, 10) + "/messages"},
		{http.MethodGet, "/v1/admin/suppressions"},
		{http.MethodDelete, "/v1/admin/suppressions/ada@example.com"},
	}
}

func TestAdmin_Auth(t *testing.T) {
	t.Parallel()

	t.Run("NotMountedWithoutToken", func(t *testing.T) {
		t.Parallel()

		bundle := newSQLiteBundle(t, nil)
		for _, route := range adminRoutes(1) {
			rec := serve(t, bundle.router, adminRequest(route.method, route.path))
			decodeProblem(t, rec, http.StatusNotFound)
			require.Empty(t, rec.Header().Get("WWW-Authenticate"), "nothing tells the admin API exists")
		}
	})

	t.Run("Refused", func(t *testing.T) {
		t.Parallel()

		bundle := newSQLiteBundle(t, &setupOpts{configFunc: adminConfig})
		user := insertUser(t, bundle.store, uniqueEmail("auth"), false)
		for _, tt := range []struct {
			name      string
			header    func(req *http.Request)
			challenge string
		}{
			{"NoToken", func(*http.Request) {}, `Bearer realm="postguard admin"`},
			{"WrongToken", func(r *http.Request) { r.Header.Set("Authorization", "Bearer "+testAdminToken+"x") }, `Bearer realm="postguard admin", error="invalid_token"`},
			{"PrefixOfToken", func(r *http.Request) { r.Header.Set("Authorization", "Bearer "+testAdminToken[:32]) }, `Bearer realm="postguard admin", error="invalid_token"`},
			{"OtherScheme", func(r *http.Request) { r.Header.Set("Authorization", "Basic "+testAdminToken) }, `Bearer realm="postguard admin"`},
			{"EmptyBearer", func(r *http.Request) { r.Header.Set("Authorization", "Bearer ") }, `Bearer realm="postguard admin"`},
			{"TokenInCookie", func(r *http.Request) { r.AddCookie(&http.Cookie{Name: "token", Value: testAdminToken}) }, `Bearer realm="postguard admin"`},
			{"TokenInQuery", func(r *http.Request) { r.URL.RawQuery = "access_token=" + url.QueryEscape(testAdminToken) }, `Bearer realm="postguard admin"`},
		} {
			for _, route := range adminRoutes(user.ID) {
				req := httptest.NewRequest(route.method, route.path, nil)
				tt.header(req)
				rec := serve(t, bundle.router, req)
				decodeProblem(t, rec, http.StatusUnauthorized)
				require.Equal(t, tt.challenge, rec.Header().Get("WWW-Authenticate"), "%s %s %s", tt.name, route.method, route.path)
				require.Equal(t, "no-store", rec.Header().Get("Cache-Control"))
			}
		}

		// The scheme's case does not matter (RFC 7235).
		req := adminRequest(http.MethodGet, "/v1/admin/suppressions")
		req.Header.Set("Authorization", "bearer "+testAdminToken)
		require.Equal(t, http.StatusOK, serve(t, bundle.router, req).Code)
	})
}

// adminMessagesAnswer is the answer of GET /v1/admin/users/{id}/messages.
type adminMessagesAnswer struct {
	UserID      int64             `json:"user_id"`
	Suppression *adminSuppression `json:"suppression"`
	Messages    []adminMessage    `json:"messages"`
}

func TestAdmin_UserMessages(t *testing.T) {
	t.Parallel()

	dbtest.Engines(t, func(t *testing.T, newStore dbtest.NewStoreFunc) {
		t.Run("Lifecycle", func(t *testing.T) {
			t.Parallel()

			store := newStore(t)
			bundle := setupWebhook(t, store, &setupOpts{configFunc: adminConfig})
			// Two more mails: one queued (a link token made, not yet accepted), one suppressed.
			queuedKey := tokens.IdempotencyKey("password_reset_email", bundle.user.ID)
			_, err := store.EmailMessageInsert(t.Context(), &db.EmailMessageInsertParams{JobID: 77, Kind: "password_reset_email", UserID: bundle.user.ID, IdempotencyKey: queuedKey, Now: time.Now().Add(time.Second)})
			require.NoError(t, err)
			rawToken := tokens.New()
			require.NoError(t, store.EmailTokenInsert(t.Context(), &db.EmailTokenInsertParams{
				TokenHash: tokens.Hash(rawToken), UserID: bundle.user.ID, Purpose: db.TokenPurposeReset, JobID: 77,
				Sealed: []byte("sealed"), ExpiresAt: time.Now().Add(time.Hour), Now: time.Now(),
			}))
			smtp := "smtp" // an attempt handed it over and never heard back
			require.NoError(t, store.EmailMessageSetProviderInDoubt(t.Context(), &db.EmailMessageSetProviderInDoubtParams{JobID: 77, Provider: &smtp, Now: time.Now()}))
			_, err = store.EmailMessageMarkSuppressed(t.Context(), &db.EmailMessageMarkSuppressedParams{JobID: 78, Kind: "welcome_email", UserID: bundle.user.ID, IdempotencyKey: tokens.IdempotencyKey("welcome_email", bundle.user.ID), Now: time.Now().Add(2 * time.Second)})
			require.NoError(t, err)

			require.Equal(t, http.StatusNoContent, bundle.post(t, bundle.event(resendfake.EventDelivered, nil)).Code)
			bounceAt := ms(time.Now()).Add(time.Minute)
			require.Equal(t, http.StatusNoContent, bundle.post(t, bundle.event(resendfake.EventBounced, &resendfake.EventOpts{At: bounceAt})).Code)

			rec := serve(t, bundle.router, adminRequest(http.MethodGet, "/v1/admin/users/"+strconv.FormatInt(bundle.user.ID, 10)+"/messages"))
			var answer adminMessagesAnswer
			decodeJSONAnswer(t, rec, http.StatusOK, &answer)
			require.Equal(t, bundle.user.ID, answer.UserID)
			require.Len(t, answer.Messages, 3)

			suppressed, queued, bounced := answer.Messages[0], answer.Messages[1], answer.Messages[2]
			require.Equal(t, int64(78), suppressed.JobID)
			require.Equal(t, email.StatusSuppressed, suppressed.Status)
			require.NotNil(t, suppressed.SuppressedAt)
			require.Nil(t, suppressed.ProviderID)

			require.Equal(t, int64(77), queued.JobID)
			require.Equal(t, email.StatusQueued, queued.Status)
			require.Nil(t, queued.AcceptedAt)
			require.Nil(t, queued.Provider)
			require.Equal(t, "smtp", *queued.ProviderInDoubt)

			require.Equal(t, bundle.jobID, bounced.JobID)
			require.Equal(t, "verification_email", bounced.Kind)
			require.Equal(t, email.StatusBounced, bounced.Status)
			require.Equal(t, bundle.delivery.ID, *bounced.ProviderID)
			require.Equal(t, "resend", *bounced.Provider, "which provider took it")
			require.Nil(t, bounced.ProviderInDoubt)
			requireTime(t, bounceAt, bounced.StatusAt)
			requireTime(t, bounceAt, bounced.BouncedAt)
			require.NotNil(t, bounced.DeliveredAt)
			require.NotNil(t, bounced.SentAt)
			require.NotNil(t, bounced.AcceptedAt)
			require.Equal(t, "Permanent", *bounced.Bounce.Type)
			require.Equal(t, "General", *bounced.Bounce.SubType)

			// The permanent bounce put the address on the list.
			require.NotNil(t, answer.Suppression)
			require.Equal(t, email.ReasonBounced, answer.Suppression.Reason)
			require.Equal(t, hex.EncodeToString(email.SuppressionKey(testSecret, bundle.user.Email)), answer.Suppression.AddressHash)

			// Never a token, a key, a body or the address.
			body := rec.Body.String()
			for _, secret := range []string{rawToken, tokens.Unsubscribe(testSecret, bundle.user.ID), queuedKey, bundle.user.Email, "Recipient address rejected", "Verify your email"} {
				require.NotContains(t, body, secret)
			}
			for _, field := range []string{`"idempotency_key"`, `"token"`, `"html"`, `"text"`, `"subject"`, `"email"`, `"to"`} {
				require.NotContains(t, body, field)
			}
		})

		t.Run("NoMessages", func(t *testing.T) {
			t.Parallel()

			bundle := setup(t, newStore(t), &setupOpts{configFunc: adminConfig})
			user := insertUser(t, bundle.store, uniqueEmail("quiet"), false)
			var answer adminMessagesAnswer
			decodeJSONAnswer(t, serve(t, bundle.router, adminRequest(http.MethodGet, "/v1/admin/users/"+strconv.FormatInt(user.ID, 10)+"/messages")), http.StatusOK, &answer)
			require.Empty(t, answer.Messages)
			require.NotNil(t, answer.Messages, "an empty list, not null")
			require.Nil(t, answer.Suppression)
		})

		t.Run("BadOrUnknownID", func(t *testing.T) {
			t.Parallel()

			bundle := setup(t, newStore(t), &setupOpts{configFunc: adminConfig})
			for _, id := range []string{"abc", "0", "-1", "01", "+1", "1.5", "99999999999999999999"} {
				decodeProblem(t, serve(t, bundle.router, adminRequest(http.MethodGet, "/v1/admin/users/"+id+"/messages")), http.StatusBadRequest)
			}
			decodeProblem(t, serve(t, bundle.router, adminRequest(http.MethodGet, "/v1/admin/users/424242/messages")), http.StatusNotFound)
		})
	})
}

// adminSuppressionsAnswer is the answer of GET /v1/admin/suppressions.
type adminSuppressionsAnswer struct {
	Suppressions []adminSuppression `json:"suppressions"`
	NextCursor   *string            `json:"next_cursor"`
}

func TestAdmin_Suppressions(t *testing.T) {
	t.Parallel()

	dbtest.Engines(t, func(t *testing.T, newStore dbtest.NewStoreFunc) {
		suppressAddresses := func(t *testing.T, store riverstore.Store, addresses ...string) {
			t.Helper()
			at := time.Now().Truncate(time.Microsecond)
			for i, address := range addresses {
				require.NoError(t, store.EmailSuppressionInsert(t.Context(), &db.EmailSuppressionInsertParams{
					AddressHash: email.SuppressionKey(testSecret, address), Reason: email.ReasonComplained,
					EmailID: "re_" + strconv.Itoa(i), SuppressedAt: at.Add(time.Duration(i%3) * time.Second), Now: at,
				}))
			}
		}

		t.Run("Pages", func(t *testing.T) {
			t.Parallel()

			bundle := setup(t, newStore(t), &setupOpts{configFunc: adminConfig})
			var addresses []string
			for i := range 7 {
				addresses = append(addresses, "user"+strconv.Itoa(i)+"@example.com")
			}
			suppressAddresses(t, bundle.store, addresses...)

			seen := map[string]bool{}
			path := "/v1/admin/suppressions?limit=3"
			var last time.Time
			for pages := 0; ; pages++ {
				require.Less(t, pages, 4)
				var answer adminSuppressionsAnswer
				decodeJSONAnswer(t, serve(t, bundle.router, adminRequest(http.MethodGet, path)), http.StatusOK, &answer)
				require.LessOrEqual(t, len(answer.Suppressions), 3)
				for _, suppression := range answer.Suppressions {
					require.False(t, seen[suppression.AddressHash], "each once")
					seen[suppression.AddressHash] = true
					if !last.IsZero() {
						require.False(t, suppression.SuppressedAt.After(last), "newest first")
					}
					last = suppression.SuppressedAt
					require.Equal(t, email.ReasonComplained, suppression.Reason)
				}
				if answer.NextCursor == nil {
					require.Equal(t, 2, pages, "7 in pages of 3: the third is the last")
					break
				}
				path = "/v1/admin/suppressions?limit=3&cursor=" + url.QueryEscape(*answer.NextCursor)
			}
			require.Len(t, seen, 7)
			for _, address := range addresses {
				require.True(t, seen[hex.EncodeToString(email.SuppressionKey(testSecret, address))])
			}

			// The default page holds them all, and says it is the last.
			var answer adminSuppressionsAnswer
			rec := serve(t, bundle.router, adminRequest(http.MethodGet, "/v1/admin/suppressions"))
			decodeJSONAnswer(t, rec, http.StatusOK, &answer)
			require.Len(t, answer.Suppressions, 7)
			require.Nil(t, answer.NextCursor)
			require.NotContains(t, rec.Body.String(), "@example.com", "no address is stored, none is shown")
		})

		t.Run("Empty", func(t *testing.T) {
			t.Parallel()

			bundle := setup(t, newStore(t), &setupOpts{configFunc: adminConfig})
			rec := serve(t, bundle.router, adminRequest(http.MethodGet, "/v1/admin/suppressions"))
			require.Equal(t, http.StatusOK, rec.Code)
			require.JSONEq(t, `{"suppressions":[],"next_cursor":null}`, rec.Body.String())
		})

		t.Run("BadParameters", func(t *testing.T) {
			t.Parallel()

			bundle := setup(t, newStore(t), &setupOpts{configFunc: adminConfig})
			for _, query := range []string{"limit=0", "limit=1001", "limit=x", "limit=", "cursor=bm90IGEgY3Vyc29y", "cursor=" + formatCursor(time.Now(), []byte("short"))} {
				decodeProblem(t, serve(t, bundle.router, adminRequest(http.MethodGet, "/v1/admin/suppressions?"+query)), http.StatusBadRequest)
			}
		})

		// A cursor is opaque, but a client can send anything: a time no suppression can have
		// (the third review's -210866803200000001 is a day before PostgreSQL's first, and was a
		// 500 there), or a spelling of one that this API never gives, is a 400 on both engines.
		t.Run("TamperedCursor", func(t *testing.T) {
			t.Parallel()

			bundle := setup(t, newStore(t), &setupOpts{configFunc: adminConfig})
			suppressAddresses(t, bundle.store, "ada@example.com")
			hash := strings.Repeat("ab", 32)
			cursor := func(raw string) string { return base64.RawURLEncoding.EncodeToString([]byte(raw)) }
			for _, bad := range []string{
				cursor("-210866803200000001:" + hash),
				cursor("-9223372036854775808:" + hash),
				cursor("9223372036854775807:" + hash),
				cursor("-1:" + hash),
				cursor(strconv.FormatInt(firstPageBefore.UnixMicro()+1, 10) + ":" + hash),
				cursor("9223372036854775808:" + hash),
				cursor("+1700000000000000:" + hash),
				cursor("01700000000000000:" + hash),
				cursor(" 1700000000000000:" + hash),
				cursor("1700000000000000:" + strings.ToUpper(hash)),
				cursor("1700000000000000:" + hash[:62]),
				cursor("1700000000000000:" + hash + "00"),
				cursor("1700000000000000:" + hash + ":"),
				cursor("1700000000000000" + hash),
				cursor(":" + hash),
				cursor("1.7e15:" + hash),
				cursor("1700000000000000:" + hash)[:10] + "*",
				cursor("1700000000000000:"+hash) + "=",
				"",
			} {
				rec := serve(t, bundle.router, adminRequest(http.MethodGet, "/v1/admin/suppressions?cursor="+url.QueryEscape(bad)))
				decodeProblem(t, rec, http.StatusBadRequest)
			}

			// The edges of the range are fine: nothing before the first time, everything before
			// the last.
			for raw, entries := range map[string]int{
				"0:" + hash: 0,
				strconv.FormatInt(firstPageBefore.UnixMicro(), 10) + ":" + hash: 1,
			} {
				var answer adminSuppressionsAnswer
				decodeJSONAnswer(t, serve(t, bundle.router, adminRequest(http.MethodGet, "/v1/admin/suppressions?cursor="+cursor(raw))), http.StatusOK, &answer)
				require.Len(t, answer.Suppressions, entries, raw)
			}
		})

		t.Run("Delete", func(t *testing.T) {
			t.Parallel()

			bundle := setup(t, newStore(t), &setupOpts{configFunc: adminConfig})
			suppressAddresses(t, bundle.store, "ada@xn--bcher-kva.de", "bob@example.com")

			// Any spelling of the address: normalised (case, Unicode, IDNA) as everywhere.
			for _, path := range []string{"/v1/admin/suppressions/" + url.PathEscape("  ADA@Bücher.de "), "/v1/admin/suppressions/ada@bücher.de"} {
				rec := serve(t, bundle.router, adminRequest(http.MethodDelete, path))
				require.Equal(t, http.StatusNoContent, rec.Code, rec.Body.String())
				require.Empty(t, rec.Body.String())
			}
			_, err := bundle.store.EmailSuppressionGet(t.Context(), email.SuppressionKey(testSecret, "ada@xn--bcher-kva.de"))
			require.ErrorIs(t, err, db.ErrNotFound)
			_, err = bundle.store.EmailSuppressionGet(t.Context(), email.SuppressionKey(testSecret, "bob@example.com"))
			require.NoError(t, err, "others stay")
			require.NotContains(t, bundle.logs.String(), "ada@", "the log names the hash, not the address")
			require.Contains(t, bundle.logs.String(), hex.EncodeToString(email.SuppressionKey(testSecret, "ada@xn--bcher-kva.de")))

			for _, bad := range []string{"not-an-address", "ada@localhost", url.PathEscape("ada@[127.0.0.1]")} {
				decodeProblem(t, serve(t, bundle.router, adminRequest(http.MethodDelete, "/v1/admin/suppressions/"+bad)), http.StatusBadRequest)
			}
		})
	})
}
