package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/postguard/postguard/api/abuse"
	"github.com/postguard/postguard/cmd/internal/service"
	"github.com/postguard/postguard/jobs/mail"
)

// envFunc is env as an environment, in os.Environ's form.
func envFunc(env map[string]string) []string {
	environ := make([]string, 0, len(env))
	for k, v := range env {
		environ = append(environ, k+"="+v)
	}
	return environ
}

func TestLoadConfig(t *testing.T) {
	t.Parallel()

	t.Run("EmbeddedDefaults", func(t *testing.T) {
		t.Parallel()

		cfg, err := loadConfig(envFunc(nil))
		require.NoError(t, err)
		require.Equal(t, service.EngineSQLite, cfg.Engine)
		require.Equal(t, "postguard.db", cfg.SQLitePath)
		require.Equal(t, ":8080", cfg.HTTPAddr)
		require.Equal(t, "http://localhost:8080", cfg.AppURL)
		require.Nil(t, cfg.AppSecret, "the embedded default keeps a generated secret beside its database")
		require.Equal(t, []string{service.MailerLog}, cfg.Mailers)
		require.Nil(t, cfg.SMTPURL)
		require.InDelta(t, 2.0, cfg.SMTPMaxRPS, 0)
		require.Equal(t, 336*time.Hour, cfg.JobRetention)
		require.Equal(t, 24*time.Hour, cfg.CounterRetention)
		require.Equal(t, 2160*time.Hour, cfg.DeviceTokenTTL)
		require.Equal(t, time.Hour, cfg.PruneInterval)
		require.Equal(t, time.Minute, cfg.CounterPruneInterval)
		require.Equal(t, 10*time.Second, cfg.ShutdownTimeout)
		require.InDelta(t, 2.0, cfg.ResendMaxRPS, 0)
		require.Equal(t, 10, cfg.EmailWorkers)
		require.Equal(t, 30*time.Second, cfg.JobTimeout)
		require.Equal(t, 5*time.Minute, cfg.JobRescueAfter)
		require.Equal(t, "text", cfg.LogFormat)
		require.Empty(t, cfg.TrustedProxies)
		require.Equal(t, abuse.DefaultRules().All(), cfg.Rules.All())
		require.Equal(t, "127.0.0.1:9464", cfg.MetricsAddr)
		require.Equal(t, abuse.HeaderXForwardedFor, cfg.ClientIPHeader)
		require.Empty(t, cfg.ResendWebhookSecret, "the webhook is not mounted")
		require.Empty(t, cfg.AdminToken, "the admin API is not mounted")
		require.Equal(t, "postguard", cfg.AppName)
		require.Equal(t, "en", cfg.DefaultLocale)
		require.Empty(t, cfg.MailTemplatesDir)
		require.NotNil(t, cfg.Renderer)
		require.Equal(t, []string{"en"}, cfg.Renderer.Locales())
		require.Equal(t, "http://localhost:8080", cfg.LoginURL, "APP_LOGIN_URL defaults to APP_URL")
		require.Equal(t, mail.DefaultBrandColor, cfg.BrandColor)
		require.Empty(t, cfg.LogoURL)
	})

	t.Run("Brand", func(t *testing.T) {
		t.Parallel()

		cfg, err := loadConfig(envFunc(map[string]string{
			"APP_URL":         "https://auth.acme.example",
			"APP_LOGIN_URL":   "https://acme.example/login?next=%2F",
			"APP_BRAND_COLOR": "#0F766E",
			"APP_LOGO_URL":    "https://cdn.acme.example/logo.svg",
		}))
		require.NoError(t, err)
		require.Equal(t, "https://acme.example/login?next=%2F", cfg.LoginURL)
		require.Equal(t, "#0f766e", cfg.BrandColor)
		require.Equal(t, "https://cdn.acme.example/logo.svg", cfg.LogoURL)

		page, err := cfg.Renderer.RenderPageSample(mail.PagePasswordChanged, "")
		require.NoError(t, err)
		require.Contains(t, page.HTML, `href="https://acme.example/login?next=%2F"`)
		require.Contains(t, page.HTML, "background: #0f766e;")
		require.Contains(t, page.HTML, `src="https://cdn.acme.example/logo.svg" alt="postguard"`)
		welcome, err := cfg.Renderer.RenderSample(mail.KindWelcome, "")
		require.NoError(t, err)
		require.Contains(t, welcome.HTML, "background-color:#0f766e;")
		require.Contains(t, welcome.HTML, `src="https://cdn.acme.example/logo.svg"`)
	})

	t.Run("Mail", func(t *testing.T) {
		t.Parallel()

		dir := t.TempDir()
		require.NoError(t, os.WriteFile(filepath.Join(dir, "welcome.de.txt"), []byte(`{{define "subject"}}Willkommen bei {{.AppName}}{{end}}{{define "content"}}Hallo{{end}}{{define "footer"}}{{.UnsubscribeURL}}{{end}}`), 0o600))
		cfg, err := loadConfig(envFunc(map[string]string{"APP_NAME": " Acme ", "DEFAULT_LOCALE": "en-gb", "MAIL_TEMPLATES_DIR": dir}))
		require.NoError(t, err)
		require.Equal(t, "Acme", cfg.AppName)
		require.Equal(t, "en-GB", cfg.DefaultLocale)
		require.Equal(t, dir, cfg.MailTemplatesDir)
		require.Equal(t, []string{"en-GB", "de"}, cfg.Renderer.Locales())
		got, err := cfg.Renderer.RenderSample(mail.KindWelcome, "de-AT")
		require.NoError(t, err)
		require.Equal(t, "Willkommen bei Acme", got.Subject)
	})

	t.Run("DeliveryFeedback", func(t *testing.T) {
		t.Parallel()

		cfg, err := loadConfig(envFunc(map[string]string{
			"RESEND_WEBHOOK_SECRET": "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
			"ADMIN_TOKEN":           strings.Repeat("t", 32),
		}))
		require.NoError(t, err)
		require.Equal(t, "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", cfg.ResendWebhookSecret)
		require.Equal(t, strings.Repeat("t", 32), cfg.AdminToken)
	})

	t.Run("ClientIPHeader", func(t *testing.T) {
		t.Parallel()

		for value, want := range map[string]abuse.ClientIPHeader{"X-Forwarded-For": abuse.HeaderXForwardedFor, "X-Real-IP": abuse.HeaderXRealIP, "x-real-ip": abuse.HeaderXRealIP} {
			cfg, err := loadConfig(envFunc(map[string]string{"CLIENT_IP_HEADER": value}))
			require.NoError(t, err, value)
			require.Equal(t, want, cfg.ClientIPHeader, value)
		}
	})

	t.Run("MetricsAddr", func(t *testing.T) {
		t.Parallel()

		for value, want := range map[string]string{"off": "", ":9100": ":9100", "[::1]:9464": "[::1]:9464"} {
			cfg, err := loadConfig(envFunc(map[string]string{"METRICS_ADDR": value}))
			require.NoError(t, err, value)
			require.Equal(t, want, cfg.MetricsAddr, value)
		}
	})

	t.Run("SQLitePathVerbatim", func(t *testing.T) {
		t.Parallel()

		cfg, err := loadConfig(envFunc(map[string]string{"DATABASE_URL": "sqlite:///var/lib/postguard/data.db"}))
		require.NoError(t, err)
		require.Equal(t, "/var/lib/postguard/data.db", cfg.SQLitePath)
	})

	t.Run("Postgres", func(t *testing.T) {
		t.Parallel()

		cfg, err := loadConfig(envFunc(map[string]string{
			"DATABASE_URL":      "postgresql://app@db.internal:5432/postguard",
			"APP_SECRET":        strings.Repeat("s", 32),
			"RESEND_API_KEY":    "re_123",
			"RESEND_FROM_EMAIL": "hello@example.com",
			"TRUSTED_PROXIES":   "10.0.0.0/8, 192.168.1.1",
		}))
		require.NoError(t, err)
		require.Equal(t, service.EnginePostgres, cfg.Engine)
		require.Equal(t, []string{service.MailerResend}, cfg.Mailers, "a Resend key selects the Resend mailer")
		require.Equal(t, "hello@example.com", cfg.MailFrom, "RESEND_FROM_EMAIL is every provider's sender")
		require.Len(t, cfg.TrustedProxies, 2)
	})

	t.Run("SMTP", func(t *testing.T) {
		t.Parallel()

		cfg, err := loadConfig(envFunc(map[string]string{
			"SMTP_URL":     "smtps://postguard%40example.com:p%40ss@smtp.example.com",
			"SMTP_MAX_RPS": "14",
			"MAIL_FROM":    "Acme <no-reply@acme.example>",
		}))
		require.NoError(t, err)
		require.Equal(t, []string{service.MailerSMTP}, cfg.Mailers, "an SMTP_URL selects SMTP")
		require.Equal(t, &mail.SMTPURL{Scheme: mail.SMTPSchemeTLS, Host: "smtp.example.com", Port: 465, Username: "postguard@example.com", Password: "p@ss"}, cfg.SMTPURL)
		require.InDelta(t, 14.0, cfg.SMTPMaxRPS, 0)
		require.Equal(t, "Acme <no-reply@acme.example>", cfg.MailFrom)
	})

	t.Run("Failover", func(t *testing.T) {
		t.Parallel()

		env := map[string]string{
			"RESEND_API_KEY":    "re_1",
			"RESEND_FROM_EMAIL": "resend@acme.example",
			"MAIL_FROM":         "Acme <no-reply@acme.example>",
			"SMTP_URL":          "smtp://relay.example.com",
		}
		cfg, err := loadConfig(envFunc(env))
		require.NoError(t, err)
		require.Equal(t, []string{service.MailerResend, service.MailerSMTP}, cfg.Mailers, "both configured: Resend first")
		require.Equal(t, "Acme <no-reply@acme.example>", cfg.MailFrom, "MAIL_FROM wins over RESEND_FROM_EMAIL")

		env["MAILER"] = " smtp , resend "
		cfg, err = loadConfig(envFunc(env))
		require.NoError(t, err)
		require.Equal(t, []string{service.MailerSMTP, service.MailerResend}, cfg.Mailers, "any order")

		env["MAILER"] = "none"
		cfg, err = loadConfig(envFunc(env))
		require.NoError(t, err)
		require.Empty(t, cfg.Mailers)
	})

	t.Run("PostgresWithoutMailerHoldsMail", func(t *testing.T) {
		t.Parallel()

		cfg, err := loadConfig(envFunc(map[string]string{
			"DATABASE_URL": "postgres://app@db/postguard",
			"APP_SECRET":   strings.Repeat("s", 32),
		}))
		require.NoError(t, err)
		require.Empty(t, cfg.Mailers)
	})

	t.Run("RateLimitOverride", func(t *testing.T) {
		t.Parallel()

		cfg, err := loadConfig(envFunc(map[string]string{"RATE_LIMIT_FORGOT_PASSWORD_EMAIL": "7/2h", "RATE_LIMIT_RESET_PASSWORD_IP": "20/1h"}))
		require.NoError(t, err)
		forgot, ok := cfg.Rules.Get(abuse.ActionForgotPassword, abuse.ScopeEmail)
		require.True(t, ok)
		require.Equal(t, int64(7), forgot.Limit)
		require.Equal(t, 2*time.Hour, forgot.Window)
		reset, ok := cfg.Rules.Get(abuse.ActionResetPassword, abuse.ScopeIP)
		require.True(t, ok)
		require.Equal(t, int64(20), reset.Limit)
		require.Equal(t, time.Hour, reset.Window)
	})

	t.Run("CustomRateLimits", func(t *testing.T) {
		t.Parallel()

		cfg, err := loadConfig(envFunc(map[string]string{"RATE_LIMIT_LOGIN_KEY": "5/15m", "RATE_LIMIT_LOGIN_IP": "20/15m", "RATE_LIMIT_REGISTER_IP": "9/1h"}))
		require.NoError(t, err)
		require.Equal(t, []abuse.Rule{
			{Action: "login", Scope: abuse.ScopeIP, Limit: 20, Window: 15 * time.Minute},
			{Action: "login", Scope: abuse.ScopeKey, Limit: 5, Window: 15 * time.Minute},
		}, cfg.Rules.All()[len(abuse.DefaultRules().All()):])
		register, _ := cfg.Rules.Get(abuse.ActionRegister, abuse.ScopeIP)
		require.Equal(t, int64(9), register.Limit)
	})

	t.Run("DeviceTokenTTL", func(t *testing.T) {
		t.Parallel()

		cfg, err := loadConfig(envFunc(map[string]string{"DEVICE_TOKEN_TTL": "720h"}))
		require.NoError(t, err)
		require.Equal(t, 30*24*time.Hour, cfg.DeviceTokenTTL)
	})

	t.Run("Counters", func(t *testing.T) {
		t.Parallel()

		cfg, err := loadConfig(envFunc(map[string]string{"COUNTER_RETENTION": "1m", "COUNTER_PRUNE_INTERVAL": "15s"}))
		require.NoError(t, err)
		require.Equal(t, time.Minute, cfg.CounterRetention)
		require.Equal(t, 15*time.Second, cfg.CounterPruneInterval)
		cfg, err = loadConfig(envFunc(map[string]string{"COUNTER_PRUNE_INTERVAL": "1h"}))
		require.NoError(t, err)
		require.Equal(t, time.Hour, cfg.CounterPruneInterval)
	})

	t.Run("LimitsToken", func(t *testing.T) {
		t.Parallel()

		cfg, err := loadConfig(envFunc(nil))
		require.NoError(t, err)
		require.Empty(t, cfg.LimitsToken, "unset: no limits API")
		token := strings.Repeat("t", 32)
		cfg, err = loadConfig(envFunc(map[string]string{"LIMITS_API_TOKEN": token}))
		require.NoError(t, err)
		require.Equal(t, token, cfg.LimitsToken)
	})

	// Every bad value stops the process with a message that names its variable.
	for _, tt := range []struct {
		name string
		env  map[string]string
		want string
	}{
		{"RateLimit", map[string]string{"RATE_LIMIT_REGISTER_IP": "abc"}, "RATE_LIMIT_REGISTER_IP"},
		{"RateLimitZero", map[string]string{"RATE_LIMIT_RESEND_VERIFICATION_EMAIL": "0/1m"}, "RATE_LIMIT_RESEND_VERIFICATION_EMAIL"},
		{"RateLimitResetPassword", map[string]string{"RATE_LIMIT_RESET_PASSWORD_IP": "10"}, "RATE_LIMIT_RESET_PASSWORD_IP"},
		{"RateLimitCustomValue", map[string]string{"RATE_LIMIT_LOGIN_KEY": "5/15"}, `invalid RATE_LIMIT_LOGIN_KEY: "5/15": invalid rate limit`},
		{"RateLimitCustomScope", map[string]string{"RATE_LIMIT_LOGIN_ACCOUNT": "5/15m"}, `invalid RATE_LIMIT_LOGIN_ACCOUNT: "5/15m": unknown scope "ACCOUNT"`},
		{"RateLimitCustomName", map[string]string{"RATE_LIMIT_2FA_IP": "5/15m"}, `invalid RATE_LIMIT_2FA_IP: "5/15m": invalid action "2FA"`},
		{"RateLimitBuiltInScope", map[string]string{"RATE_LIMIT_REGISTER_KEY": "5/15m"}, "invalid RATE_LIMIT_REGISTER_KEY: \"5/15m\": the built-in action register counts by ip and email only"},
		{"LimitsTokenShort", map[string]string{"LIMITS_API_TOKEN": "short"}, "invalid LIMITS_API_TOKEN: is 5 bytes; it must be at least 32"},
		{"DatabaseURLScheme", map[string]string{"DATABASE_URL": "mysql://x"}, "DATABASE_URL"},
		{"DatabaseURLUnparsable", map[string]string{"DATABASE_URL": "postgres://%zz", "APP_SECRET": strings.Repeat("s", 32)}, "DATABASE_URL"},
		{"SQLiteNoPath", map[string]string{"DATABASE_URL": "sqlite://"}, "DATABASE_URL"},
		{"TrustedProxies", map[string]string{"TRUSTED_PROXIES": "10.0.0.0/33"}, "TRUSTED_PROXIES"},
		{"SecretRequiredOnPostgres", map[string]string{"DATABASE_URL": "postgres://db/x"}, "APP_SECRET"},
		{"SecretTooShort", map[string]string{"APP_SECRET": "short"}, "APP_SECRET"},
		{"Duration", map[string]string{"JOB_TIMEOUT": "soon"}, "JOB_TIMEOUT"},
		{"DeviceTokenTTLGarbage", map[string]string{"DEVICE_TOKEN_TTL": "90d"}, `invalid DEVICE_TOKEN_TTL: "90d" is not a duration of at least 1m0s`},
		{"DeviceTokenTTLShort", map[string]string{"DEVICE_TOKEN_TTL": "30s"}, "invalid DEVICE_TOKEN_TTL"},
		{"DeviceTokenTTLLong", map[string]string{"DEVICE_TOKEN_TTL": "1000000h"}, `invalid DEVICE_TOKEN_TTL: "1000000h" is not a whole number of seconds up to 87600h0m0s`},
		{"DeviceTokenTTLFraction", map[string]string{"DEVICE_TOKEN_TTL": "90m0.5s"}, "invalid DEVICE_TOKEN_TTL"},
		{"CounterRetentionZero", map[string]string{"COUNTER_RETENTION": "0s"}, `invalid COUNTER_RETENTION: "0s" is not a duration of at least 1m0s`},
		{"CounterRetentionShort", map[string]string{"COUNTER_RETENTION": "30s"}, "invalid COUNTER_RETENTION"},
		{"CounterPruneIntervalGarbage", map[string]string{"COUNTER_PRUNE_INTERVAL": "often"}, `invalid COUNTER_PRUNE_INTERVAL: "often" is not a duration of at least 1s`},
		{"CounterPruneIntervalShort", map[string]string{"COUNTER_PRUNE_INTERVAL": "500ms"}, "invalid COUNTER_PRUNE_INTERVAL"},
		{"CounterPruneIntervalLong", map[string]string{"COUNTER_PRUNE_INTERVAL": "61m"}, `invalid COUNTER_PRUNE_INTERVAL: "61m" is longer than 1h0m0s`},
		{"RescueNotAfterTimeout", map[string]string{"JOB_TIMEOUT": "5m", "JOB_RESCUE_AFTER": "1m"}, "JOB_RESCUE_AFTER"},
		{"FetchPollBelowCooldown", map[string]string{"JOB_FETCH_POLL_INTERVAL": "10ms"}, "JOB_FETCH_POLL_INTERVAL"},
		{"Workers", map[string]string{"EMAIL_WORKERS": "0"}, "EMAIL_WORKERS"},
		{"MaxRPS", map[string]string{"RESEND_MAX_RPS": "-1"}, "RESEND_MAX_RPS"},
		{"MaxRPSGarbage", map[string]string{"RESEND_MAX_RPS": "fast"}, "RESEND_MAX_RPS"},
		{"MaxRPSInfinite", map[string]string{"RESEND_MAX_RPS": "+Inf"}, "RESEND_MAX_RPS"},
		{"MaxRPSTooHigh", map[string]string{"RESEND_MAX_RPS": "1e9"}, "RESEND_MAX_RPS"},
		{"Mailer", map[string]string{"MAILER": "sendgrid"}, "invalid MAILER: \"sendgrid\" is not one of resend, smtp, log, none"},
		{"MailerTwice", map[string]string{"MAILER": "resend,resend", "RESEND_API_KEY": "re_1", "RESEND_FROM_EMAIL": "a@b.c"}, "invalid MAILER: names resend twice"},
		{"MailerLogCombined", map[string]string{"MAILER": "log,smtp", "SMTP_URL": "smtp://relay.example.com"}, "invalid MAILER: \"log,smtp\": log and none stand alone"},
		{"MailerNoneCombined", map[string]string{"MAILER": "resend,none", "RESEND_API_KEY": "re_1"}, "log and none stand alone"},
		{"MailerEmptyEntry", map[string]string{"MAILER": "resend,"}, "invalid MAILER: \"\" is not one of"},
		{"SMTPWithoutURL", map[string]string{"MAILER": "smtp", "MAIL_FROM": "a@b.c"}, "invalid SMTP_URL: required when MAILER names smtp"},
		{"SMTPWithoutFrom", map[string]string{"MAILER": "smtp", "SMTP_URL": "smtp://relay.example.com"}, "invalid MAIL_FROM: required when MAILER names resend or smtp"},
		{"SMTPFromNotAnAddress", map[string]string{"SMTP_URL": "smtp://relay.example.com", "MAIL_FROM": "postguard"}, "invalid MAIL_FROM: from address \"postguard\" is not an address"},
		{"SMTPFromResendNotAnAddress", map[string]string{"SMTP_URL": "smtp://relay.example.com", "RESEND_FROM_EMAIL": "postguard"}, "invalid RESEND_FROM_EMAIL: from address"},
		{"SMTPURLScheme", map[string]string{"SMTP_URL": "http://relay.example.com"}, "invalid SMTP_URL: the scheme must be smtps://"},
		{"SMTPURLPort", map[string]string{"SMTP_URL": "smtps://relay.example.com:0"}, "invalid SMTP_URL: the port must be"},
		{"SMTPURLInsecurePassword", map[string]string{"SMTP_URL": "smtp+insecure://u:p@relay.example.com"}, "invalid SMTP_URL: smtp+insecure:// would send the password in clear"},
		{"SMTPURLUnusedStillChecked", map[string]string{"MAILER": "log", "SMTP_URL": "smtp://relay.example.com/x"}, "invalid SMTP_URL: only scheme://"},
		{"SMTPMaxRPS", map[string]string{"SMTP_MAX_RPS": "-1"}, "invalid SMTP_MAX_RPS: must be 0 (unpaced)"},
		{"SMTPMaxRPSTooHigh", map[string]string{"SMTP_MAX_RPS": "1e9"}, "SMTP_MAX_RPS"},
		{"ResendWithoutFrom", map[string]string{"MAILER": "resend", "RESEND_API_KEY": "re_1"}, "RESEND_FROM_EMAIL"},
		{"ResendBaseURL", map[string]string{"RESEND_API_KEY": "re_1", "RESEND_FROM_EMAIL": "a@b.c", "RESEND_BASE_URL": "::"}, "RESEND_BASE_URL"},
		{"AppURL", map[string]string{"APP_URL": "localhost:8080"}, "APP_URL"},
		{"LogFormat", map[string]string{"LOG_FORMAT": "xml"}, "LOG_FORMAT"},
		{"LogLevel", map[string]string{"LOG_LEVEL": "loud"}, "LOG_LEVEL"},
		{"RiverUIHalf", map[string]string{"RIVERUI_USERNAME": "admin"}, "RIVERUI_PASSWORD"},
		{"MetricsAddr", map[string]string{"METRICS_ADDR": "localhost"}, "METRICS_ADDR"},
		{"ClientIPHeader", map[string]string{"CLIENT_IP_HEADER": "Forwarded"}, "CLIENT_IP_HEADER"},
		{"MetricsAddrPort", map[string]string{"METRICS_ADDR": "127.0.0.1:99999"}, "METRICS_ADDR"},
		{"WebhookSecretNoPrefix", map[string]string{"RESEND_WEBHOOK_SECRET": "MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"}, "RESEND_WEBHOOK_SECRET"},
		{"WebhookSecretNotBase64", map[string]string{"RESEND_WEBHOOK_SECRET": "whsec_not base64!"}, "RESEND_WEBHOOK_SECRET"},
		{"WebhookSecretAPIKey", map[string]string{"RESEND_WEBHOOK_SECRET": "re_123456789"}, "RESEND_WEBHOOK_SECRET"},
		{"AdminTokenShort", map[string]string{"ADMIN_TOKEN": strings.Repeat("t", 31)}, "ADMIN_TOKEN"},
		{"AppNameBlank", map[string]string{"APP_NAME": "   "}, "APP_NAME"},
		{"AppNameNewline", map[string]string{"APP_NAME": "Acme\nBcc: x"}, "APP_NAME"},
		{"AppNameLong", map[string]string{"APP_NAME": strings.Repeat("a", 101)}, "APP_NAME"},
		{"DefaultLocale", map[string]string{"DEFAULT_LOCALE": "english!"}, "DEFAULT_LOCALE"},
		{"MailTemplatesDirMissing", map[string]string{"MAIL_TEMPLATES_DIR": "/nonexistent/postguard-mail"}, "MAIL_TEMPLATES_DIR"},
		{"LoginURLRelative", map[string]string{"APP_LOGIN_URL": "/login"}, `invalid APP_LOGIN_URL: "/login" is not an absolute http(s) URL`},
		{"LoginURLScript", map[string]string{"APP_LOGIN_URL": "javascript:alert(1)"}, "invalid APP_LOGIN_URL"},
		{"BrandColorName", map[string]string{"APP_BRAND_COLOR": "teal"}, `invalid APP_BRAND_COLOR: "teal" is not a colour of the form #rrggbb`},
		{"BrandColorTooLight", map[string]string{"APP_BRAND_COLOR": "#fde047"}, "invalid APP_BRAND_COLOR: #fde047 gives links a contrast of 1.31:1 on white, under the 4.5:1 that WCAG AA asks of text; a darker shade such as #867625 reaches it"},
		{"LogoURLRelative", map[string]string{"APP_LOGO_URL": "logo.png"}, "invalid APP_LOGO_URL"},
		{"LogoURLData", map[string]string{"APP_LOGO_URL": "data:image/png;base64,AAAA"}, "invalid APP_LOGO_URL"},
	} {
		t.Run("Invalid"+tt.name, func(t *testing.T) {
			t.Parallel()

			_, err := loadConfig(envFunc(tt.env))
			require.Error(t, err)
			require.Contains(t, err.Error(), tt.want)
		})
	}

	// Each secret grants its own power; one value for two would hand a holder of the weaker the
	// stronger (River UI's password travels with every request of a browser, in basic auth).
	t.Run("SecretsDiffer", func(t *testing.T) {
		t.Parallel()

		a, b := strings.Repeat("a", 32), strings.Repeat("b", 32)
		for _, tt := range []struct {
			env  map[string]string
			want []string
		}{
			{map[string]string{"ADMIN_TOKEN": a, "LIMITS_API_TOKEN": a}, []string{"invalid LIMITS_API_TOKEN: must differ from ADMIN_TOKEN"}},
			{map[string]string{"ADMIN_TOKEN": a, "RIVERUI_USERNAME": "ops", "RIVERUI_PASSWORD": a}, []string{"invalid RIVERUI_PASSWORD: must differ from ADMIN_TOKEN"}},
			{map[string]string{"LIMITS_API_TOKEN": a, "RIVERUI_USERNAME": "ops", "RIVERUI_PASSWORD": a}, []string{"invalid RIVERUI_PASSWORD: must differ from LIMITS_API_TOKEN"}},
			{map[string]string{"APP_SECRET": a, "ADMIN_TOKEN": a}, []string{"invalid ADMIN_TOKEN: must differ from APP_SECRET"}},
			{map[string]string{"ADMIN_TOKEN": a, "LIMITS_API_TOKEN": a, "RIVERUI_USERNAME": "ops", "RIVERUI_PASSWORD": a}, []string{
				"invalid LIMITS_API_TOKEN: must differ from ADMIN_TOKEN",
				"invalid RIVERUI_PASSWORD: must differ from ADMIN_TOKEN",
				"invalid RIVERUI_PASSWORD: must differ from LIMITS_API_TOKEN",
			}},
		} {
			_, err := loadConfig(envFunc(tt.env))
			require.Error(t, err, tt.env)
			for _, want := range tt.want {
				require.ErrorContains(t, err, want)
			}
			require.NotContains(t, err.Error(), a, "the message names the variables, never their value")
		}

		cfg, err := loadConfig(envFunc(map[string]string{"APP_SECRET": strings.Repeat("s", 32), "ADMIN_TOKEN": a, "LIMITS_API_TOKEN": b, "RIVERUI_USERNAME": a, "RIVERUI_PASSWORD": "another long password"}))
		require.NoError(t, err)
		require.Equal(t, a, cfg.AdminToken)
	})

	t.Run("SMTPURLErrorNeverQuotesThePassword", func(t *testing.T) {
		t.Parallel()

		for _, raw := range []string{
			"smtp://user:Sup3r-Secret@relay.example.com:port",
			"smtp://user:Sup3r-Secret@relay.example.com:70000",
			"smtp://user:Sup3r-Secret%zz@relay.example.com",
			"ftp://user:Sup3r-Secret@relay.example.com",
			"smtp://user:Sup3r-Secret@relay.example.com/path",
			"smtp+insecure://user:Sup3r-Secret@relay.example.com",
		} {
			_, err := loadConfig(envFunc(map[string]string{"SMTP_URL": raw, "MAIL_FROM": "a@example.com"}))
			require.ErrorContains(t, err, "SMTP_URL", raw)
			require.NotContains(t, err.Error(), "Sup3r-Secret", raw)
		}
	})

	t.Run("ReportsEveryError", func(t *testing.T) {
		t.Parallel()

		_, err := loadConfig(envFunc(map[string]string{"JOB_TIMEOUT": "x", "LOG_FORMAT": "xml"}))
		require.ErrorContains(t, err, "JOB_TIMEOUT")
		require.ErrorContains(t, err, "LOG_FORMAT")
	})
}
