package mail

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	netmail "net/mail"
	"net/textproto"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

	gomail "github.com/wneessen/go-mail"
	gosmtp "github.com/wneessen/go-mail/smtp"
)

// SMTP_URL schemes.
const (
	// SMTPSchemeTLS is implicit TLS from the first byte (SMTPS, RFC 8314), port 465 by default.
	SMTPSchemeTLS = "smtps"
	// SMTPSchemeStartTLS is submission with STARTTLS required, port 587 by default: a server that
	// does not offer STARTTLS, or whose certificate does not verify, is sent nothing.
	SMTPSchemeStartTLS = "smtp"
	// SMTPSchemeInsecure is plain SMTP, port 25 by default: mail crosses the network unencrypted.
	// For a relay on the same host or a private network, and for tests.
	SMTPSchemeInsecure = "smtp+insecure"
)

// DefaultSMTPTimeout bounds one SMTP send, from the dial to the reply to the end of data, when
// SMTPConfig.Timeout is zero.
const DefaultSMTPTimeout = 30 * time.Second

// SMTPURL is a parsed SMTP_URL: scheme://[user[:password]@]host[:port].
type SMTPURL struct {
	// Scheme is SMTPSchemeTLS, SMTPSchemeStartTLS or SMTPSchemeInsecure.
	Scheme string
	// Host is the server's name or address (without brackets for IPv6).
	Host string
	// Port is the URL's port, or the scheme's default (465, 587, 25).
	Port int
	// Username and Password authenticate (AUTH PLAIN or LOGIN), percent-decoded from the URL;
	// empty for a relay that takes mail without authentication.
	Username string
	Password string
}

// ParseSMTPURL parses an SMTP_URL. Its errors never quote the URL, which may hold a password.
func ParseSMTPURL(raw string) (*SMTPURL, error) {
	u, err := url.Parse(strings.TrimSpace(raw))
	if err != nil {
		// url's errors quote the whole URL, password included: say what is wrong only.
		var urlErr *url.Error
		if errors.As(err, &urlErr) {
			err = urlErr.Err
		}
		return nil, fmt.Errorf("not a URL (%s); expected smtps://user:password@host:465, smtp://user:password@host:587 or smtp+insecure://host:25", redactedURLError(err))
	}
	parsed := &SMTPURL{Scheme: strings.ToLower(u.Scheme), Host: u.Hostname()}
	switch parsed.Scheme {
	case SMTPSchemeTLS:
		parsed.Port = 465
	case SMTPSchemeStartTLS:
		parsed.Port = 587
	case SMTPSchemeInsecure:
		parsed.Port = 25
	default:
		return nil, errors.New("the scheme must be smtps:// (implicit TLS), smtp:// (STARTTLS required) or smtp+insecure:// (plain)")
	}
	switch {
	case parsed.Host == "":
		return nil, errors.New("no host; expected scheme://[user:password@]host[:port]")
	case u.Opaque != "" || (u.Path != "" && u.Path != "/") || u.RawQuery != "" || u.Fragment != "":
		return nil, errors.New("only scheme://[user:password@]host[:port] is understood: no path, query or fragment")
	}
	if port := u.Port(); port != "" {
		n, err := strconv.Atoi(port)
		if err != nil || n < 1 || n > 65535 {
			return nil, errors.New("the port must be a number from 1 to 65535")
		}
		parsed.Port = n
	}
	if u.User != nil {
		parsed.Username = u.User.Username()
		parsed.Password, _ = u.User.Password()
		if parsed.Username == "" {
			return nil, errors.New("a password without a user name")
		}
		if parsed.Scheme == SMTPSchemeInsecure {
			return nil, errors.New("smtp+insecure:// would send the password in clear: use smtps:// or smtp:// (STARTTLS), or a relay that needs no password")
		}
	}
	return parsed, nil
}

// redactedURLError is the part of url's error that quotes nothing: an escape error names the bad
// escape only (it may be inside the password).
func redactedURLError(err error) string {
	var escapeErr url.EscapeError
	var hostErr url.InvalidHostError
	switch {
	case errors.As(err, &escapeErr):
		return "a bad percent escape"
	case errors.As(err, &hostErr):
		return "a bad character in the host"
	}
	return "it does not parse"
}

// Redacted is the URL without its password, for logs: smtp://user@host:587.
func (u *SMTPURL) Redacted() string {
	hostPort := net.JoinHostPort(u.Host, strconv.Itoa(u.Port))
	if u.Username == "" {
		return u.Scheme + "://" + hostPort
	}
	return u.Scheme + "://" + url.User(u.Username).String() + "@" + hostPort
}

