package email

import (
	"net/mail"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/stretchr/testify/require"
	"golang.org/x/text/unicode/norm"
)

func TestNormalize(t *testing.T) {
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
		got, err := Normalize(tt.in)
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
		_, err := Normalize(in)
		require.ErrorIs(t, err, ErrInvalid, "%q", in)
	}
}

func FuzzNormalize(f *testing.F) {
	for _, seed := range []string{
		"ada@example.com", "  Jos\u0065\u0301@Example.com ", "İ@example.com", "\"a\"@b", "a@[127.0.0.1]", "ǅ@x.y", "ß@x.y",
		"ada@bücher.de", "ada@xn--bcher-kva.de", "ada@ｅxample.com", "ada@example", "ada@straße.de", "ada@例え.テスト", "ada@1.2.3.4",
	} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, in string) {
		got, err := Normalize(in)
		if err != nil {
			require.ErrorIs(t, err, ErrInvalid)
			return
		}
		// A normalised address is a fixed point, in NFC, lower case, trimmed, bounded, and
		// one plain address.
		again, err := Normalize(got)
		require.NoError(t, err, "%q normalised to %q, which does not normalise", in, got)
		require.Equal(t, got, again, "not idempotent on %q", in)
		require.True(t, utf8.ValidString(got))
		require.True(t, norm.NFC.IsNormalString(got))
		require.Equal(t, strings.TrimSpace(got), got)
		require.LessOrEqual(t, len(got), MaxBytes)
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

func BenchmarkNormalize(b *testing.B) {
	b.ReportAllocs()
	for b.Loop() {
		if _, err := Normalize("  Jos\u0065\u0301.Lovelace+tag@Example.COM "); err != nil {
			b.Fatal(err)
		}
	}
}
