package main

import (
	"cmp"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/riverqueue/river"
	"golang.org/x/text/language"

	"github.com/postguard/postguard/api/abuse"
	"github.com/postguard/postguard/cmd/internal/service"
	"github.com/postguard/postguard/cmd/internal/telemetry"
	"github.com/postguard/postguard/jobs"
	"github.com/postguard/postguard/jobs/mail"
	"github.com/postguard/postguard/tokens"
)

// minSecretLen is the shortest APP_SECRET accepted, the library's own rule (tokens.CheckSecret):
// checked here first, so that it is named with every other bad variable at once.
const minSecretLen = tokens.MinSecretLen

// minAdminTokenLen is the shortest ADMIN_TOKEN accepted: a bearer token that nothing rate limits
// must be too long to guess.
const minAdminTokenLen = 32

// maxDeviceTokenTTL bounds DEVICE_TOKEN_TTL: ten years, far past any sensible life of a device
// cookie, so that a typo (a unit forgotten, 1e9h) is refused at start.
const maxDeviceTokenTTL = 10 * 365 * 24 * time.Hour

// minCounterRetention is the shortest COUNTER_RETENTION accepted. A counter is of no use once its
// window has ended, but the prune that deletes it reads one process's clock and the checks
// that still spend it another's: a minute covers any skew between them, so that no counter of a
// window still open somewhere is deleted (and started afresh, past its limit). Zero would also
// have meant the default (24h) to jobs.Config, silently.
const minCounterRetention = time.Minute

// maxCounterPruneInterval bounds COUNTER_PRUNE_INTERVAL: the counters table holds an interval's
// fresh keys more than its sizing (docs/operations.md), so an hour, past which a typo (a unit
// forgotten) is refused at start.
const maxCounterPruneInterval = time.Hour

// maxResendMaxRPS bounds RESEND_MAX_RPS and SMTP_MAX_RPS: far above any provider's rate, so that a
// typo (1e9) or +Inf is refused at start rather than taken as no pace at all.
const maxResendMaxRPS = 10_000

// config is everything postguard reads from its environment, read once at start by loadConfig.
type config = service.Config