// SMTPConfig configures an SMTPSender.
type SMTPConfig struct {
	// URL is the server and how to reach it (SMTP_URL, ParseSMTPURL). Required.
	URL *SMTPURL

	// From is the sender, e.g. "App <no-reply@example.com>" (MAIL_FROM). Required. Its domain is
	// the right-hand side of every Message-ID (MessageID).
	From string

	// TLSConfig, when set, is the TLS configuration of the connection (smtps) or of STARTTLS
	// (smtp), such as the root CAs of a private relay's certificate; it is cloned, and its
	// ServerName is the URL's host. nil verifies the server against the system's roots.
	TLSConfig *tls.Config

	// Timeout bounds one send, from the dial to the server's reply to the end of data. Defaults
	// to DefaultSMTPTimeout.
	Timeout time.Duration

	// HelloName is the name given in EHLO; defaults to the machine's host name.
	HelloName string
}

// SMTPSender delivers mail through an SMTP server with go-mail, one connection per mail: dial
// (implicit TLS for smtps), EHLO, STARTTLS (required for smtp://), AUTH when the URL carries a
// user, MAIL FROM, RCPT TO, DATA. It returns once the server has answered 250 to the end of data;
// the QUIT that closes the session then goes on in the background, so that no round trip stands
// between the server's acceptance and the caller's record of it.
//
// Each mail carries a Message-ID derived from its idempotency key (MessageID), the same on every
// attempt, and the message's subject, plain-text and HTML bodies (multipart/alternative) and
// headers (List-Unsubscribe, List-Unsubscribe-Post). SMTP has no idempotency key: a mail whose
// connection was lost after its content was sent, before the server's answer, may have been
// delivered, and a retry may deliver it again, with the same Message-ID (see Classify). Failures
// are returned as *SMTPError. It is safe for concurrent use.
type SMTPSender struct {
	url       *SMTPURL
	from      *netmail.Address
	domain    string
	tlsConfig *tls.Config
	timeout   time.Duration
	helloName string
}

// NewSMTPSender returns a sender for config, or an error when the URL or the From address is
// missing or invalid.
func NewSMTPSender(config *SMTPConfig) (*SMTPSender, error) {
	if config == nil || config.URL == nil {
		return nil, errors.New("SMTP URL is required (SMTP_URL)")
	}
	from, domain, err := parseFrom(config.From)
	if err != nil {
		return nil, err
	}
	if config.Timeout < 0 {
		return nil, fmt.Errorf("SMTP timeout must not be negative, got %s", config.Timeout)
	}
	timeout := config.Timeout
	if timeout == 0 {
		timeout = DefaultSMTPTimeout
	}

	var tlsConfig *tls.Config
	if config.TLSConfig != nil {
		tlsConfig = config.TLSConfig.Clone()
	} else {
		tlsConfig = &tls.Config{MinVersion: tls.VersionTLS12}
	}
	tlsConfig.ServerName = config.URL.Host
	tlsConfig.MinVersion = max(tlsConfig.MinVersion, tls.VersionTLS12)

	helloName := config.HelloName
	if helloName == "" {
		if helloName, err = os.Hostname(); err != nil || helloName == "" {
			helloName = "localhost"
		}
	}
	smtpURL := *config.URL
	return &SMTPSender{
		url:       &smtpURL,
		from:      from,
		domain:    domain,
		tlsConfig: tlsConfig,
		timeout:   timeout,
		helloName: helloName,
	}, nil
}

// parseFrom parses a From address (MAIL_FROM) and returns it with its domain, lowercased.
func parseFrom(raw string) (*netmail.Address, string, error) {
	if strings.TrimSpace(raw) == "" {
		return nil, "", errors.New("from address is required (MAIL_FROM)")
	}
	from, err := netmail.ParseAddress(raw)
	if err != nil {
		return nil, "", fmt.Errorf("from address %q is not an address like App <no-reply@example.com>: %w", raw, err)
	}
	at := strings.LastIndexByte(from.Address, '@')
	if at < 0 || at == len(from.Address)-1 {
		return nil, "", fmt.Errorf("from address %q has no domain", raw)
	}
	return from, strings.ToLower(from.Address[at+1:]), nil
}

// CheckFrom checks a From address (MAIL_FROM) as NewSMTPSender does.
func CheckFrom(raw string) error {
	_, _, err := parseFrom(raw)
	return err
}

