// Package smtpfake is a real SMTP server in-process (emersion/go-smtp) for the tests of every
// package that sends mail through SMTP, and for the load tool (which passes a nil testing.TB).
//
// It listens on a loopback port and speaks SMTP as a relay does: EHLO with ENHANCEDSTATUSCODES,
// STARTTLS on a certificate it makes for 127.0.0.1 and localhost (trusted through RootCAs or
// ClientTLSConfig), implicit TLS (smtps) when asked, AUTH PLAIN and LOGIN when given a user,
// MAIL FROM, RCPT TO and DATA. It keeps every message whose content it received, with its raw
// bytes, and which of them it accepted. Faults are scripted per session with Enqueue: a reply code
// at EHLO, MAIL FROM, RCPT TO, DATA or the end of data, or the connection dropped after the
// content was received, before any reply. It is safe for concurrent use.
package smtpfake

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"io"
	"log"
	"math/big"
	"mime"
	"mime/multipart"
	"mime/quotedprintable"
	"net"
	netmail "net/mail"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/emersion/go-sasl"
	"github.com/emersion/go-smtp"
)

// Phase is the step of a session a Fault applies to.
type Phase string

// Phases.
const (
	// PhaseHello: the reply to EHLO (a server that cannot take mail now, 421, say).
	PhaseHello Phase = "EHLO"
	// PhaseMailFrom: the reply to MAIL FROM.
	PhaseMailFrom Phase = "MAIL FROM"
	// PhaseRcptTo: the reply to RCPT TO.
	PhaseRcptTo Phase = "RCPT TO"
	// PhaseEndOfData: the reply to the end of the content, once it was all received; with Drop,
	// the connection is closed instead of any reply (the mail's fate unknown to the client).
	PhaseEndOfData Phase = "end of data"
)

// Fault is a scripted answer of one session, given with Server.Enqueue.
type Fault struct {
	// Phase is where the session fails.
	Phase Phase
	// Code, EnhancedCode and Message are the reply, e.g. 550, {5, 1, 1}, "No such user".
	// Message defaults to "scripted fault".
	Code         int
	EnhancedCode [3]int
	Message      string
	// Drop closes the connection instead of replying (at PhaseEndOfData: after the content was
	// received, before the 250 that would have accepted it).
	Drop bool
}

// Config configures a Server. The zero value (or nil) accepts every mail, offers STARTTLS and
// asks for no authentication.
type Config struct {
	// ImplicitTLS serves TLS from the first byte (smtps) instead of offering STARTTLS.
	ImplicitTLS bool
	// NoSTARTTLS offers no STARTTLS (a server an smtp:// client must refuse to send to).
	NoSTARTTLS bool
	// Username and Password, when Username is set, are the only credentials accepted (AUTH PLAIN
	// or LOGIN, over TLS only); MAIL FROM without them gets 530.
	Username, Password string
	// Mechanisms are the AUTH mechanisms offered when Username is set; defaults to PLAIN and
	// LOGIN.
	Mechanisms []string
	// BeforeReplyFunc, when set, is called once a message's content was received, before the
	// reply to its end: "the server has the mail". It runs on the session's goroutine and may
	// block (a crash test kills the client meanwhile).
	BeforeReplyFunc func(message *Message)
	// NowFunc returns the time of each message (Message.ReceivedAt); defaults to time.Now.
	NowFunc func() time.Time
}

// Message is a message whose content the server received.
type Message struct {
	// From and To are the envelope's MAIL FROM and RCPT TO addresses.
	From string
	To   []string
	// Data is the content exactly as received (the dot-stuffing undone), headers and body.
	Data []byte
	// Accepted says the server answered 250 to its end; false for one refused or dropped there.
	Accepted bool
	// TLS says the session was encrypted (STARTTLS or implicit TLS); User is the authenticated
	// user, "" without AUTH.
	TLS  bool
	User string
	// ReceivedAt is when its content was received.
	ReceivedAt time.Time
}

// Server is the fake. Create it with New.
type Server struct {
	config   Config
	server   *smtp.Server
	listener net.Listener
	rootCAs  *x509.CertPool
	served   chan struct{}
	closed   sync.Once

	mu       sync.Mutex
	faults   []Fault    // FIFO, one per session
	received []*Message // every message whose content arrived, in order
	sessions int
}