// loadConfig reads the configuration from environ (os.Environ in main). Every bad value is
// reported, each naming its variable and what it expects, so an operator fixes them in one go.
func loadConfig(environ []string) (*config, error) {
	p := newEnvParser(environ)
	getenv := p.getenv
	cfg := &config{
		DatabaseURL:          cmp.Or(getenv("DATABASE_URL"), "sqlite://postguard.db"),
		HTTPAddr:             cmp.Or(getenv("HTTP_ADDR"), ":8080"),
		ResendAPIKey:         getenv("RESEND_API_KEY"),
		ResendBaseURL:        cmp.Or(getenv("RESEND_BASE_URL"), "https://api.resend.com/"),
		MailFrom:             cmp.Or(getenv("MAIL_FROM"), getenv("RESEND_FROM_EMAIL")),
		RiverUIUsername:      getenv("RIVERUI_USERNAME"),
		RiverUIPassword:      getenv("RIVERUI_PASSWORD"),
		JobRetention:         p.duration("JOB_RETENTION", jobs.DefaultJobRetention, time.Minute),
		CounterRetention:     p.duration("COUNTER_RETENTION", jobs.DefaultCounterRetention, minCounterRetention),
		PruneInterval:        p.duration("PRUNE_INTERVAL", jobs.DefaultPruneInterval, time.Second),
		CounterPruneInterval: p.duration("COUNTER_PRUNE_INTERVAL", jobs.DefaultCounterPruneInterval, time.Second),
		ShutdownTimeout:      p.duration("SHUTDOWN_TIMEOUT", 10*time.Second, 0),
		ResendMaxRPS:         p.float("RESEND_MAX_RPS", 2),
		SMTPMaxRPS:           p.float("SMTP_MAX_RPS", 2),
		EmailWorkers:         p.int("EMAIL_WORKERS", jobs.DefaultEmailWorkers, 1, river.QueueNumWorkersMax),
		JobTimeout:           p.duration("JOB_TIMEOUT", jobs.DefaultJobTimeout, time.Second),
		JobRescueAfter:       p.duration("JOB_RESCUE_AFTER", jobs.DefaultRescueAfter, time.Second),
		FetchCooldown:        p.duration("JOB_FETCH_COOLDOWN", 100*time.Millisecond, time.Millisecond),
		FetchPollInterval:    p.duration("JOB_FETCH_POLL_INTERVAL", time.Second, time.Millisecond),
		DeviceTokenTTL:       p.duration("DEVICE_TOKEN_TTL", abuse.DefaultDeviceTokenTTL, time.Minute),
	}

	p.databaseURL(cfg)
	cfg.AppURL = p.appURL()
	p.mail(cfg)
	cfg.MetricsAddr = p.metricsAddr()
	cfg.AppSecret = p.secret(cfg.Engine, true)
	cfg.TrustedProxies = p.trustedProxies()
	cfg.ClientIPHeader = p.clientIPHeader()
	cfg.Rules = p.rules()
	cfg.LimitsToken = p.limitsToken()
	cfg.SMTPURL = p.smtpURL()
	cfg.Mailers = p.mailers(cfg)
	cfg.LogFormat, cfg.LogLevel = p.logging()
	cfg.ResendWebhookSecret = p.webhookSecret()
	cfg.AdminToken = p.adminToken()

	if cfg.JobRescueAfter <= cfg.JobTimeout {
		p.fail("JOB_RESCUE_AFTER", "must exceed JOB_TIMEOUT (%s), or a job still running would be rescued and worked twice", cfg.JobTimeout)
	}
	if cfg.CounterPruneInterval > maxCounterPruneInterval {
		p.fail("COUNTER_PRUNE_INTERVAL", "%q is longer than %s: between two runs the counters table grows by an interval's fresh keys (docs/operations.md, Sizing the counters table)",
			p.getenv("COUNTER_PRUNE_INTERVAL"), maxCounterPruneInterval)
	}
	if cfg.FetchPollInterval < cfg.FetchCooldown {
		p.fail("JOB_FETCH_POLL_INTERVAL", "must be at least JOB_FETCH_COOLDOWN (%s)", cfg.FetchCooldown)
	}
	if !(cfg.ResendMaxRPS >= 0 && cfg.ResendMaxRPS <= maxResendMaxRPS) { // NaN fails both
		p.fail("RESEND_MAX_RPS", "must be 0 (unpaced) or a number of sends per second up to %d", maxResendMaxRPS)
	}
	if !(cfg.SMTPMaxRPS >= 0 && cfg.SMTPMaxRPS <= maxResendMaxRPS) {
		p.fail("SMTP_MAX_RPS", "must be 0 (unpaced) or a number of sends per second up to %d", maxResendMaxRPS)
	}
	if cfg.DeviceTokenTTL > maxDeviceTokenTTL || cfg.DeviceTokenTTL%time.Second != 0 {
		p.fail("DEVICE_TOKEN_TTL", "%q is not a whole number of seconds up to %s (the device cookie's Max-Age); the default is %s (90 days)",
			p.getenv("DEVICE_TOKEN_TTL"), maxDeviceTokenTTL, abuse.DefaultDeviceTokenTTL)
	}
	if (cfg.RiverUIUsername == "") != (cfg.RiverUIPassword == "") {
		p.fail("RIVERUI_PASSWORD", "RIVERUI_USERNAME and RIVERUI_PASSWORD must be set together (River UI is not mounted when both are unset)")
	}
	p.secretsDiffer("APP_SECRET", "ADMIN_TOKEN", "LIMITS_API_TOKEN", "RIVERUI_PASSWORD")
	// OpenTelemetry's variables are OpenTelemetry's to read (telemetry.New, at the server's
	// start); checked here, so that a bad one is named with every other.
	if _, err := telemetry.ParseEnv(getenv); err != nil {
		p.errs = append(p.errs, err)
	}

	if len(p.errs) > 0 {
		return nil, errors.Join(p.errs...)
	}
	return cfg, nil
}

// loadMailConfig reads only what the templates of the mail and the pages need (`postguard mail
// preview`): APP_NAME, APP_URL, APP_LOGIN_URL, APP_BRAND_COLOR, APP_LOGO_URL, MAIL_TEMPLATES_DIR
// and DEFAULT_LOCALE, checked as a server checks them.
func loadMailConfig(environ []string) (*config, error) {
	p := newEnvParser(environ)
	cfg := &config{AppURL: p.appURL()}
	p.mail(cfg)
	if len(p.errs) > 0 {
		return nil, errors.Join(p.errs...)
	}
	return cfg, nil
}

// loadDatabaseConfig reads only what `postguard migrate` needs: DATABASE_URL, the log settings,
// and APP_SECRET when it is set (to check it against the database's).
func loadDatabaseConfig(environ []string) (*config, error) {
	return loadDatabaseAndSecret(environ, false)
}

