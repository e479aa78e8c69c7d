package api

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/riverqueue/river"
	"github.com/riverqueue/river/rivertype"
	"github.com/stretchr/testify/require"

	"github.com/postguard/postguard/api/abuse"
	"github.com/postguard/postguard/db"
	"github.com/postguard/postguard/internal/dbtest"
	"github.com/postguard/postguard/internal/riverstore"
	"github.com/postguard/postguard/internal/uniform"
)

func TestServer_Register(t *testing.T) {
	t.Parallel()

	dbtest.Engines(t, func(t *testing.T, newStore dbtest.NewStoreFunc) {
		t.Run("CreatesUserAndJobs", func(t *testing.T) {
			t.Parallel()
			bundle := setup(t, newStore(t), nil)

			rec := serve(t, bundle.router, jsonRequest(t, "/v1/auth/register", map[string]string{
				"email": "  Ada.Lovelace@Example.COM ", "password": "correct horse battery", "name": "  Ada Lovelace ",
			}))
			require.Equal(t, http.StatusCreated, rec.Code, rec.Body.String())
			require.Equal(t, mediaJSON, rec.Header().Get("Content-Type"))
			var resp registerResponse
			require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &resp))
			require.Equal(t, "ada.lovelace@example.com", resp.Email)
			require.Positive(t, resp.ID)

			user, err := bundle.store.UserGetByEmail(t.Context(), "ada.lovelace@example.com")
			require.NoError(t, err)
			require.Equal(t, resp.ID, user.ID)
			require.Equal(t, "Ada Lovelace", user.Name)
			require.Nil(t, user.EmailVerifiedAt)
			require.True(t, strings.HasPrefix(user.PasswordHash, "$argon2id$v=19$m=19456,t=2,p=1$"), user.PasswordHash)
			ok, err := verifyPassword(user.PasswordHash, "correct horse battery")
			require.NoError(t, err)
			require.True(t, ok)

			for _, kind := range []string{"welcome_email", "verification_email"} {
				result, err := bundle.store.Jobs().JobList(t.Context(), river.NewJobListParams().Kinds(kind))
				require.NoError(t, err)
				require.Len(t, result.Jobs, 1, kind)
				require.JSONEq(t, `{"user_id":`+itoa(resp.ID)+`}`, string(result.Jobs[0].EncodedArgs), kind)
			}
			require.Equal(t, 2, jobCount(t, bundle.store, ""))

			require.NotEmpty(t, rec.Header().Get("RateLimit-Policy"))
			require.NotEmpty(t, rec.Header().Get("RateLimit"))
		})

		// The user keeps a locale: the body's (canonical), else the first language of
		// Accept-Language, else none; a header that does not parse is ignored.
		t.Run("Locale", func(t *testing.T) {
			t.Parallel()
			bundle := setup(t, newStore(t), nil)

			for i, tt := range []struct {
				name, locale, acceptLanguage, want string
			}{
				{"Field", "fr", "", "fr"},
				{"FieldCanonical", "fr-ca", "", "fr-CA"},
				{"FieldBeforeHeader", "pt-BR", "fr-CH, fr;q=0.9", "pt-BR"},
				{"Header", "", "fr-CH, fr;q=0.9, en;q=0.8", "fr-CH"},
				{"HeaderHighestQ", "", "en;q=0.1, de", "de"},
				{"HeaderAny", "", "*", ""},
				{"HeaderMalformed", "", "!!!, ;;q=x", ""},
				{"None", "", "", ""},
			} {
				body := map[string]string{"email": "locale" + itoa(int64(i)) + "@example.com", "password": "correct horse battery"}
				if tt.locale != "" {
					body["locale"] = tt.locale
				}
				req := jsonRequest(t, "/v1/auth/register", body)
				if tt.acceptLanguage != "" {
					req.Header.Set("Accept-Language", tt.acceptLanguage)
				}
				rec := serve(t, bundle.router, req)
				require.Equal(t, http.StatusCreated, rec.Code, "%s: %s", tt.name, rec.Body.String())
				user, err := bundle.store.UserGetByEmail(t.Context(), body["email"])
				require.NoError(t, err)
				require.Equal(t, tt.want, user.Locale, tt.name)
			}
		})

		t.Run("DuplicateIsConflict", func(t *testing.T) {
			t.Parallel()
			bundle := setup(t, newStore(t), nil)

			register(t, bundle.router, "dup@example.com")
			rec := serve(t, bundle.router, jsonRequest(t, "/v1/auth/register", map[string]string{"email": "DUP@example.com", "password": "another password"}))
			decodeProblem(t, rec, http.StatusConflict)
			require.Equal(t, 1, jobCount(t, bundle.store, "welcome_email"))
			require.Equal(t, 1, jobCount(t, bundle.store, "verification_email"))
		})

		t.Run("PasswordNeverTruncated", func(t *testing.T) {
			t.Parallel()
			bundle := setup(t, newStore(t), nil)

			password := strings.Repeat("é", maxPasswordLen) // 256 code points, 512 bytes
			rec := serve(t, bundle.router, jsonRequest(t, "/v1/auth/register", map[string]string{"email": "long@example.com", "password": password}))
			require.Equal(t, http.StatusCreated, rec.Code, rec.Body.String())
			user, err := bundle.store.UserGetByEmail(t.Context(), "long@example.com")
			require.NoError(t, err)
			ok, err := verifyPassword(user.PasswordHash, password)
			require.NoError(t, err)
			require.True(t, ok)
			ok, err = verifyPassword(user.PasswordHash, password[:len(password)-2])
			require.NoError(t, err)
			require.False(t, ok)
		})

		t.Run("FailureInTransactionLeavesNothing", func(t *testing.T) {
			t.Parallel()
			store := newStore(t)
			failing := &failingStore{Store: store, failJobInsert: 2}
			bundle := setup(t, failing, nil)

			rec := serve(t, bundle.router, jsonRequest(t, "/v1/auth/register", map[string]string{"email": "tx@example.com", "password": "correct horse battery"}))
			problem := decodeProblem(t, rec, http.StatusInternalServerError)
			require.NotContains(t, problem["detail"], "injected")
			require.Contains(t, bundle.logs.String(), "injected job insert failure")

			_, err := store.UserGetByEmail(t.Context(), "tx@example.com")
			require.ErrorIs(t, err, db.ErrNotFound)
			require.Equal(t, 0, jobCount(t, store, ""))
		})
	})
}