// New starts a fake on 127.0.0.1. When tb is non-nil, Close is registered with tb.Cleanup and a
// failure to start fails tb; with a nil tb (the load tool) it panics instead. config may be nil.
func New(tb testing.TB, config *Config) *Server {
	s, err := start(config)
	if err != nil {
		if tb == nil {
			panic(err)
		}
		tb.Fatalf("smtpfake: %v", err)
	}
	if tb != nil {
		tb.Cleanup(s.Close)
	}
	return s
}

func start(config *Config) (*Server, error) {
	if config == nil {
		config = &Config{}
	}
	cert, rootCAs, err := newCertificate()
	if err != nil {
		return nil, err
	}
	s := &Server{config: *config, rootCAs: rootCAs, served: make(chan struct{})}
	tlsConfig := &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}

	s.server = smtp.NewServer(smtp.BackendFunc(s.newSession))
	s.server.Domain = "smtpfake.localhost"
	s.server.ErrorLog = log.New(io.Discard, "", 0)
	s.server.ReadTimeout = time.Minute
	s.server.WriteTimeout = time.Minute
	if !config.NoSTARTTLS && !config.ImplicitTLS {
		s.server.TLSConfig = tlsConfig
	}

	inner, err := (&net.ListenConfig{}).Listen(context.Background(), "tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("error listening: %w", err)
	}
	var listener net.Listener = &trackingListener{Listener: inner, server: s}
	if config.ImplicitTLS {
		listener = tls.NewListener(listener, tlsConfig)
	}
	s.listener = listener
	go func() {
		defer close(s.served)
		_ = s.server.Serve(listener) // smtp.ErrServerClosed after Close
	}()
	return s, nil
}

// newCertificate makes a self-signed certificate for 127.0.0.1 and localhost, and the pool that
// trusts it.
func newCertificate() (tls.Certificate, *x509.CertPool, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, nil, fmt.Errorf("error generating a key: %w", err)
	}
	template := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "smtpfake"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
		IsCA:                  true,
		DNSNames:              []string{"localhost"},
		IPAddresses:           []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback},
	}
	der, err := x509.CreateCertificate(rand.Reader, template, template, &key.PublicKey, key)
	if err != nil {
		return tls.Certificate{}, nil, fmt.Errorf("error creating a certificate: %w", err)
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		return tls.Certificate{}, nil, fmt.Errorf("error parsing the certificate: %w", err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(leaf)
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: leaf}, pool, nil
}

// Close stops the server and closes every session. Safe to call more than once.
func (s *Server) Close() {
	s.closed.Do(func() {
		_ = s.server.Close()
		// The server closes the listeners Serve has taken; Serve may not have taken it yet.
		_ = s.listener.Close()
		<-s.served
	})
}

// Addr is the server's host:port, e.g. "127.0.0.1:41234".
func (s *Server) Addr() string { return s.listener.Addr().String() }

// URL is an SMTP_URL of the server with scheme (smtps, smtp or smtp+insecure) and, when the
// server asks for them, its credentials.
func (s *Server) URL(scheme string) string {
	u := &url.URL{Scheme: scheme, Host: s.Addr()}
	if s.config.Username != "" {
		u.User = url.UserPassword(s.config.Username, s.config.Password)
	}
	return u.String()
}

// Port is the server's port.
func (s *Server) Port() int {
	_, port, _ := net.SplitHostPort(s.Addr())
	n, _ := strconv.Atoi(port)
	return n
}

// RootCAs trusts the server's certificate.
func (s *Server) RootCAs() *x509.CertPool { return s.rootCAs }

// ClientTLSConfig is a client TLS configuration that trusts the server's certificate.
func (s *Server) ClientTLSConfig() *tls.Config {
	return &tls.Config{RootCAs: s.rootCAs, MinVersion: tls.VersionTLS12}
}

// Enqueue adds scripted faults, used first-in first-out, one per session (connection), from its
// EHLO on.
func (s *Server) Enqueue(faults ...Fault) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.faults = append(s.faults, faults...)
}

// Received returns every message whose content the server received, in order, accepted or not.
func (s *Server) Received() []Message {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]Message, len(s.received))
	for i, m := range s.received {
		out[i] = *m
		out[i].To = append([]string(nil), m.To...)
		out[i].Data = bytes.Clone(m.Data)
	}
	return out
}

