package mail

import (
	"testing"
	"time"
)

func BenchmarkRenderer_Render(b *testing.B) {
	renderer, err := NewRenderer(&RendererConfig{AppURL: "https://example.com"})
	if err != nil {
		b.Fatal(err)
	}
	for _, bb := range []struct {
		kind Kind
		data *Data
	}{
		{KindWelcome, &Data{Name: "Ada <Lovelace>", ActionURL: "https://example.com", UnsubscribeURL: "https://example.com/v1/unsubscribe?token=1.abc"}},
		{KindVerification, &Data{Name: "Ada", ActionURL: "https://example.com/v1/auth/verify-email?token=abc", ExpiresIn: 24 * time.Hour}},
		{KindPasswordReset, &Data{Name: "Ada", ActionURL: "https://example.com/v1/auth/reset-password?token=abc", ExpiresIn: time.Hour}},
	} {
		b.Run(string(bb.kind), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := renderer.Render(bb.kind, "", bb.data); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