// failingStore is a real store whose transactions fail their failJobInsert-th job insert.
type failingStore struct {
	riverstore.Store
	failJobInsert int
}

func (s *failingStore) InTx(ctx context.Context, fn func(ctx context.Context, tx riverstore.Tx) error) error {
	return s.Store.InTx(ctx, func(ctx context.Context, tx riverstore.Tx) error {
		return fn(ctx, &failingTx{Tx: tx, failAt: s.failJobInsert})
	})
}

type failingTx struct {
	riverstore.Tx
	n, failAt int
}

func (q *failingTx) JobInsert(ctx context.Context, args river.JobArgs, opts *river.InsertOpts) (*rivertype.JobInsertResult, error) {
	q.n++
	if q.n == q.failAt {
		return nil, errors.New("injected job insert failure")
	}
	return q.Tx.JobInsert(ctx, args, opts)
}

func TestServer_BadInput(t *testing.T) {
	t.Parallel()

	const pw = "correct horse battery"
	type testCase struct {
		name        string
		path        string
		contentType string
		body        string
		status      int
	}
	cases := []testCase{
		{"MalformedJSON", "/v1/auth/register", mediaJSON, `{"email":"bad1@example.com","password":`, 400},
		{"NotAnObject", "/v1/auth/register", mediaJSON, `["bad2@example.com"]`, 400},
		{"String", "/v1/auth/register", mediaJSON, `"bad3@example.com"`, 400},
		{"Empty", "/v1/auth/register", mediaJSON, ``, 400},
		{"TrailingData", "/v1/auth/register", mediaJSON, `{"email":"bad4@example.com","password":"` + pw + `"} {}`, 400},
		{"WrongType", "/v1/auth/register", mediaJSON, `{"email":"bad5@example.com","password":12345678}`, 400},
		{"UnknownField", "/v1/auth/register", mediaJSON, `{"email":"bad6@example.com","password":"` + pw + `","admin":true}`, 400},
		{"InvalidUTF8", "/v1/auth/register", mediaJSON, "{\"email\":\"bad21\xff@example.com\",\"password\":\"" + pw + "\"}", 400},
		{"MissingEmail", "/v1/auth/register", mediaJSON, `{"password":"` + pw + `"}`, 422},
		{"NullEmail", "/v1/auth/register", mediaJSON, `{"email":null,"password":"` + pw + `"}`, 422},
		{"MissingPassword", "/v1/auth/register", mediaJSON, `{"email":"bad7@example.com"}`, 422},
		{"InvalidEmail", "/v1/auth/register", mediaJSON, `{"email":"Bad <bad8@example.com>","password":"` + pw + `"}`, 422},
		{"ShortPassword", "/v1/auth/register", mediaJSON, `{"email":"bad9@example.com","password":"1234567"}`, 422},
		{"ShortPasswordInCodePoints", "/v1/auth/register", mediaJSON, `{"email":"bad10@example.com","password":"😀😀😀😀😀😀😀"}`, 422},
		{"LongPassword", "/v1/auth/register", mediaJSON, `{"email":"bad11@example.com","password":"` + strings.Repeat("p", maxPasswordLen+1) + `"}`, 422},
		{"LongName", "/v1/auth/register", mediaJSON, `{"email":"bad12@example.com","password":"` + pw + `","name":"` + strings.Repeat("n", maxNameLen+1) + `"}`, 422},
		{"ControlCharInName", "/v1/auth/register", mediaJSON, `{"email":"bad13@example.com","password":"` + pw + `","name":"a\u0007b"}`, 422},
		{"TooLarge", "/v1/auth/register", mediaJSON, `{"email":"bad14@example.com","password":"` + pw + `","name":"` + strings.Repeat("n", MaxBodyBytes) + `"}`, 413},
		{"TextPlain", "/v1/auth/register", "text/plain", `{"email":"bad15@example.com","password":"` + pw + `"}`, 415},
		{"NoContentType", "/v1/auth/register", "", `{"email":"bad16@example.com","password":"` + pw + `"}`, 415},
		{"FormToJSONOnlyRoute", "/v1/auth/register", mediaURLEncoded, `email=bad17%40example.com&password=correct+horse+battery`, 415},
		{"ForgotMalformed", "/v1/auth/forgot-password", mediaJSON, `{"email":`, 400},
		{"ForgotUnknownField", "/v1/auth/forgot-password", mediaJSON, `{"email":"bad18@example.com","x":1}`, 400},
		{"ForgotMissingEmail", "/v1/auth/forgot-password", mediaJSON, `{}`, 422},
		{"ForgotInvalidEmail", "/v1/auth/forgot-password", mediaJSON, `{"email":"nope"}`, 422},
		{"ForgotTextPlain", "/v1/auth/forgot-password", "text/plain", `{"email":"bad19@example.com"}`, 415},
		{"ResendMalformed", "/v1/auth/resend-verification", mediaJSON, `{`, 400},
		{"ResendInvalidEmail", "/v1/auth/resend-verification", mediaJSON, `{"email":"a@b@c"}`, 422},
		{"ResendForm", "/v1/auth/resend-verification", mediaURLEncoded, `email=bad20%40example.com`, 415},
		{"VerifyMissingToken", "/v1/auth/verify-email", mediaJSON, `{}`, 422},
		{"VerifyUnknownField", "/v1/auth/verify-email", mediaJSON, `{"token":"abc","x":1}`, 400},
		{"VerifyTextPlain", "/v1/auth/verify-email", "text/plain", `token=abc`, 415},
		{"ResetShortPassword", "/v1/auth/reset-password", mediaJSON, `{"token":"abc","password":"short"}`, 422},
		{"ResetMissingToken", "/v1/auth/reset-password", mediaJSON, `{"password":"` + pw + `"}`, 422},
		{"ResetMalformed", "/v1/auth/reset-password", mediaJSON, `{"token":`, 400},
		{"UnsubscribeJSON", "/v1/unsubscribe?token=x", mediaJSON, `{}`, 415},
		{"BadLocale", "/v1/auth/register", mediaJSON, `{"email":"bad21@example.com","password":"` + pw + `","locale":"french!"}`, 422},
		{"LongLocale", "/v1/auth/register", mediaJSON, `{"email":"bad22@example.com","password":"` + pw + `","locale":"en-` + strings.Repeat("a1b2c3d4-", 8) + `x"}`, 422},
		{"LocaleNotString", "/v1/auth/register", mediaJSON, `{"email":"bad23@example.com","password":"` + pw + `","locale":["fr"]}`, 400},
	}

	dbtest.Engines(t, func(t *testing.T, newStore dbtest.NewStoreFunc) {
		bundle := setup(t, newStore(t), nil)

		for _, tt := range cases {
			req := httptest.NewRequest(http.MethodPost, tt.path, strings.NewReader(tt.body))
			if tt.contentType != "" {
				req.Header.Set("Content-Type", tt.contentType)
			}
			rec := serve(t, bundle.router, req)
			problem := decodeProblem(t, rec, tt.status)
			if tt.status == http.StatusUnprocessableEntity {
				require.NotEmpty(t, problem["errors"], tt.name)
			}
		}

		// Nothing written, no counter touched.
		require.Zero(t, bundle.consumer.calls.Load())
		require.Equal(t, 0, jobCount(t, bundle.store, ""))
		for i := range 24 {
			_, err := bundle.store.UserGetByEmail(t.Context(), "bad"+itoa(int64(i))+"@example.com")
			require.ErrorIs(t, err, db.ErrNotFound)
		}

		// The same store and limiter do count a valid request: the zero above means something.
		register(t, bundle.router, "good@example.com")
		require.Equal(t, int64(1), bundle.consumer.calls.Load(), "register's checks are one round trip")
		require.Equal(t, int64(2), bundle.consumer.windows.Load(), "register checks its IP and its email")
	})
}