// MessageID is the Message-ID of the mail sent under idempotencyKey from an address of domain:
// <hex(SHA-256(key))[:32]@domain>. The key is random and kept for every attempt of a job, so the
// id is the same on every attempt and says nothing of the user or the kind of mail.
func MessageID(idempotencyKey, domain string) string {
	sum := sha256.Sum256([]byte(idempotencyKey))
	return "<" + hex.EncodeToString(sum[:])[:32] + "@" + domain + ">"
}

// Send delivers msg and returns its Message-ID (the id the server knows it by). A failure is an
// *SMTPError saying at which step the session failed and with which reply; a message without a
// recipient or idempotency key, or with a header that would change the mail's structure, gives
// ErrInvalidMessage, nothing sent. A cancelled ctx closes the connection and stays recognisable
// with errors.Is(err, context.Canceled).
func (s *SMTPSender) Send(ctx context.Context, msg *Message) (string, error) {
	id := ""
	if msg != nil {
		id = MessageID(msg.IdempotencyKey, s.domain)
	}
	m, err := s.message(msg, id)
	if err != nil {
		return "", err
	}

	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()

	// The connection of this send is closed as soon as ctx is done (go-mail bounds a session by
	// its deadlines only, and a cancelled job must not wait for them). The dial's own context
	// ends with the dial, so the closing hangs on ctx.
	var conn net.Conn
	stopClosing := func() bool { return true }
	dial := func(dialCtx context.Context, network, _ string) (net.Conn, error) {
		addr := net.JoinHostPort(s.url.Host, strconv.Itoa(s.url.Port))
		var err error
		if s.url.Scheme == SMTPSchemeTLS {
			conn, err = (&tls.Dialer{Config: s.tlsConfig}).DialContext(dialCtx, network, addr)
		} else {
			conn, err = (&net.Dialer{}).DialContext(dialCtx, network, addr)
		}
		if err != nil {
			return nil, err
		}
		stopClosing = context.AfterFunc(ctx, func() { _ = conn.Close() })
		return conn, nil
	}
	client, err := gomail.NewClient(s.url.Host, s.clientOptions(ctx, dial)...)
	if err != nil {
		return "", fmt.Errorf("error sending email: %w: %w", ErrInvalidMessage, err)
	}

	session, err := client.DialToSMTPClientWithContext(ctx)
	if err != nil {
		if conn != nil {
			stopClosing()
			_ = conn.Close()
		}
		return "", newSMTPError(SMTPPhaseConnect, id, err, ctx.Err())
	}

	err = client.SendWithSMTPClient(session, m)
	if err != nil && !m.IsDelivered() {
		stopClosing()
		_ = session.Close()
		return "", smtpSendError(id, err, ctx.Err())
	}
	// The server took the mail: end the session politely without keeping the caller waiting. The
	// connection's deadline (the timeout) bounds the QUIT.
	if stopClosing() {
		go func() { _ = client.CloseWithSMTPClient(session) }()
	}
	return id, nil
}

// clientOptions are go-mail's options for one send, its connections made by dial.
func (s *SMTPSender) clientOptions(ctx context.Context, dial gomail.DialContextFunc) []gomail.Option {
	timeout := s.timeout
	if deadline, ok := ctx.Deadline(); ok {
		timeout = max(time.Until(deadline), time.Millisecond)
	}
	opts := []gomail.Option{
		gomail.WithPort(s.url.Port),
		gomail.WithTimeout(timeout),
		gomail.WithHELO(s.helloName),
		gomail.WithDialContextFunc(dial),
		gomail.WithTLSConfig(s.tlsConfig),
		// A fresh connection per mail: no NOOP to check it, no RSET after the mail.
		gomail.WithoutNoop(),
		gomail.WithoutRset(),
	}
	if s.url.Scheme == SMTPSchemeStartTLS {
		opts = append(opts, gomail.WithTLSPolicy(gomail.TLSMandatory))
	} else {
		// smtps is TLS from the dial on; smtp+insecure never encrypts.
		opts = append(opts, gomail.WithTLSPolicy(gomail.NoTLS))
	}
	if s.url.Username != "" {
		opts = append(opts, gomail.WithSMTPAuthCustom(&passwordAuth{
			username: s.url.Username,
			password: s.url.Password,
			host:     s.url.Host,
		}))
	}
	return opts
}

// reservedHeaders are the headers the sender writes itself: a message header of one of these
// names would change the mail's structure or addressing, and is refused.
var reservedHeaders = map[string]bool{ //nolint:gochecknoglobals // a constant set
	"Bcc": true, "Cc": true, "Content-Transfer-Encoding": true, "Content-Type": true, "Date": true,
	"From": true, "Message-Id": true, "Mime-Version": true, "Reply-To": true, "Return-Path": true,
	"Sender": true, "Subject": true, "To": true,
}