// loadSecretConfig reads what `postguard secret reset` needs: loadDatabaseConfig's variables,
// APP_SECRET required on PostgreSQL as for the server roles.
func loadSecretConfig(environ []string) (*config, error) {
	return loadDatabaseAndSecret(environ, true)
}

func loadDatabaseAndSecret(environ []string, secretRequired bool) (*config, error) {
	p := newEnvParser(environ)
	cfg := &config{DatabaseURL: cmp.Or(p.getenv("DATABASE_URL"), "sqlite://postguard.db")}
	p.databaseURL(cfg)
	cfg.AppSecret = p.secret(cfg.Engine, secretRequired)
	cfg.LogFormat, cfg.LogLevel = p.logging()
	if len(p.errs) > 0 {
		return nil, errors.Join(p.errs...)
	}
	return cfg, nil
}

// envParser collects every configuration error instead of stopping at the first.
type envParser struct {
	environ []string
	vars    map[string]string
	errs    []error
}

// newEnvParser parses environ ("KEY=value" entries; for a name set twice, the last wins, as
// os/exec does).
func newEnvParser(environ []string) *envParser {
	p := &envParser{environ: environ, vars: make(map[string]string, len(environ))}
	for _, kv := range environ {
		if k, v, ok := strings.Cut(kv, "="); ok {
			p.vars[k] = v
		}
	}
	return p
}

// getenv is os.Getenv on the parser's environment.
func (p *envParser) getenv(name string) string { return p.vars[name] }

func (p *envParser) fail(name, format string, args ...any) {
	p.errs = append(p.errs, fmt.Errorf("invalid %s: %s", name, fmt.Sprintf(format, args...)))
}

func (p *envParser) duration(name string, def, minimum time.Duration) time.Duration {
	s := p.getenv(name)
	if s == "" {
		return def
	}
	d, err := time.ParseDuration(s)
	if err != nil || d < minimum {
		p.fail(name, "%q is not a duration of at least %s (examples: 30s, 15m, 24h)", s, minimum)
		return def
	}
	return d
}