func TestServer_ValidationProblemListsFields(t *testing.T) {
	t.Parallel()

	bundle := newSQLiteBundle(t, nil)
	rec := serve(t, bundle.router, jsonRequest(t, "/v1/auth/register", `{"email":"nope","password":"short","name":"`+strings.Repeat("n", 201)+`","locale":"not a locale"}`))
	problem := decodeProblem(t, rec, http.StatusUnprocessableEntity)
	var pointers []string
	for _, e := range problem["errors"].([]any) {
		pointers = append(pointers, e.(map[string]any)["pointer"].(string))
	}
	require.Equal(t, []string{"#/email", "#/password", "#/name", "#/locale"}, pointers)
}

func TestServer_EmailKeyIsNormalised(t *testing.T) {
	t.Parallel()

	rules := generousRules().
		With(abuse.Rule{Action: abuse.ActionRegister, Scope: abuse.ScopeEmail, Limit: 1, Window: time.Hour}).
		With(abuse.Rule{Action: abuse.ActionForgotPassword, Scope: abuse.ScopeEmail, Limit: 1, Window: time.Hour})
	dbtest.Engines(t, func(t *testing.T, newStore dbtest.NewStoreFunc) {
		bundle := setup(t, newStore(t), &setupOpts{rules: &rules})

		rec := serve(t, bundle.router, jsonRequest(t, "/v1/auth/register", map[string]string{"email": "  Jos\u0065\u0301@Example.com ", "password": "correct horse battery"}))
		require.Equal(t, http.StatusCreated, rec.Code, rec.Body.String())
		require.Contains(t, rec.Body.String(), `"email":"josé@example.com"`)

		// Another spelling of the same address: the email bucket refuses it (before any 409).
		rec = serve(t, bundle.router, jsonRequest(t, "/v1/auth/register", map[string]string{"email": "josé@example.com", "password": "correct horse battery"}))
		decodeProblem(t, rec, http.StatusTooManyRequests)
		require.InDelta(t, 1, decisions(t, bundle.registry, "register", "email", "refused"), 0)

		// forgot-password answers an email-rule refusal like an admission; the metric tells.
		rec = serve(t, bundle.router, jsonRequest(t, "/v1/auth/forgot-password", map[string]string{"email": "JOS\u00c9@EXAMPLE.COM"}))
		require.Equal(t, http.StatusAccepted, rec.Code)
		rec = serve(t, bundle.router, jsonRequest(t, "/v1/auth/forgot-password", map[string]string{"email": "\tjos\u0065\u0301@example.com"}))
		require.Equal(t, http.StatusAccepted, rec.Code)
		require.InDelta(t, 1, decisions(t, bundle.registry, "forgot_password", "email", "refused"), 0)
	})
}

