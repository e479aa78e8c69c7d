package mail

import (
	"flag"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/stretchr/testify/require"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata/ from the current templates")

// requireGolden compares got with testdata/name, or rewrites the file under
// -update.
func requireGolden(t *testing.T, name, got string) {
	t.Helper()

	path := filepath.Join("testdata", name)
	if *update {
		require.NoError(t, os.WriteFile(path, []byte(got), 0o600))
		return
	}

	want, err := os.ReadFile(path)
	require.NoError(t, err, "missing golden file; run go test ./jobs/mail -run TestRender -update")
	if diff := cmp.Diff(string(want), got); diff != "" {
		t.Fatalf("%s differs from the golden file (-want +got; run with -update to accept):\n%s", path, diff)
	}
}

func TestRender(t *testing.T) {
	t.Parallel()

	type rendered struct {
		subject, html, text string
	}

	for _, tt := range []struct {
		name        string
		file        string
		render      func() (string, string, string, error)
		wantSubject string
	}{
		{
			name: "PasswordReset",
			file: "password_reset",
			render: func() (string, string, string, error) {
				return RenderPasswordReset(&PasswordResetData{
					Name:     "Ada Lovelace",
					ResetURL: "http://localhost:8080/v1/auth/reset-password?token=cmVzZXQtdG9rZW4",
				})
			},
			wantSubject: "Reset your password",
		},
		{
			name: "Verification",
			file: "verification",
			render: func() (string, string, string, error) {
				return RenderVerification(&VerificationData{
					Name:      "Ada Lovelace",
					VerifyURL: "http://localhost:8080/v1/auth/verify-email?token=dmVyaWZ5LXRva2Vu",
				})
			},
			wantSubject: "Verify your email address",
		},
		{
			name: "Welcome",
			file: "welcome",
			render: func() (string, string, string, error) {
				return RenderWelcome(&WelcomeData{
					AppURL:         "http://localhost:8080",
					Name:           "Ada Lovelace",
					UnsubscribeURL: "http://localhost:8080/v1/unsubscribe?token=dW5zdWJzY3JpYmU",
				})
			},
			wantSubject: "Welcome aboard",
		},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()

			var (
				got rendered
				err error
			)
			got.subject, got.html, got.text, err = tt.render()
			require.NoError(t, err)

			require.Equal(t, tt.wantSubject, got.subject)
			requireGolden(t, tt.file+".html", got.html)
			requireGolden(t, tt.file+".txt", got.text)
		})
	}
}

func TestRenderWelcome(t *testing.T) {
	t.Parallel()

	t.Run("EscapesUserData", func(t *testing.T) {
		t.Parallel()

		_, html, text, err := RenderWelcome(&WelcomeData{
			AppURL:         "http://localhost:8080",
			Name:           "<script>alert(1)</script>",
			UnsubscribeURL: `javascript:alert(1)`,
		})
		require.NoError(t, err)

		require.NotContains(t, html, "<script>")
		require.Contains(t, html, "Hi &lt;script&gt;alert(1)&lt;/script&gt;,")
		require.NotContains(t, html, "javascript:", "an unsafe URL is neutralised in href")
		require.Contains(t, html, `href="#ZgotmplZ"`)

		// Plain text is not HTML: it shows the name as typed.
		require.Contains(t, text, "Hi <script>alert(1)</script>,")
	})

	t.Run("EscapesQueryInHref", func(t *testing.T) {
		t.Parallel()

		_, html, text, err := RenderWelcome(&WelcomeData{
			AppURL:         "http://localhost:8080",
			UnsubscribeURL: `http://localhost:8080/v1/unsubscribe?token=a"b&c=1`,
		})
		require.NoError(t, err)
		require.Contains(t, html, `href="http://localhost:8080/v1/unsubscribe?token=a%22b&amp;c=1"`)
		require.Contains(t, text, `Unsubscribe: http://localhost:8080/v1/unsubscribe?token=a"b&c=1`)
	})

	t.Run("GreetsThereWithoutName", func(t *testing.T) {
		t.Parallel()

		_, html, text, err := RenderWelcome(&WelcomeData{AppURL: "http://a", Name: "  ", UnsubscribeURL: "http://a/u"})
		require.NoError(t, err)
		require.Contains(t, html, "Hi there,")
		require.Contains(t, text, "Hi there,\n")
	})

	t.Run("RequiresURLs", func(t *testing.T) {
		t.Parallel()

		_, _, _, err := RenderWelcome(&WelcomeData{AppURL: "http://a"})
		require.ErrorContains(t, err, "UnsubscribeURL")
		_, _, _, err = RenderWelcome(nil)
		require.Error(t, err)
	})
}

func TestRenderVerification(t *testing.T) {
	t.Parallel()

	t.Run("ExpiresIn", func(t *testing.T) {
		t.Parallel()

		_, html, text, err := RenderVerification(&VerificationData{VerifyURL: "http://a/v", ExpiresIn: 48 * time.Hour})
		require.NoError(t, err)
		require.Contains(t, html, "This link expires in 2 days.")
		require.Contains(t, text, "This link expires in 2 days.")
	})

	t.Run("ExpiresInDefault", func(t *testing.T) {
		t.Parallel()

		_, _, text, err := RenderVerification(&VerificationData{VerifyURL: "http://a/v"})
		require.NoError(t, err)
		require.Contains(t, text, "This link expires in 24 hours.")
	})

	t.Run("RequiresURL", func(t *testing.T) {
		t.Parallel()

		_, _, _, err := RenderVerification(&VerificationData{Name: "Ada"})
		require.ErrorContains(t, err, "VerifyURL")
	})
}

func TestRenderPasswordReset(t *testing.T) {
	t.Parallel()

	t.Run("ExpiresInDefault", func(t *testing.T) {
		t.Parallel()

		_, html, text, err := RenderPasswordReset(&PasswordResetData{ResetURL: "http://a/r"})
		require.NoError(t, err)
		require.Contains(t, html, "This link expires in 1 hour.")
		require.Contains(t, text, "This link expires in 1 hour.")
	})

	t.Run("RequiresURL", func(t *testing.T) {
		t.Parallel()

		_, _, _, err := RenderPasswordReset(&PasswordResetData{Name: "Ada"})
		require.ErrorContains(t, err, "ResetURL")
	})
}

func TestFormatExpiry(t *testing.T) {
	t.Parallel()

	for _, tt := range []struct {
		in   time.Duration
		want string
	}{
		{time.Minute, "1 minute"},
		{30 * time.Minute, "30 minutes"},
		{90 * time.Minute, "90 minutes"},
		{90*time.Minute + time.Second, "91 minutes"},
		{time.Hour, "1 hour"},
		{2 * time.Hour, "2 hours"},
		{24 * time.Hour, "24 hours"},
		{36 * time.Hour, "36 hours"},
		{72 * time.Hour, "3 days"},
	} {
		require.Equal(t, tt.want, formatExpiry(tt.in), "formatExpiry(%s)", tt.in)
	}
}
