package api

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/stretchr/testify/require"

	"github.com/postguard/postguard/tokens"
)

// TestOpenAPI_RequestSchemas: the document's request schemas accept what the server accepts,
// and refuse what it refuses where a client would otherwise be misled: an empty or malformed
// address, a token of the wrong length or alphabet, a password or name out of bounds, a locale
// that is no language tag. Each body is sent to the server too, so the two cannot drift apart.
func TestOpenAPI_RequestSchemas(t *testing.T) {
	t.Parallel()

	doc, err := loadOpenAPI()
	require.NoError(t, err)
	bundle := newSQLiteBundle(t, &setupOpts{rules: loginRules(), configFunc: func(config *Config) { config.LimitsToken = limitsToken }})

	// schemaAccepts validates body against the JSON request schema of method path.
	schemaAccepts := func(t *testing.T, method, path, body string) error {
		t.Helper()
		template, _ := matchPath(doc, path)
		item := doc.Paths.Value(template)
		require.NotNil(t, item, path)
		op := item.GetOperation(method)
		require.NotNil(t, op, "%s %s", method, path)
		media := op.RequestBody.Value.Content.Get(mediaJSON)
		require.NotNil(t, media, "%s %s takes JSON", method, path)
		var value any
		require.NoError(t, json.Unmarshal([]byte(body), &value), body)
		return media.Schema.Value.VisitJSON(value, openapi3.EnableJSONSchema2020())
	}
	send := func(t *testing.T, method, path, body string) int {
		t.Helper()
		req := jsonRequest(t, path, body)
		req.Method = method
		if strings.HasPrefix(path, "/v1/limits/") {
			req.Header.Set("Authorization", "Bearer "+limitsToken)
		}
		return serve(t, bundle.router, req).Code
	}
	quote := func(s string) string {
		b, err := json.Marshal(s)
		require.NoError(t, err)
		return string(b)
	}
	register := func(email string, extra ...string) string {
		return `{"email":` + quote(email) + `,"password":"correct horse battery"` + strings.Join(extra, "") + `}`
	}
	token := tokens.New()

	for _, tt := range []struct {
		method, path string
		// accepted are bodies the server takes (its status is one of ok): the schema must too.
		accepted []string
		ok       []int
		// refused are bodies the server refuses with 400 or 422: the schema must too.
		refused []string
	}{
		{
			http.MethodPost, "/v1/auth/register",
			[]string{
				register("ada@example.com"),
				register("  Bob@Example.COM\t"),
				register("grace@bücher.de"),
				register("grace@bücher．fr"),
				register("a/b@example.com"),
				register("ada+news@example.com"),
				register(strings.Repeat("l", 64) + "@" + strings.Repeat("d", 63) + "." + strings.Repeat("e", 63) + ".com"),
				register("named@example.com", `,"name":"Ada Lovelace"`),
				register("longname@example.com", `,"name":`+quote(strings.Repeat("n", 100))),
				register("noname@example.com", `,"name":""`),
				register("fr@example.com", `,"locale":"fr"`),
				register("ptbr@example.com", `,"locale":"pt_br"`),
				register("zh@example.com", `,"locale":"zh-Hant-TW"`),
				register("x@example.com", `,"locale":"en-US-u-ca-gregory"`),
				register("nolocale@example.com", `,"locale":""`),
				`{"email":"short@example.com","password":"12345678"}`,
				`{"email":"long@example.com","password":` + quote(strings.Repeat("é", 256)) + `}`,
			},
			[]int{http.StatusCreated},
			[]string{
				register(""),
				register("   "),
				register("nope"),
				register("ada@"),
				register("@example.com"),
				register("ada@b@example.com"),
				register("ada lovelace@example.com"),
				register("Ada <ada@example.com>"),
				register(strings.Repeat("l", 250) + "@example.com"),
				`{"email":"ada@example.com"}`,
				`{"email":"ada@example.com","password":"short"}`,
				`{"email":"ada@example.com","password":` + quote(strings.Repeat("p", 257)) + `}`,
				register("ada@example.com", `,"name":`+quote(strings.Repeat("n", 101))),
				register("ada@example.com", `,"locale":"not a locale"`),
				register("ada@example.com", `,"locale":"en--US"`),
				register("ada@example.com", `,"locale":"toolongtag"`),
				register("ada@example.com", `,"locale":`+quote("en-"+strings.Repeat("abcdefgh-", 7)+"x")),
				register("ada@example.com", `,"admin":true`),
			},
		},
		{
			http.MethodPost, "/v1/auth/forgot-password",
			[]string{`{"email":"ada@example.com"}`, `{"email":" ADA@bücher.de "}`, `{"email":"a/b@example.com"}`},
			[]int{http.StatusAccepted},
			[]string{`{"email":""}`, `{"email":"nope"}`, `{"email":"a@b@c.de"}`, `{}`, `{"email":"ada@example.com","x":1}`},
		},
		{
			http.MethodPost, "/v1/auth/resend-verification",
			[]string{`{"email":"ada@example.com"}`, `{"email":"grace@bücher．de"}`},
			[]int{http.StatusAccepted},
			[]string{`{"email":""}`, `{"email":"@"}`, `{}`},
		},
		{
			// A well-formed token the database does not know is the server's 400 "invalid token",
			// not a malformed request: the schema takes every well-formed token.
			http.MethodPost, "/v1/auth/verify-email",
			[]string{`{"token":"` + token + `"}`, `{"token":"` + strings.Repeat("_", 43) + `"}`},
			[]int{http.StatusBadRequest},
			[]string{`{"token":""}`, `{"token":"` + token[:42] + `"}`, `{"token":"` + token + `A"}`, `{"token":"` + token[:42] + `="}`, `{"token":"` + token[:42] + `+"}`, `{}`},
		},
		{
			http.MethodPost, "/v1/auth/reset-password",
			[]string{`{"token":"` + token + `","password":"correct horse battery"}`},
			[]int{http.StatusBadRequest},
			[]string{
				`{"token":"` + token[:40] + `","password":"correct horse battery"}`,
				`{"token":"` + token + `","password":"short"}`,
				`{"token":"` + token + `","password":` + quote(strings.Repeat("p", 257)) + `}`,
				`{"token":"` + token + `"}`,
			},
		},
		{
			http.MethodPost, "/v1/limits/login",
			[]string{`{"ip":"198.51.100.7","key":"account-42"}`, `{"ip":"198.51.100.7","key":"account-42","email":""}`},
			[]int{http.StatusOK},
			[]string{`{"ip":"198.51.100.7","key":"account-42","email":"nope"}`, `{"ip":"198.51.100.7","key":` + quote(strings.Repeat("k", 257)) + `}`},
		},
		{
			http.MethodPost, "/v1/limits/newsletter",
			[]string{`{"ip":"198.51.100.7","email":"Ada@Bücher.de"}`},
			[]int{http.StatusOK},
			[]string{`{"ip":"198.51.100.7","email":"@bücher.de"}`},
		},
	} {
		t.Run(strings.TrimPrefix(tt.path, "/v1/"), func(t *testing.T) {
			for _, body := range tt.accepted {
				require.Contains(t, tt.ok, send(t, tt.method, tt.path, body), "the server takes %s", body)
				require.NoError(t, schemaAccepts(t, tt.method, tt.path, body), "the document takes %s", body)
			}
			for _, body := range tt.refused {
				require.Contains(t, []int{http.StatusBadRequest, http.StatusUnprocessableEntity}, send(t, tt.method, tt.path, body), "the server refuses %s", body)
				require.Error(t, schemaAccepts(t, tt.method, tt.path, body), "the document refuses %s", body)
			}
		})
	}

	// The query tokens of the links in mail, as the pages read them.
	for path, tt := range map[string]struct{ good, bad []string }{
		"/v1/auth/verify-email": {[]string{token}, []string{"", token[:42], token + "A", strings.Repeat("!", 43)}},
		"/v1/unsubscribe":       {[]string{tokens.Unsubscribe(testSecret, 42)}, []string{"", "42", "042." + token, "42." + token[:42], "x." + token, "0." + token}},
	} {
		param := doc.Paths.Value(path).Get.Parameters.GetByInAndName("query", "token")
		require.NotNil(t, param, path)
		for _, value := range tt.good {
			require.NoError(t, param.Schema.Value.VisitJSON(value, openapi3.EnableJSONSchema2020()), "%s takes %q", path, value)
		}
		for _, value := range tt.bad {
			require.Error(t, param.Schema.Value.VisitJSON(value, openapi3.EnableJSONSchema2020()), "%s refuses %q", path, value)
			rec := serve(t, bundle.router, httptest.NewRequest(http.MethodGet, path+"?token="+url.QueryEscape(value), nil))
			require.Equal(t, http.StatusBadRequest, rec.Code, "%s?token=%s", path, value)
		}
	}
}