func (p *envParser) int(name string, def, minimum, maximum int) int {
	s := p.getenv(name)
	if s == "" {
		return def
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < minimum || n > maximum {
		p.fail(name, "%q is not a whole number from %d to %d", s, minimum, maximum)
		return def
	}
	return n
}

func (p *envParser) float(name string, def float64) float64 {
	s := p.getenv(name)
	if s == "" {
		return def
	}
	f, err := strconv.ParseFloat(s, 64)
	if err != nil || f != f { // NaN
		p.fail(name, "%q is not a number", s)
		return def
	}
	return f
}

func (p *envParser) databaseURL(cfg *config) {
	raw := cfg.DatabaseURL
	switch {
	case strings.HasPrefix(raw, "postgres://"), strings.HasPrefix(raw, "postgresql://"):
		u, err := url.Parse(raw)
		if err != nil || u.Host == "" {
			p.fail("DATABASE_URL", "cannot parse the PostgreSQL URL (expected postgres://user:pass@host:5432/dbname)")
			return
		}
		cfg.Engine = service.EnginePostgres
	case strings.HasPrefix(raw, "sqlite://"):
		path := strings.TrimPrefix(raw, "sqlite://")
		if path == "" {
			p.fail("DATABASE_URL", "sqlite:// needs a file path, e.g. sqlite://postguard.db")
			return
		}
		cfg.Engine, cfg.SQLitePath = service.EngineSQLite, path
	default:
		p.fail("DATABASE_URL", "must start with postgres://, postgresql:// or sqlite:// (the default is sqlite://postguard.db)")
	}
}

func (p *envParser) appURL() string {
	raw := cmp.Or(p.getenv("APP_URL"), "http://localhost:8080")
	u, err := url.Parse(raw)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.RawQuery != "" || u.Fragment != "" {
		p.fail("APP_URL", "%q is not an absolute http(s) URL without query (links in mail start with it)", raw)
		return raw
	}
	return strings.TrimRight(raw, "/")
}

// metricsOff is the METRICS_ADDR that serves no metrics listener.
const metricsOff = "off"

func (p *envParser) metricsAddr() string {
	addr := cmp.Or(p.getenv("METRICS_ADDR"), "127.0.0.1:9464")
	if addr == metricsOff {
		return ""
	}
	_, port, err := net.SplitHostPort(addr)
	if err == nil {
		_, err = strconv.ParseUint(port, 10, 16)
	}
	if err != nil {
		p.fail("METRICS_ADDR", "%q is not a listen address like 127.0.0.1:9464 or :9464, or %q to serve no metrics", addr, metricsOff)
		return ""
	}
	return addr
}

// maxAppNameLen bounds APP_NAME, in code points: it goes into every subject line.
const maxAppNameLen = 100

// mail reads APP_NAME, APP_LOGIN_URL, APP_BRAND_COLOR, APP_LOGO_URL, MAIL_TEMPLATES_DIR and
// DEFAULT_LOCALE, and builds the renderer of the mail and the pages from them and cfg.AppURL:
// every template is loaded and rendered with sample data now, so that a template that does not
// parse or names a field that does not exist stops the process at start, its file named.
func (p *envParser) mail(cfg *config) {
	errs := len(p.errs)
	cfg.AppName = mail.DefaultAppName
	if raw := p.getenv("APP_NAME"); raw != "" {
		name := strings.TrimSpace(raw)
		switch {
		case name == "":
			p.fail("APP_NAME", "is blank; unset it for %q, or name the product its mail comes from", mail.DefaultAppName)
		case !utf8.ValidString(name) || utf8.RuneCountInString(name) > maxAppNameLen:
			p.fail("APP_NAME", "must be UTF-8 text of at most %d characters", maxAppNameLen)
		case strings.IndexFunc(name, func(r rune) bool { return unicode.In(r, unicode.Cc, unicode.Cf, unicode.Zl, unicode.Zp) }) >= 0:
			p.fail("APP_NAME", "may not hold control, format or line-separator characters (it goes into subject lines)")
		default:
			cfg.AppName = name
		}
	}

	cfg.DefaultLocale = cmp.Or(p.getenv("DEFAULT_LOCALE"), mail.DefaultLocale)
	if tag, err := language.Parse(cfg.DefaultLocale); err != nil {
		p.fail("DEFAULT_LOCALE", "%q is not a BCP 47 language tag (examples: en, fr, pt-BR)", cfg.DefaultLocale)
	} else {
		cfg.DefaultLocale = tag.String()
	}

	cfg.LoginURL = cfg.AppURL
	if raw := p.getenv("APP_LOGIN_URL"); raw != "" {
		u, err := url.Parse(raw)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			p.fail("APP_LOGIN_URL", "%q is not an absolute http(s) URL (where the pages send people next, e.g. https://app.example.com/login); unset, it is APP_URL", raw)
		} else {
			cfg.LoginURL = raw
		}
	}
	cfg.BrandColor = mail.DefaultBrandColor
	if raw := p.getenv("APP_BRAND_COLOR"); raw != "" {
		if err := mail.CheckBrandColor(raw); err != nil {
			p.fail("APP_BRAND_COLOR", "%v", err)
		} else {
			cfg.BrandColor = strings.ToLower(raw)
		}
	}
	if raw := p.getenv("APP_LOGO_URL"); raw != "" {
		if err := mail.CheckLogoURL(raw); err != nil {
			p.fail("APP_LOGO_URL", "%v", err)
		} else {
			cfg.LogoURL = raw
		}
	}

	cfg.MailTemplatesDir = p.getenv("MAIL_TEMPLATES_DIR")
	if cfg.MailTemplatesDir != "" {
		if info, err := os.Stat(cfg.MailTemplatesDir); err != nil || !info.IsDir() {
			p.fail("MAIL_TEMPLATES_DIR", "%q is not a directory one can read", cfg.MailTemplatesDir)
		}
	}
	if len(p.errs) > errs {
		return // the renderer would only repeat them
	}
	renderer, err := mail.NewRenderer(&mail.RendererConfig{
		AppName:       cfg.AppName,
		AppURL:        cfg.AppURL,
		LoginURL:      cfg.LoginURL,
		BrandColor:    cfg.BrandColor,
		LogoURL:       cfg.LogoURL,
		TemplatesDir:  cfg.MailTemplatesDir,
		DefaultLocale: cfg.DefaultLocale,
	})
	if err != nil {
		name := "MAIL_TEMPLATES_DIR"
		if cfg.MailTemplatesDir == "" {
			name = "APP_URL" // the built-in templates fail only on what they are given
		}
		p.fail(name, "%v", err)
		return
	}
	cfg.Renderer = renderer
}

