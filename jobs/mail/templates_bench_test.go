package mail

import (
	"testing"
	"time"
)

func BenchmarkRender(b *testing.B) {
	b.Run("Welcome", func(b *testing.B) {
		data := &WelcomeData{Name: "Ada <Lovelace>", AppURL: "https://example.com", UnsubscribeURL: "https://example.com/v1/unsubscribe?token=1.abc"}
		b.ReportAllocs()
		for b.Loop() {
			if _, _, _, err := RenderWelcome(data); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("Verification", func(b *testing.B) {
		data := &VerificationData{Name: "Ada", VerifyURL: "https://example.com/v1/auth/verify-email?token=abc", ExpiresIn: 24 * time.Hour}
		b.ReportAllocs()
		for b.Loop() {
			if _, _, _, err := RenderVerification(data); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("PasswordReset", func(b *testing.B) {
		data := &PasswordResetData{Name: "Ada", ResetURL: "https://example.com/v1/auth/reset-password?token=abc", ExpiresIn: time.Hour}
		b.ReportAllocs()
		for b.Loop() {
			if _, _, _, err := RenderPasswordReset(data); err != nil {
				b.Fatal(err)
			}
		}
	})
}
