package api

import (
	"net/mail"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/stretchr/testify/require"
	"golang.org/x/text/unicode/norm"
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
		{"user@localhost", "user@localhost"},
		{"Ü@BÜCHER.de", "ü@bücher.de"},
		{strings.Repeat("a", 64) + "@" + strings.Repeat("b", 185) + ".com", strings.Repeat("a", 64) + "@" + strings.Repeat("b", 185) + ".com"}, // 254 bytes
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
		strings.Repeat("a", 64) + "@" + strings.Repeat("b", 186) + ".com", // 255 bytes
	}
	for _, in := range invalid {
		_, err := NormalizeEmail(in)
		require.ErrorIs(t, err, ErrInvalidEmail, "%q", in)
	}
}

func FuzzNormalizeEmail(f *testing.F) {
	for _, seed := range []string{"ada@example.com", "  Jos\u0065\u0301@Example.com ", "İ@example.com", "\"a\"@b", "a@[127.0.0.1]", "ǅ@x.y", "ß@x.y"} {
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