// Messages returns the messages the server accepted (answered 250 to their end), in order.
func (s *Server) Messages() []Message {
	var accepted []Message
	for _, m := range s.Received() {
		if m.Accepted {
			accepted = append(accepted, m)
		}
	}
	return accepted
}

// Sessions is how many connections the server accepted.
func (s *Server) Sessions() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.sessions
}

func (s *Server) now() time.Time {
	if s.config.NowFunc != nil {
		return s.config.NowFunc()
	}
	return time.Now()
}

func (f *Fault) error() *smtp.SMTPError {
	message := f.Message
	if message == "" {
		message = "scripted fault"
	}
	return &smtp.SMTPError{Code: f.Code, EnhancedCode: smtp.EnhancedCode(f.EnhancedCode), Message: message}
}

// trackingListener gives each connection it accepts the next scripted fault.
type trackingListener struct {
	net.Listener
	server *Server
}

// Accept implements net.Listener.
func (l *trackingListener) Accept() (net.Conn, error) {
	conn, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	s := l.server
	s.mu.Lock()
	defer s.mu.Unlock()
	s.sessions++
	tracked := &trackedConn{Conn: conn}
	if len(s.faults) > 0 {
		tracked.fault = &s.faults[0]
		s.faults = s.faults[1:]
	}
	return tracked, nil
}

// trackedConn is an accepted connection and its scripted fault (nil for none). A fault belongs to
// the connection, not to go-smtp's session: STARTTLS, and HELO after a refused EHLO, begin a new
// session on the same connection.
type trackedConn struct {
	net.Conn
	fault *Fault
}

// faultOf is the scripted fault of c's connection.
func faultOf(c *smtp.Conn) *Fault {
	conn := c.Conn()
	if tlsConn, ok := conn.(*tls.Conn); ok {
		conn = tlsConn.NetConn()
	}
	if tracked, ok := conn.(*trackedConn); ok {
		return tracked.fault
	}
	return nil
}

// newSession begins a session at EHLO (again after STARTTLS), with its connection's fault.
func (s *Server) newSession(c *smtp.Conn) (smtp.Session, error) {
	fault := faultOf(c)
	sess := &session{server: s, conn: c, fault: fault}
	if fault != nil && fault.Phase == PhaseHello {
		if fault.Drop {
			_ = c.Close()
		}
		return nil, fault.error()
	}
	return sess, nil
}

// session is one SMTP session.
type session struct {
	server *Server
	conn   *smtp.Conn
	fault  *Fault
	user   string
	from   string
	to     []string
}

// failAt returns the session's fault at phase, closing the connection for a Drop; nil otherwise.
func (s *session) failAt(phase Phase) error {
	if s.fault == nil || s.fault.Phase != phase {
		return nil
	}
	if s.fault.Drop {
		_ = s.conn.Conn().Close()
		return errors.New("connection dropped")
	}
	return s.fault.error()
}

// AuthMechanisms implements smtp.AuthSession.
func (s *session) AuthMechanisms() []string {
	if s.server.config.Username == "" {
		return nil
	}
	if len(s.server.config.Mechanisms) > 0 {
		return s.server.config.Mechanisms
	}
	return []string{sasl.Plain, sasl.Login}
}

// Auth implements smtp.AuthSession.
func (s *session) Auth(mech string) (sasl.Server, error) {
	check := func(username, password string) error {
		if username != s.server.config.Username || password != s.server.config.Password {
			return smtp.ErrAuthFailed
		}
		s.user = username
		return nil
	}
	switch mech {
	case sasl.Plain:
		return sasl.NewPlainServer(func(_, username, password string) error { return check(username, password) }), nil
	case sasl.Login:
		return &loginServer{check: check}, nil
	}
	return nil, smtp.ErrAuthUnknownMechanism
}

// Mail implements smtp.Session.
func (s *session) Mail(from string, _ *smtp.MailOptions) error {
	if s.server.config.Username != "" && s.user == "" {
		return smtp.ErrAuthRequired
	}
	if err := s.failAt(PhaseMailFrom); err != nil {
		return err
	}
	s.from = from
	return nil
}

// Rcpt implements smtp.Session.
func (s *session) Rcpt(to string, _ *smtp.RcptOptions) error {
	if err := s.failAt(PhaseRcptTo); err != nil {
		return err
	}
	s.to = append(s.to, to)
	return nil
}