// secret reads APP_SECRET: required on PostgreSQL when required says so; unset on the embedded
// default, the engine's own secret file is used.
func (p *envParser) secret(engine string, required bool) []byte {
	s := p.getenv("APP_SECRET")
	switch {
	case s == "" && engine == service.EnginePostgres && required:
		p.fail("APP_SECRET", "required on PostgreSQL: at least %d random bytes, e.g. `openssl rand -hex 32`", minSecretLen)
		return nil
	case s == "":
		return nil // the embedded default keeps a generated secret beside its database (or migrate was given none)
	case len(s) < minSecretLen:
		p.fail("APP_SECRET", "is %d bytes; it must be at least %d (e.g. `openssl rand -hex 32`)", len(s), minSecretLen)
		return nil
	}
	// The value's bytes are the key, whatever its encoding: every process of a deployment derives
	// the same keys from the same text.
	return []byte(s)
}

// secretsDiffer fails each of names (in order) whose value, when set, is another's before it:
// each secret grants its own power (the admin API, the limits API, River UI, every HMAC), so a
// holder of one must not hold another. River UI's password is the likeliest to leak, since a
// browser sends it with every request.
func (p *envParser) secretsDiffer(names ...string) {
	for i, name := range names {
		value := p.getenv(name)
		if value == "" {
			continue
		}
		for _, earlier := range names[:i] {
			if p.getenv(earlier) == value {
				p.fail(name, "must differ from %s: each secret grants its own access, so give each a value of its own (e.g. `openssl rand -hex 32`)", earlier)
			}
		}
	}
}

func (p *envParser) webhookSecret() string {
	secret := p.getenv("RESEND_WEBHOOK_SECRET")
	if secret == "" {
		return "" // the webhook is not mounted
	}
	if err := mail.CheckResendWebhookSecret(secret); err != nil {
		p.fail("RESEND_WEBHOOK_SECRET", "%v", err)
		return ""
	}
	return secret
}

func (p *envParser) adminToken() string {
	token := p.getenv("ADMIN_TOKEN")
	if token != "" && len(token) < minAdminTokenLen {
		p.fail("ADMIN_TOKEN", "is %d bytes; it must be at least %d (e.g. `openssl rand -hex 32`), or unset to leave /v1/admin unmounted", len(token), minAdminTokenLen)
		return ""
	}
	return token
}

func (p *envParser) trustedProxies() []netip.Prefix {
	prefixes, err := abuse.ParseTrustedProxies(p.getenv("TRUSTED_PROXIES"))
	if err != nil {
		p.fail("TRUSTED_PROXIES", "%v (expected IPs or CIDRs separated by commas, e.g. 10.0.0.0/8,192.168.1.1)", err)
		return nil
	}
	return prefixes
}

func (p *envParser) clientIPHeader() abuse.ClientIPHeader {
	header, err := abuse.ParseClientIPHeader(p.getenv("CLIENT_IP_HEADER"))
	if err != nil {
		p.fail("CLIENT_IP_HEADER", "%v (X-Forwarded-For, the default, for proxies that append to it; X-Real-IP for a proxy that sets X-Real-IP and passes the client's X-Forwarded-For through)", err)
		return abuse.HeaderXForwardedFor
	}
	return header
}

// rules reads every RATE_LIMIT_<ACTION>_<SCOPE> variable: a built-in action's overrides its
// rule, any other defines a custom action's (abuse.ParseRuleEnv).
func (p *envParser) rules() abuse.Rules {
	rules := abuse.DefaultRules()
	names := make([]string, 0)
	for name := range p.vars {
		if strings.HasPrefix(name, "RATE_LIMIT_") {
			names = append(names, name)
		}
	}
	slices.Sort(names) // custom rules in a stable order, and errors too
	for _, name := range names {
		value := p.vars[name]
		rule, ok, err := abuse.ParseRuleEnv(name, value)
		if err != nil {
			// ParseRuleEnv's error starts with the name, which fail says already.
			p.fail(name, "%q: %s (e.g. RATE_LIMIT_LOGIN_KEY=5/15m)", value, strings.TrimPrefix(err.Error(), name+": "))
			continue
		}
		if ok {
			rules = rules.With(rule)
		}
	}
	return rules
}

// minLimitsTokenLen is the shortest LIMITS_API_TOKEN accepted, as for APP_SECRET.
const minLimitsTokenLen = 32