func TestServer_UniformAnswers(t *testing.T) {
	t.Parallel()

	// A fixed clock for the limiter, so RateLimit's t= is the same for every request.
	now := time.Now()
	nowFunc := func() time.Time { return now }

	// answer sends body from a fresh IP (so each request starts its own IP bucket) and returns
	// what must be identical: status, headers without X-Request-Id, and body.
	answer := func(t *testing.T, bundle *testBundle, path, email, ip string) (int, http.Header, string, time.Duration) {
		t.Helper()
		req := jsonRequest(t, path, map[string]string{"email": email})
		req.RemoteAddr = ip + ":4321"
		start := time.Now()
		rec := serve(t, bundle.router, req)
		elapsed := time.Since(start)
		h := rec.Header().Clone()
		require.NotEmpty(t, h.Get(requestIDHeader))
		h.Del(requestIDHeader)
		h.Del("Date")
		return rec.Code, h, rec.Body.String(), elapsed
	}

	dbtest.Engines(t, func(t *testing.T, newStore dbtest.NewStoreFunc) {
		t.Run("ForgotPassword", func(t *testing.T) {
			t.Parallel()
			bundle := setup(t, newStore(t), &setupOpts{limiterNow: nowFunc})
			insertUser(t, bundle.store, "known@example.com", false)

			knownStatus, knownHeader, knownBody, _ := answer(t, bundle, "/v1/auth/forgot-password", "known@example.com", "192.0.2.10")
			unknownStatus, unknownHeader, unknownBody, elapsed := answer(t, bundle, "/v1/auth/forgot-password", "unknown@example.com", "192.0.2.11")

			require.Equal(t, http.StatusAccepted, knownStatus)
			require.Equal(t, knownStatus, unknownStatus)
			require.Equal(t, knownHeader, unknownHeader)
			require.Equal(t, knownBody, unknownBody)
			require.GreaterOrEqual(t, elapsed, uniform.AnswerMin, "an unknown email must not answer sooner")

			require.Equal(t, 1, jobCount(t, bundle.store, "password_reset_email"))
		})

		t.Run("ResendVerification", func(t *testing.T) {
			t.Parallel()
			bundle := setup(t, newStore(t), &setupOpts{limiterNow: nowFunc})
			insertUser(t, bundle.store, "unverified@example.com", false)
			insertUser(t, bundle.store, "verified@example.com", true)

			status1, header1, body1, _ := answer(t, bundle, "/v1/auth/resend-verification", "unverified@example.com", "192.0.2.20")
			status2, header2, body2, elapsed2 := answer(t, bundle, "/v1/auth/resend-verification", "verified@example.com", "192.0.2.21")
			status3, header3, body3, elapsed3 := answer(t, bundle, "/v1/auth/resend-verification", "nobody@example.com", "192.0.2.22")

			require.Equal(t, http.StatusAccepted, status1)
			require.Equal(t, status1, status2)
			require.Equal(t, status1, status3)
			require.Equal(t, header1, header2)
			require.Equal(t, header1, header3)
			require.Equal(t, body1, body2)
			require.Equal(t, body1, body3)
			require.GreaterOrEqual(t, elapsed2, uniform.AnswerMin)
			require.GreaterOrEqual(t, elapsed3, uniform.AnswerMin)

			// Only the unverified user got a verification email.
			result, err := bundle.store.Jobs().JobList(t.Context(), river.NewJobListParams().Kinds("verification_email"))
			require.NoError(t, err)
			require.Len(t, result.Jobs, 1)
			unverified, err := bundle.store.UserGetByEmail(t.Context(), "unverified@example.com")
			require.NoError(t, err)
			require.JSONEq(t, `{"user_id":`+itoa(unverified.ID)+`}`, string(result.Jobs[0].EncodedArgs))
		})
	})
}

// insertUser inserts a user directly (no jobs), verified or not, and returns it.
func insertUser(t testing.TB, store riverstore.Store, email string, verified bool) *db.User {
	t.Helper()
	user, err := store.UserInsert(t.Context(), &db.UserInsertParams{Email: email, PasswordHash: "$argon2id$v=19$m=19456,t=2,p=1$x$y", Now: time.Now()})
	require.NoError(t, err)
	if verified {
		_, err = store.UserMarkEmailVerified(t.Context(), user.ID, time.Now())
		require.NoError(t, err)
		user, err = store.UserGetByID(t.Context(), user.ID)
		require.NoError(t, err)
	}
	return user
}

func itoa(i int64) string { return strconv.FormatInt(i, 10) }
