package api

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"net/mail"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/stretchr/testify/require"
	"golang.org/x/text/unicode/norm"

	"github.com/postguard/postguard/api/abuse"
	"github.com/postguard/postguard/db/dbtest"
)

func TestNormalizeEmail(t *testing.T) {
	t.Parallel()

	valid := []struct{ in, want string }{
		{"ada@example.com", "ada@example.com"},
		{"  Ada@Example.COM\t\n", "ada@example.com"},
		{"Jos\u0065\u0301@Example.com", "jos\u00e9@example.com"}, // NFD → NFC
		{"JOS\u00c9@example.com", "jos\u00e9@example.com"},
		{"a+tag@example.com", "a+tag@example.com"},
		{"first.last@sub.example.co.uk", "first.last@sub.example.co.uk"},
		{"a@x.io", "a@x.io"},
		// Domains in their ASCII form (IDNA, UTS #46): one mailbox, one spelling. The local
		// part stays as written (NFC, lower case).
		{"Ü@BÜCHER.de", "ü@xn--bcher-kva.de"},
		{"ada@bücher.de", "ada@xn--bcher-kva.de"},
		{"ada@xn--bcher-kva.de", "ada@xn--bcher-kva.de"},
		{"ada@XN--BCHER-KVA.DE", "ada@xn--bcher-kva.de"},
		{"ada@bu\u0308cher.de", "ada@xn--bcher-kva.de"}, // NFD
		{"ada@ｅxample.com", "ada@example.com"},          // fullwidth e
		{"ada@ｅｘａｍｐｌｅ．ｃｏｍ", "ada@example.com"},          // fullwidth letters and full stop
		{"ada@ⓔxample.com", "ada@example.com"},          // circled e
		{"ada@bücher。de", "ada@xn--bcher-kva.de"},       // ideographic full stop
		{"ada@straße.de", "ada@xn--strae-oqa.de"},       // non-transitional: ß is not ss
		{"ada@例え.テスト", "ada@xn--r8jz45g.xn--zckzah"},
		{strings.Repeat("a", 64) + "@" + strings.Repeat("b", 61) + "." + strings.Repeat("c", 61) + "." + strings.Repeat("d", 61) + ".com",
			strings.Repeat("a", 64) + "@" + strings.Repeat("b", 61) + "." + strings.Repeat("c", 61) + "." + strings.Repeat("d", 61) + ".com"}, // 254 bytes
	}
	for _, tt := range valid {
		got, err := NormalizeEmail(tt.in)
		require.NoError(t, err, "%q", tt.in)
		require.Equal(t, tt.want, got, "%q", tt.in)
	}

	invalid := []string{
		"",
		"   ",
		"ada",
		"@example.com",
		"ada@",
		"ada@@example.com",
		"a@b@example.com",
		"Ada <ada@example.com>",
		"<ada@example.com>",
		"ada@example.com (Ada)",
		`"ada lovelace"@example.com`,
		"ada lovelace@example.com",
		"ada@exa mple.com",
		"ada..l@example.com",
		".ada@example.com",
		"ada@example..com",
		"ada@example.com\x00",
		"ada\r\n@example.com",
		"ada@example.com, bob@example.com",
		"\xff@example.com",
		"\ufffd@example.com",
		"a\u00a0b@example.com",
		"a\u200bb@example.com",
		"a\u202eb@example.com",
		"a@exa\u3000mple.com",
		strings.Repeat("a", 64) + "@" + strings.Repeat("b", 62) + "." + strings.Repeat("c", 61) + "." + strings.Repeat("d", 61) + ".com", // 255 bytes
		strings.Repeat("a", 60) + "@" + strings.Repeat("ü", 62) + ".com",                                                                 // short in Unicode, over 254 bytes in ASCII
		// Address literals and dotless or numeric domains: not a domain anyone registered.
		"ada@[127.0.0.1]",
		"ada@[IPv6:::1]",
		"ada@example",
		"user@localhost",
		"ada@1.2.3.4",
		"ada@example.123",
		// What IDNA refuses: trailing or empty labels, non-LDH ASCII, bad hyphens and punycode,
		// over-long labels.
		"ada@example.com.",
		"ada@.example.com",
		"ada@exa_mple.com",
		"ada@-example.com",
		"ada@example-.com",
		"ada@ab--cd.com",
		"ada@xn--zz.com",
		"ada@" + strings.Repeat("b", 64) + ".com",
	}
	for _, in := range invalid {
		_, err := NormalizeEmail(in)
		require.ErrorIs(t, err, ErrInvalidEmail, "%q", in)
	}
}

func FuzzNormalizeEmail(f *testing.F) {
	for _, seed := range []string{
		"ada@example.com", "  Jos\u0065\u0301@Example.com ", "İ@example.com", "\"a\"@b", "a@[127.0.0.1]", "ǅ@x.y", "ß@x.y",
		"ada@bücher.de", "ada@xn--bcher-kva.de", "ada@ｅxample.com", "ada@example", "ada@straße.de", "ada@例え.テスト", "ada@1.2.3.4",
	} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, in string) {
		got, err := NormalizeEmail(in)
		if err != nil {
			require.ErrorIs(t, err, ErrInvalidEmail)
			return
		}
		// A normalised address is a fixed point, in NFC, lower case, trimmed, bounded, and
		// one plain address.
		again, err := NormalizeEmail(got)
		require.NoError(t, err, "%q normalised to %q, which does not normalise", in, got)
		require.Equal(t, got, again, "not idempotent on %q", in)
		require.True(t, utf8.ValidString(got))
		require.True(t, norm.NFC.IsNormalString(got))
		require.Equal(t, strings.TrimSpace(got), got)
		require.LessOrEqual(t, len(got), maxEmailBytes)
		require.Equal(t, 1, strings.Count(got, "@"))
		addr, err := mail.ParseAddress(got)
		require.NoError(t, err)
		require.Equal(t, got, addr.Address)
		// Its domain is ASCII, a registered kind of name (two labels or more, no literal), and
		// already what IDNA maps it to.
		domain := got[strings.IndexByte(got, '@')+1:]
		for i := range len(domain) {
			require.Less(t, domain[i], byte(utf8.RuneSelf), "domain %q of %q is not ASCII", domain, in)
		}
		require.Contains(t, domain, ".")
		require.NotContains(t, domain, "[")
		mapped, err := emailDomains.ToASCII(domain)
		require.NoError(t, err)
		require.Equal(t, domain, mapped)
	})
}

func BenchmarkNormalizeEmail(b *testing.B) {
	b.ReportAllocs()
	for b.Loop() {
		if _, err := NormalizeEmail("  Jos\u0065\u0301.Lovelace+tag@Example.COM "); err != nil {
			b.Fatal(err)
		}
	}
}

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
				ascii, err := NormalizeEmail(twins[1])
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
