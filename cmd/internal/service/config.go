// Package service builds a postguard process from its checked configuration, in a straight line:
// the engine DATABASE_URL names, the secret, the store with its River client and postguard's
// workers, and the HTTP handler of the process's role. cmd/postguard reads the environment into
// a Config and runs what New builds; cmd/postguard-load builds the service it measures through
// New too, so that what it measures is what is deployed.
package service

import (
	"log/slog"
	"net/netip"
	"time"

	"github.com/postguard/postguard/api/abuse"
	"github.com/postguard/postguard/jobs/mail"
)

// Engines a DATABASE_URL can select.
const (
	EnginePostgres = "postgres"
	EngineSQLite   = "sqlite"
)

// Mailers MAILER can name: resend and smtp, alone or in a failover order (resend,smtp); log
// alone; none alone.
const (
	MailerResend = "resend"
	MailerSMTP   = "smtp"
	MailerLog    = "log"
	MailerNone   = "none"
)

// Config is everything a postguard process is configured with: the environment variables of
// README.md, read and checked once (cmd/postguard's loadConfig), and taken as given here.
type Config struct {
	DatabaseURL string
	Engine      string // EnginePostgres or EngineSQLite
	SQLitePath  string // with EngineSQLite: the file, verbatim from sqlite://PATH

	HTTPAddr string
	AppURL   string

	// AppName is APP_NAME: the product name in mail and on the service's pages.
	AppName string
	// LoginURL is APP_LOGIN_URL (APP_URL when unset): where the pages send people next, and the
	// welcome mail's button.
	LoginURL string
	// BrandColor and LogoURL are APP_BRAND_COLOR (#rrggbb, mail.DefaultBrandColor when unset)
	// and APP_LOGO_URL ("" for none), which Renderer was built with.
	BrandColor string
	LogoURL    string
	// MailTemplatesDir and DefaultLocale are MAIL_TEMPLATES_DIR and DEFAULT_LOCALE, which
	// Renderer was built from.
	MailTemplatesDir string
	DefaultLocale    string
	// Renderer renders the mail and the pages, built and checked where the configuration is
	// read; nil means the built-in templates, branded postguard, on AppURL.
	Renderer *mail.Renderer

	// MetricsAddr is the listener of /metrics for serve and api; "" when METRICS_ADDR is off. A
	// worker serves /metrics on HTTPAddr.
	MetricsAddr string

	// AppSecret is nil on the embedded default when APP_SECRET is unset: the engine then keeps a
	// generated one in PATH.secret beside the database.
	AppSecret []byte

	ResendAPIKey  string
	ResendBaseURL string
	ResendMaxRPS  float64

	// Mailers is MAILER: the providers in failover order (MailerResend, MailerSMTP), or
	// MailerLog alone; empty for MAILER=none.
	Mailers []string
	// MailFrom is the sender of every mail, whichever provider sends it: MAIL_FROM, or
	// RESEND_FROM_EMAIL when unset.
	MailFrom string
	// SMTPURL is SMTP_URL, parsed; nil when unset. SMTPMaxRPS is SMTP_MAX_RPS.
	SMTPURL    *mail.SMTPURL
	SMTPMaxRPS float64

	TrustedProxies []netip.Prefix
	Rules          abuse.Rules

	// ClientIPHeader is CLIENT_IP_HEADER: the header a trusted proxy's client address is read from.
	ClientIPHeader abuse.ClientIPHeader

	RiverUIUsername string
	RiverUIPassword string

	// ResendWebhookSecret is RESEND_WEBHOOK_SECRET ("whsec_…"); "" leaves the webhook unmounted.
	ResendWebhookSecret string
	// AdminToken is ADMIN_TOKEN (at least 32 bytes); "" leaves /v1/admin unmounted.
	AdminToken string
	// LimitsToken is LIMITS_API_TOKEN, the bearer token of /v1/limits; "" serves no limits API.
	LimitsToken string

	// DeviceTokenTTL is DEVICE_TOKEN_TTL: the life of a trusted-device token.
	DeviceTokenTTL time.Duration

	JobRetention     time.Duration
	CounterRetention time.Duration
	PruneInterval    time.Duration
	// CounterPruneInterval is COUNTER_PRUNE_INTERVAL: the period of the counters' prune.
	CounterPruneInterval time.Duration
	ShutdownTimeout      time.Duration
	EmailWorkers         int
	JobTimeout           time.Duration
	JobRescueAfter       time.Duration
	FetchCooldown        time.Duration
	FetchPollInterval    time.Duration

	LogFormat string
	LogLevel  slog.Level
}