// Data implements smtp.Session: go-smtp has answered DATA's 354 already, and replies to the
// content's end with what it returns.
func (s *session) Data(r io.Reader) error {
	data, err := io.ReadAll(r)
	if err != nil {
		return err
	}
	_, isTLS := s.conn.TLSConnectionState()
	message := &Message{
		From:       s.from,
		To:         append([]string(nil), s.to...),
		Data:       data,
		TLS:        isTLS,
		User:       s.user,
		ReceivedAt: s.server.now(),
	}
	s.server.mu.Lock()
	s.server.received = append(s.server.received, message)
	s.server.mu.Unlock()

	if s.server.config.BeforeReplyFunc != nil {
		s.server.config.BeforeReplyFunc(message)
	}
	if err := s.failAt(PhaseEndOfData); err != nil {
		return err
	}
	s.server.mu.Lock()
	message.Accepted = true
	s.server.mu.Unlock()
	return nil
}

// Reset implements smtp.Session.
func (s *session) Reset() { s.from, s.to = "", nil }

// Logout implements smtp.Session.
func (s *session) Logout() error { return nil }

// loginServer is the server side of AUTH LOGIN (a user name, then a password, each asked for),
// which go-sasl does not provide.
type loginServer struct {
	check    func(username, password string) error
	username string
	step     int
}

// Next implements sasl.Server.
func (l *loginServer) Next(response []byte) ([]byte, bool, error) {
	switch l.step {
	case 0:
		l.step++
		if len(response) > 0 { // the user name given with AUTH LOGIN
			l.username = string(response)
			l.step++
			return []byte("Password:"), false, nil
		}
		return []byte("Username:"), false, nil
	case 1:
		l.step++
		l.username = string(response)
		return []byte("Password:"), false, nil
	default:
		return nil, true, l.check(l.username, string(response))
	}
}

// Parsed is a received message read as a mail client would: its headers, and its plain-text and
// HTML parts decoded from their transfer encoding, their line breaks back from the CRLF of text
// on the wire (RFC 2046's canonical form) to the "\n" of the content that was sent.
type Parsed struct {
	Header netmail.Header
	Text   string
	HTML   string
}

// Parse reads the message's content: a multipart/alternative of text/plain and text/html (or a
// single part of either), quoted-printable, base64 or unencoded.
func (m *Message) Parse() (*Parsed, error) {
	msg, err := netmail.ReadMessage(bytes.NewReader(m.Data))
	if err != nil {
		return nil, fmt.Errorf("error reading the message: %w", err)
	}
	parsed := &Parsed{Header: msg.Header}
	mediaType, params, err := mime.ParseMediaType(msg.Header.Get("Content-Type"))
	if err != nil {
		return nil, fmt.Errorf("error reading Content-Type: %w", err)
	}
	if !strings.HasPrefix(mediaType, "multipart/") {
		return parsed, parsed.addPart(mediaType, msg.Header.Get("Content-Transfer-Encoding"), msg.Body)
	}
	reader := multipart.NewReader(msg.Body, params["boundary"])
	for {
		part, err := reader.NextRawPart()
		if errors.Is(err, io.EOF) {
			return parsed, nil
		}
		if err != nil {
			return nil, fmt.Errorf("error reading a part: %w", err)
		}
		partType, _, err := mime.ParseMediaType(part.Header.Get("Content-Type"))
		if err != nil {
			return nil, fmt.Errorf("error reading a part's Content-Type: %w", err)
		}
		if err := parsed.addPart(partType, part.Header.Get("Content-Transfer-Encoding"), part); err != nil {
			return nil, err
		}
	}
}

func (p *Parsed) addPart(mediaType, encoding string, body io.Reader) error {
	switch strings.ToLower(encoding) {
	case "quoted-printable":
		body = quotedprintable.NewReader(body)
	case "base64":
		return errors.New("base64 parts are not read by smtpfake")
	}
	content, err := io.ReadAll(body)
	if err != nil {
		return fmt.Errorf("error decoding a %s part: %w", mediaType, err)
	}
	text := strings.ReplaceAll(string(content), "\r\n", "\n")
	switch mediaType {
	case "text/plain":
		p.Text = text
	case "text/html":
		p.HTML = text
	}
	return nil
}

// Subject is the message's decoded Subject header.
func (p *Parsed) Subject() string {
	subject, err := new(mime.WordDecoder).DecodeHeader(p.Header.Get("Subject"))
	if err != nil {
		return p.Header.Get("Subject")
	}
	return subject
}