// message builds msg as go-mail's Msg with Message-ID id: the From, To and Subject, the text and
// HTML bodies as multipart/alternative (the text first, as RFC 2046 orders the less rich part),
// and msg's headers.
func (s *SMTPSender) message(msg *Message, id string) (*gomail.Msg, error) {
	if msg == nil || strings.TrimSpace(msg.To) == "" {
		return nil, fmt.Errorf("error sending email: %w: no recipient", ErrInvalidMessage)
	}
	if msg.IdempotencyKey == "" {
		return nil, fmt.Errorf("error sending email: %w: no idempotency key", ErrInvalidMessage)
	}

	m := gomail.NewMsg(gomail.WithNoDefaultUserAgent())
	m.FromMailAddress(s.from)
	if err := m.To(msg.To); err != nil {
		return nil, fmt.Errorf("error sending email: %w: the recipient is not an address", ErrInvalidMessage)
	}
	m.Subject(msg.Subject)
	m.SetMessageIDWithValue(strings.TrimSuffix(strings.TrimPrefix(id, "<"), ">"))
	m.SetDate()
	for name, value := range msg.Headers {
		canonical := textproto.CanonicalMIMEHeaderKey(name)
		if reservedHeaders[canonical] || !validHeaderName(name) || strings.ContainsAny(value, "\r\n") {
			return nil, fmt.Errorf("error sending email: %w: header %q cannot be sent", ErrInvalidMessage, name)
		}
		m.SetGenHeader(gomail.Header(name), value)
	}
	m.SetBodyString(gomail.TypeTextPlain, msg.Text)
	m.AddAlternativeString(gomail.TypeTextHTML, msg.HTML)
	return m, nil
}

// validHeaderName says name is a header field name (RFC 5322 §3.6.8: printable ASCII but colon).
func validHeaderName(name string) bool {
	if name == "" {
		return false
	}
	for _, r := range name {
		if r <= ' ' || r > '~' || r == ':' {
			return false
		}
	}
	return true
}

// passwordAuth is AUTH PLAIN, or LOGIN for a server that offers only LOGIN (Microsoft's), with
// go-mail's own mechanisms; both refuse to send the password over a connection that is not TLS.
type passwordAuth struct {
	username, password, host string
	mechanism                gosmtp.Auth
}

// Start implements go-mail's smtp.Auth.
func (a *passwordAuth) Start(server *gosmtp.ServerInfo) (string, []byte, error) {
	a.mechanism = gosmtp.PlainAuth("", a.username, a.password, a.host, false)
	for _, offered := range server.Auth {
		if strings.EqualFold(offered, "PLAIN") {
			return a.mechanism.Start(server)
		}
	}
	for _, offered := range server.Auth {
		if strings.EqualFold(offered, "LOGIN") {
			a.mechanism = gosmtp.LoginAuth(a.username, a.password, a.host, false)
			return a.mechanism.Start(server)
		}
	}
	return "", nil, errors.New("the server offers neither AUTH PLAIN nor AUTH LOGIN")
}

// Next implements go-mail's smtp.Auth.
func (a *passwordAuth) Next(fromServer []byte, more bool) ([]byte, error) {
	return a.mechanism.Next(fromServer, more)
}

// SMTPPhase is the step of an SMTP session at which a send failed.
type SMTPPhase string

// SMTP phases.
const (
	// SMTPPhaseConnect: the dial, the greeting, EHLO, STARTTLS or AUTH. Nothing was sent.
	SMTPPhaseConnect SMTPPhase = "connect"
	// SMTPPhaseMailFrom: the server refused the sender (MAIL FROM). Nothing was sent.
	SMTPPhaseMailFrom SMTPPhase = "MAIL FROM"
	// SMTPPhaseRcptTo: the server refused the recipient (RCPT TO). Nothing was sent.
	SMTPPhaseRcptTo SMTPPhase = "RCPT TO"
	// SMTPPhaseData: the DATA command failed, or the connection was lost while the content was
	// written, before its end. The server cannot have taken the mail.
	SMTPPhaseData SMTPPhase = "DATA"
	// SMTPPhaseEndOfData: the whole content was sent and the server's reply to its end was a
	// refusal, or never came (Code 0): then the server may have taken the mail.
	SMTPPhaseEndOfData SMTPPhase = "end of data"
)