// limitsToken reads LIMITS_API_TOKEN: unset, the limits API is not served (404).
func (p *envParser) limitsToken() string {
	token := p.getenv("LIMITS_API_TOKEN")
	if token != "" && len(token) < minLimitsTokenLen {
		p.fail("LIMITS_API_TOKEN", "is %d bytes; it must be at least %d (e.g. `openssl rand -hex 32`), or unset to serve no limits API", len(token), minLimitsTokenLen)
		return ""
	}
	return token
}

// mailers reads MAILER: resend and smtp, alone or both in failover order (resend,smtp or
// smtp,resend), log alone, or none. Unset, it is the providers whose settings are present, Resend
// first (RESEND_API_KEY, SMTP_URL), else log on the embedded default and none on PostgreSQL. It
// checks what each named provider needs; none gives an empty list.
func (p *envParser) mailers(cfg *config) []string {
	var names []string
	if raw := p.getenv("MAILER"); raw == "" {
		if cfg.ResendAPIKey != "" {
			names = append(names, service.MailerResend)
		}
		if cfg.SMTPURL != nil || p.getenv("SMTP_URL") != "" {
			names = append(names, service.MailerSMTP)
		}
		if len(names) == 0 && cfg.Engine == service.EngineSQLite {
			names = []string{service.MailerLog}
		}
	} else {
		for part := range strings.SplitSeq(raw, ",") {
			name := strings.TrimSpace(part)
			switch {
			case name != service.MailerResend && name != service.MailerSMTP && name != service.MailerLog && name != service.MailerNone:
				p.fail("MAILER", "%q is not one of resend, smtp, log, none (resend and smtp may be listed together, in failover order: resend,smtp)", name)
				return nil
			case slices.Contains(names, name):
				p.fail("MAILER", "names %s twice", name)
				return nil
			}
			names = append(names, name)
		}
		if len(names) > 1 && (slices.Contains(names, service.MailerLog) || slices.Contains(names, service.MailerNone)) {
			p.fail("MAILER", "%q: log and none stand alone; only resend and smtp fail over to each other", raw)
			return nil
		}
		if names[0] == service.MailerNone {
			return nil
		}
	}

	resend, smtp := slices.Contains(names, service.MailerResend), slices.Contains(names, service.MailerSMTP)
	if resend {
		if cfg.ResendAPIKey == "" {
			p.fail("RESEND_API_KEY", "required when MAILER names resend")
		}
		if u, err := url.Parse(cfg.ResendBaseURL); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			p.fail("RESEND_BASE_URL", "%q is not an absolute http(s) URL", cfg.ResendBaseURL)
		}
	}
	if smtp && cfg.SMTPURL == nil && p.getenv("SMTP_URL") == "" {
		p.fail("SMTP_URL", "required when MAILER names smtp: smtps://user:password@host:465, smtp://user:password@host:587 (STARTTLS) or smtp+insecure://host:25")
	}
	fromVar := "MAIL_FROM" // the variable the sender came from, to name in an error
	if p.getenv("MAIL_FROM") == "" && p.getenv("RESEND_FROM_EMAIL") != "" {
		fromVar = "RESEND_FROM_EMAIL"
	}
	switch {
	case (resend || smtp) && cfg.MailFrom == "":
		p.fail(fromVar, "required when MAILER names resend or smtp: the sender of every mail, e.g. App <no-reply@example.com> on a domain the provider lets you send from (MAIL_FROM, or RESEND_FROM_EMAIL when MAIL_FROM is unset)")
	case smtp:
		if err := mail.CheckFrom(cfg.MailFrom); err != nil {
			p.fail(fromVar, "%v", err)
		}
	}
	return names
}

// smtpURL reads SMTP_URL, when set, whatever MAILER says: a bad one stops the process even while
// unused. Its errors never quote the URL, which may hold a password.
func (p *envParser) smtpURL() *mail.SMTPURL {
	raw := p.getenv("SMTP_URL")
	if raw == "" {
		return nil
	}
	u, err := mail.ParseSMTPURL(raw)
	if err != nil {
		p.fail("SMTP_URL", "%v", err)
		return nil
	}
	return u
}

func (p *envParser) logging() (string, slog.Level) {
	format := cmp.Or(p.getenv("LOG_FORMAT"), "text")
	if format != "text" && format != "json" {
		p.fail("LOG_FORMAT", "%q is not one of text, json", format)
	}
	var level slog.Level
	if err := level.UnmarshalText([]byte(cmp.Or(p.getenv("LOG_LEVEL"), "info"))); err != nil {
		p.fail("LOG_LEVEL", "%q is not one of debug, info, warn, error", p.getenv("LOG_LEVEL"))
	}
	return format, level
}
