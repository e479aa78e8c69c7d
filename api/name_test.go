package api

import (
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestCheckName(t *testing.T) {
	t.Parallel()

	for _, tt := range []struct {
		name string
		in   string
		ok   bool
		want string // the stored name, when ok
	}{
		// Names, dots and all.
		{"Empty", "", true, ""},
		{"Plain", "Ada Lovelace", true, "Ada Lovelace"},
		{"Trimmed", "  Ada  ", true, "Ada"},
		{"Initials", "J. R. R. Tolkien", true, "J. R. R. Tolkien"},
		{"InitialsNoSpaces", "J.R.R. Tolkien", true, "J.R.R. Tolkien"},
		{"Title", "Dr. Ada", true, "Dr. Ada"},
		{"TrailingDot", "Ada Lovelace Jr.", true, "Ada Lovelace Jr."},
		{"DotBetweenNames", "Ada.Lovelace", true, "Ada.Lovelace"},
		{"Apostrophe", "Seán O'Brien-Murphy", true, "Seán O'Brien-Murphy"},
		{"NonLatin", "山田 太郎", true, "山田 太郎"},
		{"Arabic", "محمد بن موسى", true, "محمد بن موسى"},
		{"Accents", "Zoë Ångström", true, "Zoë Ångström"},
		{"Emoji", "Ada 🚀", true, "Ada 🚀"},
		{"Colon", "Ada: the first programmer", true, "Ada: the first programmer"},
		{"Hundred", strings.Repeat("é", 100), true, strings.Repeat("é", 100)},
		{"NoBreakSpace", "Ada\u00a0Lovelace", true, "Ada\u00a0Lovelace"},

		// Too long.
		{"HundredAndOne", strings.Repeat("a", 101), false, ""},

		// URLs.
		{"URL", "URGENT: restore access at https://evil.example", false, ""},
		{"URLNoPath", "http://evil", false, ""},
		{"FullwidthURL", "ｈｔｔｐｓ：／／evil", false, ""},
		{"SchemeOnly", "javascript:alert(1)", false, ""},
		{"Mailto", "write to mailto:boss", false, ""},
		{"Tel", "call tel:+15550100", false, ""},
		{"WWW", "visit www.evil", false, ""},

		// Email addresses.
		{"Email", "ada@example.com", false, ""},
		{"EmailInText", "reply to boss at evil dot com @ once", false, ""},
		{"FullwidthAt", "ada＠example", false, ""},

		// Domain names.
		{"ReservedDomain", "evil.example", false, ""},
		{"WWWDomain", "www.x.co", false, ""},
		{"DotCom", "paypal.com", false, ""},
		{"DomainInText", "Ada, see paypal.com/verify now", false, ""},
		{"DomainUpperCase", "PAYPAL.COM", false, ""},
		{"Subdomain", "login.paypal.com.evil.net", false, ""},
		{"CountryCode", "bank.co.uk", false, ""},
		{"TrailingDotDomain", "paypal.com.", false, ""},
		{"InParentheses", "Ada (paypal.com)", false, ""},
		{"FullwidthDots", "paypal．com", false, ""},
		{"IdeographicDot", "paypal。com", false, ""},
		{"FullwidthLetters", "ｐａｙｐａｌ．ｃｏｍ", false, ""},
		{"IDNTLD", "пример.рф", false, ""},
		{"Punycode", "xn--80ak6aa92e.com", false, ""},
		{"IPv4", "go to 203.0.113.9 now", false, ""},
		{"LocalTLD", "printer.local", false, ""},

		// Characters that hide or reorder text (Cc, Cf, Zl, Zp).
		{"RightToLeftOverride", "Ada \u202eevil", false, ""},
		{"PhishingWithOverride", "URGENT\u202e: restore access", false, ""},
		{"ZeroWidthSpace", "Ada\u200bLovelace", false, ""},
		{"ZeroWidthJoiner", "Ada\u200d", false, ""},
		{"SoftHyphen", "Ada\u00adLovelace", false, ""},
		{"BOM", "\ufeffAda", false, ""},
		{"Bell", "a\u0007b", false, ""},
		{"Tab", "Ada\tLovelace", false, ""},
		{"Newline", "Ada\nURGENT", false, ""},
		{"CarriageReturn", "Ada\rURGENT", false, ""},
		{"LineSeparator", "Ada\u2028URGENT", false, ""},
		{"ParagraphSeparator", "Ada\u2029URGENT", false, ""},
		{"NUL", "Ada\x00", false, ""},
		{"InvalidUTF8", "Ada\xff", false, ""},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()

			var fieldErrs []fieldError
			got := checkName(tt.in, &fieldErrs)
			if tt.ok {
				require.Empty(t, fieldErrs, "%q", tt.in)
				require.Equal(t, tt.want, got)
				return
			}
			require.Len(t, fieldErrs, 1, "%q was accepted", tt.in)
			require.Equal(t, "#/name", fieldErrs[0].Pointer)
			require.NotEmpty(t, fieldErrs[0].Detail)
			require.Empty(t, got)
		})
	}
}

// A name that would carry a phishing message into mail sent to an address nobody verified is
// refused at register, and nothing is written.
func TestServer_RegisterRefusesMessageInName(t *testing.T) {
	t.Parallel()

	bundle := newSQLiteBundle(t, nil)
	for _, name := range []string{
		"URGENT: restore access at https://evil.example",
		"Ada \u202eelpmaxe.live",
		"Ada, call paypal.com",
		strings.Repeat("n", maxNameLen+1),
	} {
		email := uniqueEmail("name")
		rec := serve(t, bundle.router, jsonRequest(t, "/v1/auth/register", map[string]string{"email": email, "password": "correct horse battery", "name": name}))
		problem := decodeProblem(t, rec, http.StatusUnprocessableEntity)
		errs := problem["errors"].([]any)
		require.Len(t, errs, 1)
		require.Equal(t, "#/name", errs[0].(map[string]any)["pointer"])
		_, err := bundle.store.UserGetByEmail(t.Context(), email)
		require.Error(t, err, "a user was created")
	}
	require.Equal(t, 0, jobCount(t, bundle.store, ""))
	require.Zero(t, bundle.consumer.calls.Load(), "a refused name spent rate-limit allowance")

	// An ordinary name with dots goes through.
	rec := serve(t, bundle.router, jsonRequest(t, "/v1/auth/register", map[string]string{"email": uniqueEmail("name"), "password": "correct horse battery", "name": "J. R. R. Tolkien"}))
	require.Equal(t, http.StatusCreated, rec.Code, rec.Body.String())
}