// SMTPError is an SMTP send that failed: at which phase, with which reply. Its message carries
// the reply's codes, never the server's text, which may quote the recipient's address.
type SMTPError struct {
	// Phase is the step that failed.
	Phase SMTPPhase
	// Code is the server's reply code (421, 550...); 0 when there was no reply: a network
	// error, a timeout, a TLS failure, or a server without STARTTLS for smtp://.
	Code int
	// EnhancedCode is the reply's enhanced status code (RFC 3463, "5.1.1"); "" when the server
	// gave none.
	EnhancedCode string
	// MessageID is the Message-ID of the mail that was being sent.
	MessageID string

	// cause is the failure without a reply code (a network error); nil for a reply.
	cause error
}

// Error describes the failure, e.g. "SMTP RCPT TO answered 550 5.1.1" or "SMTP end of data: no
// reply: read tcp …: connection reset by peer".
func (e *SMTPError) Error() string {
	if e.Code != 0 {
		s := fmt.Sprintf("SMTP %s answered %d", e.Phase, e.Code)
		if e.EnhancedCode != "" {
			s += " " + e.EnhancedCode
		}
		return s
	}
	if e.cause != nil {
		return fmt.Sprintf("SMTP %s: no reply: %v", e.Phase, e.cause)
	}
	return fmt.Sprintf("SMTP %s: no reply", e.Phase)
}

// Unwrap returns the failure without a reply (a network error, a cancelled context), if any.
func (e *SMTPError) Unwrap() error { return e.cause }

// Temporary says the server answered a 4xx reply.
func (e *SMTPError) Temporary() bool { return e.Code >= 400 && e.Code < 500 }

// Permanent says the server answered a 5xx reply.
func (e *SMTPError) Permanent() bool { return e.Code >= 500 && e.Code < 600 }

// newSMTPError is the failure of phase: a reply's codes when err carries one (go-mail's dial and
// AUTH errors wrap net/textproto's), else err itself as the cause, behind ctxErr when the send's
// context ended (its closing of the connection is then the error's real cause).
func newSMTPError(phase SMTPPhase, id string, err, ctxErr error) *SMTPError {
	e := &SMTPError{Phase: phase, MessageID: id}
	if reply, ok := errors.AsType[*textproto.Error](err); ok {
		e.Code = reply.Code
		e.EnhancedCode = enhancedCode(reply.Msg)
		return e
	}
	e.cause = err
	if ctxErr != nil && !errors.Is(err, ctxErr) {
		e.cause = fmt.Errorf("%w: %w", ctxErr, err)
	}
	return e
}

// enhancedCode is the enhanced status code at the start of a reply's text ("5.1.1 Unknown user"),
// or "".
func enhancedCode(text string) string {
	code, _, _ := strings.Cut(strings.TrimSpace(text), " ")
	parts := strings.Split(code, ".")
	if len(parts) != 3 || (parts[0] != "2" && parts[0] != "4" && parts[0] != "5") {
		return ""
	}
	for _, part := range parts[1:] {
		if n, err := strconv.Atoi(part); err != nil || n < 0 || n > 999 {
			return ""
		}
	}
	return code
}

// smtpSendError turns go-mail's SendError into an *SMTPError by its Reason (the step) and
// ErrorCode (the reply). Its own text, which names the recipient and quotes the server, is not
// kept. ctxErr is the send's context's error, if it ended.
func smtpSendError(id string, err, ctxErr error) error {
	sendErr, ok := errors.AsType[*gomail.SendError](err)
	if !ok {
		return newSMTPError(SMTPPhaseEndOfData, id, err, ctxErr)
	}
	e := &SMTPError{Code: sendErr.ErrorCode(), EnhancedCode: sendErr.EnhancedStatusCode(), MessageID: id}
	switch sendErr.Reason {
	case gomail.ErrGetSender, gomail.ErrGetRcpts, gomail.ErrNoUnencoded:
		return fmt.Errorf("error sending email: %w: %s", ErrInvalidMessage, sendErr.Reason)
	case gomail.ErrConnCheck:
		e.Phase = SMTPPhaseConnect
	case gomail.ErrSMTPMailFrom:
		e.Phase = SMTPPhaseMailFrom
	case gomail.ErrSMTPRcptTo:
		e.Phase = SMTPPhaseRcptTo
	case gomail.ErrSMTPData, gomail.ErrWriteContent:
		e.Phase = SMTPPhaseData
	default:
		// ErrSMTPDataClose, and anything go-mail may add: the content may have reached the
		// server.
		e.Phase = SMTPPhaseEndOfData
	}
	if e.Code == 0 {
		// go-mail keeps the cause of a failure without a reply to itself: its reason stands for
		// it, behind the context's error when the context closed the connection.
		e.cause = errors.New(sendErr.Reason.String())
		if ctxErr != nil {
			e.cause = fmt.Errorf("%w: %w", ctxErr, e.cause)
		}
	}
	return e
}
