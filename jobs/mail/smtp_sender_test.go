package mail

import (
	"context"
	"crypto/tls"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/postguard/postguard/jobs/mail/smtpfake"
)

func TestParseSMTPURL(t *testing.T) {
	t.Parallel()

	for _, tt := range []struct {
		name string
		raw  string
		want SMTPURL
	}{
		{"ImplicitTLS", "smtps://user:pass@smtp.example.com", SMTPURL{Scheme: SMTPSchemeTLS, Host: "smtp.example.com", Port: 465, Username: "user", Password: "pass"}},
		{"STARTTLS", "smtp://apikey:secret@smtp.example.com", SMTPURL{Scheme: SMTPSchemeStartTLS, Host: "smtp.example.com", Port: 587, Username: "apikey", Password: "secret"}},
		{"Insecure", "smtp+insecure://localhost", SMTPURL{Scheme: SMTPSchemeInsecure, Host: "localhost", Port: 25}},
		{"Port", "smtp://relay.internal:2525", SMTPURL{Scheme: SMTPSchemeStartTLS, Host: "relay.internal", Port: 2525}},
		{"PercentDecoded", "smtps://me%40example.com:p%40ss%3Aw%2Ford@smtp.example.com:465/", SMTPURL{Scheme: SMTPSchemeTLS, Host: "smtp.example.com", Port: 465, Username: "me@example.com", Password: "p@ss:w/ord"}},
		{"IPv6", "smtp+insecure://[::1]:1025", SMTPURL{Scheme: SMTPSchemeInsecure, Host: "::1", Port: 1025}},
		{"SchemeCase", "SMTPS://smtp.example.com", SMTPURL{Scheme: SMTPSchemeTLS, Host: "smtp.example.com", Port: 465}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()

			got, err := ParseSMTPURL(tt.raw)
			require.NoError(t, err)
			require.Equal(t, &tt.want, got)
		})
	}

	t.Run("Refused", func(t *testing.T) {
		t.Parallel()

		const password = "hunter2-Secret"
		for _, raw := range []string{
			"",
			"http://user:" + password + "@smtp.example.com",
			"smtp://user:" + password + "@",
			"smtp://user:" + password + "@smtp.example.com:0",
			"smtp://user:" + password + "@smtp.example.com:70000",
			"smtp://user:" + password + "@smtp.example.com:port",
			"smtp://user:" + password + "@smtp.example.com/path",
			"smtp://user:" + password + "@smtp.example.com?tls=off",
			"smtp://:" + password + "@smtp.example.com",
			"smtp+insecure://user:" + password + "@relay.internal",
			"smtp://user:" + password + "%zz@smtp.example.com",
			"smtp://user:" + password + "@smtp example.com",
		} {
			_, err := ParseSMTPURL(raw)
			require.Error(t, err, raw)
			require.NotContains(t, err.Error(), password, "an error never quotes the password")
		}
	})
}

func TestSMTPURL_Redacted(t *testing.T) {
	t.Parallel()

	u, err := ParseSMTPURL("smtp://me%40example.com:secret@smtp.example.com")
	require.NoError(t, err)
	require.Equal(t, "smtp://me%40example.com@smtp.example.com:587", u.Redacted())
	u, err = ParseSMTPURL("smtp+insecure://[::1]:1025")
	require.NoError(t, err)
	require.Equal(t, "smtp+insecure://[::1]:1025", u.Redacted())
}

func TestMessageID(t *testing.T) {
	t.Parallel()

	id := MessageID("welcome_email:7:00112233445566778899aabbccddeeff", "example.com")
	require.Regexp(t, `^<[0-9a-f]{32}@example\.com>$`, id)
	require.Equal(t, id, MessageID("welcome_email:7:00112233445566778899aabbccddeeff", "example.com"), "the same key, the same id")
	require.NotEqual(t, id, MessageID("welcome_email:7:ffeeddccbbaa99887766554433221100", "example.com"))
	require.NotContains(t, id, "welcome", "the id says nothing of the mail")
}

func TestSMTPSender_Send(t *testing.T) {
	t.Parallel()

	type testBundle struct {
		fake   *smtpfake.Server
		sender *SMTPSender
	}

	// setup starts a fake with fakeConfig and a sender on scheme to it, trusting its certificate.
	setup := func(t *testing.T, scheme string, fakeConfig *smtpfake.Config, configure func(config *SMTPConfig)) *testBundle {
		t.Helper()

		fake := smtpfake.New(t, fakeConfig)
		u, err := ParseSMTPURL(fake.URL(scheme))
		require.NoError(t, err)
		config := &SMTPConfig{
			URL:       u,
			From:      "Postguard <no-reply@example.com>",
			TLSConfig: fake.ClientTLSConfig(),
			Timeout:   10 * time.Second,
			HelloName: "worker.test",
		}
		if configure != nil {
			configure(config)
		}
		sender, err := NewSMTPSender(config)
		require.NoError(t, err)
		return &testBundle{fake: fake, sender: sender}
	}

	message := func(key string) *Message {
		return &Message{
			To:      "ada@example.org",
			Subject: "Bienvenue, Ada — votre compte",
			HTML:    "<p>Bonjour Ada,</p><p><a href=\"https://app.example.com/v1/unsubscribe?token=7.abc\">Se désabonner</a></p>\n",
			Text:    "Bonjour Ada,\n\nSe désabonner : https://app.example.com/v1/unsubscribe?token=7.abc\n",
			Headers: map[string]string{
				"List-Unsubscribe":      "<https://app.example.com/v1/unsubscribe?token=7.abcdefghijklmnopqrstuvwxyz0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ>",
				"List-Unsubscribe-Post": "List-Unsubscribe=One-Click",
			},
			IdempotencyKey: key,
			Kind:           "welcome_email",
		}
	}

	// requireSame checks that the fake's one accepted message is msg, sent under id.
	requireSame := func(t *testing.T, fake *smtpfake.Server, msg *Message, id string) smtpfake.Message {
		t.Helper()

		messages := fake.Messages()
		require.Len(t, messages, 1)
		got := messages[0]
		require.Equal(t, "no-reply@example.com", got.From)
		require.Equal(t, []string{msg.To}, got.To)
		parsed, err := got.Parse()
		require.NoError(t, err)
		require.Equal(t, id, parsed.Header.Get("Message-Id"))
		require.Equal(t, msg.Subject, parsed.Subject())
		require.Equal(t, msg.Text, parsed.Text)
		require.Equal(t, msg.HTML, parsed.HTML)
		for name, value := range msg.Headers {
			require.Equal(t, value, parsed.Header.Get(name), name)
		}
		require.Empty(t, parsed.Header.Get("User-Agent"), "no library banner")
		require.Empty(t, parsed.Header.Get("X-Mailer"))
		return got
	}

	t.Run("STARTTLSWithAuth", func(t *testing.T) {
		t.Parallel()

		bundle := setup(t, SMTPSchemeStartTLS, &smtpfake.Config{Username: "postguard", Password: "p@ss:word"}, nil)
		msg := message("welcome_email:7:0011")
		id, err := bundle.sender.Send(t.Context(), msg)
		require.NoError(t, err)
		require.Equal(t, MessageID(msg.IdempotencyKey, "example.com"), id)

		got := requireSame(t, bundle.fake, msg, id)
		require.True(t, got.TLS, "STARTTLS before anything else")
		require.Equal(t, "postguard", got.User)
	})

	t.Run("LoginOnlyServer", func(t *testing.T) {
		t.Parallel()

		bundle := setup(t, SMTPSchemeStartTLS, &smtpfake.Config{Username: "postguard", Password: "secret", Mechanisms: []string{"LOGIN"}}, nil)
		id, err := bundle.sender.Send(t.Context(), message("k1"))
		require.NoError(t, err)
		require.Equal(t, "postguard", requireSame(t, bundle.fake, message("k1"), id).User)
	})

	t.Run("ImplicitTLS", func(t *testing.T) {
		t.Parallel()

		bundle := setup(t, SMTPSchemeTLS, &smtpfake.Config{ImplicitTLS: true, Username: "postguard", Password: "secret"}, nil)
		id, err := bundle.sender.Send(t.Context(), message("k1"))
		require.NoError(t, err)
		got := requireSame(t, bundle.fake, message("k1"), id)
		require.True(t, got.TLS)
		require.Equal(t, "postguard", got.User)
	})

	t.Run("Insecure", func(t *testing.T) {
		t.Parallel()

		bundle := setup(t, SMTPSchemeInsecure, &smtpfake.Config{NoSTARTTLS: true}, nil)
		id, err := bundle.sender.Send(t.Context(), message("k1"))
		require.NoError(t, err)
		require.False(t, requireSame(t, bundle.fake, message("k1"), id).TLS)
	})

	t.Run("SameMessageIDOnEverySend", func(t *testing.T) {
		t.Parallel()

		bundle := setup(t, SMTPSchemeStartTLS, nil, nil)
		bundle.fake.Enqueue(smtpfake.Fault{Phase: smtpfake.PhaseEndOfData, Drop: true})
		_, err := bundle.sender.Send(t.Context(), message("k1"))
		require.Error(t, err)
		id, err := bundle.sender.Send(t.Context(), message("k1"))
		require.NoError(t, err)

		received := bundle.fake.Received()
		require.Len(t, received, 2, "the dropped send and the retry")
		for _, m := range received {
			parsed, err := m.Parse()
			require.NoError(t, err)
			require.Equal(t, id, parsed.Header.Get("Message-Id"))
		}
	})

	t.Run("NoSTARTTLSNothingSent", func(t *testing.T) {
		t.Parallel()

		bundle := setup(t, SMTPSchemeStartTLS, &smtpfake.Config{NoSTARTTLS: true, Username: "postguard", Password: "secret"}, nil)
		_, err := bundle.sender.Send(t.Context(), message("k1"))
		smtpErr := requireSMTPError(t, err, SMTPPhaseConnect, 0, "")
		require.Contains(t, smtpErr.Error(), "STARTTLS")
		require.Equal(t, Outcome{Action: ActionRetry, Outage: true}, Classify(err))
		require.Equal(t, 1, bundle.fake.Sessions())
		require.Empty(t, bundle.fake.Received(), "no mail, and no password, in clear")
	})

	t.Run("UntrustedCertificateNothingSent", func(t *testing.T) {
		t.Parallel()

		bundle := setup(t, SMTPSchemeStartTLS, nil, func(config *SMTPConfig) {
			config.TLSConfig = &tls.Config{MinVersion: tls.VersionTLS12} // the system's roots
		})
		_, err := bundle.sender.Send(t.Context(), message("k1"))
		_ = requireSMTPError(t, err, SMTPPhaseConnect, 0, "")
		require.Equal(t, Outcome{Action: ActionRetry, Outage: true}, Classify(err))
		require.Empty(t, bundle.fake.Received())
	})

	t.Run("WrongPassword", func(t *testing.T) {
		t.Parallel()

		bundle := setup(t, SMTPSchemeStartTLS, &smtpfake.Config{Username: "postguard", Password: "secret"}, func(config *SMTPConfig) {
			config.URL.Password = "wrong"
		})
		_, err := bundle.sender.Send(t.Context(), message("k1"))
		_ = requireSMTPError(t, err, SMTPPhaseConnect, 535, "5.7.8")
		require.NotContains(t, err.Error(), "wrong")
		require.Equal(t, Outcome{Action: ActionRetry, Outage: true}, Classify(err))
		require.Empty(t, bundle.fake.Received())
	})

	t.Run("RefusedConnection", func(t *testing.T) {
		t.Parallel()

		bundle := setup(t, SMTPSchemeStartTLS, nil, nil)
		bundle.fake.Close()
		_, err := bundle.sender.Send(t.Context(), message("k1"))
		_ = requireSMTPError(t, err, SMTPPhaseConnect, 0, "")
		require.Equal(t, Outcome{Action: ActionRetry, Outage: true}, Classify(err))
	})

	t.Run("Replies", func(t *testing.T) {
		t.Parallel()

		for _, tt := range []struct {
			name         string
			fault        smtpfake.Fault
			phase        SMTPPhase
			code         int
			enhanced     string
			want         Outcome
			wantReceived bool
		}{
			{
				name:  "GreetingUnavailable",
				fault: smtpfake.Fault{Phase: smtpfake.PhaseHello, Code: 421, EnhancedCode: [3]int{4, 3, 2}},
				phase: SMTPPhaseConnect, code: 421, enhanced: "4.3.2",
				want: Outcome{Action: ActionRetry, Outage: true},
			},
			{
				name:  "MailFromTemporary",
				fault: smtpfake.Fault{Phase: smtpfake.PhaseMailFrom, Code: 451, EnhancedCode: [3]int{4, 3, 0}},
				phase: SMTPPhaseMailFrom, code: 451, enhanced: "4.3.0",
				want: Outcome{Action: ActionRetry, Outage: true},
			},
			{
				name:  "RcptTemporary",
				fault: smtpfake.Fault{Phase: smtpfake.PhaseRcptTo, Code: 450, EnhancedCode: [3]int{4, 2, 1}},
				phase: SMTPPhaseRcptTo, code: 450, enhanced: "4.2.1",
				want: Outcome{Action: ActionRetry, Outage: true},
			},
			{
				name:  "RcptUnknownUser",
				fault: smtpfake.Fault{Phase: smtpfake.PhaseRcptTo, Code: 550, EnhancedCode: [3]int{5, 1, 1}, Message: "<ada@example.org>: no such user"},
				phase: SMTPPhaseRcptTo, code: 550, enhanced: "5.1.1",
				want: Outcome{Action: ActionCancel, Bounce: &Bounce{Detail: "SMTP 550 5.1.1"}},
			},
			{
				name:  "RcptRelayDenied",
				fault: smtpfake.Fault{Phase: smtpfake.PhaseRcptTo, Code: 554, EnhancedCode: [3]int{5, 7, 1}, Message: "Relay access denied"},
				phase: SMTPPhaseRcptTo, code: 554, enhanced: "5.7.1",
				want: Outcome{Action: ActionRetry, Outage: true},
			},
			{
				name:  "EndOfDataTemporary",
				fault: smtpfake.Fault{Phase: smtpfake.PhaseEndOfData, Code: 451, EnhancedCode: [3]int{4, 3, 0}},
				phase: SMTPPhaseEndOfData, code: 451, enhanced: "4.3.0",
				want: Outcome{Action: ActionRetry, Outage: true}, wantReceived: true,
			},
			{
				name:  "EndOfDataRefused",
				fault: smtpfake.Fault{Phase: smtpfake.PhaseEndOfData, Code: 554, EnhancedCode: [3]int{5, 6, 0}, Message: "content refused"},
				phase: SMTPPhaseEndOfData, code: 554, enhanced: "5.6.0",
				want: Outcome{Action: ActionCancel}, wantReceived: true,
			},
			{
				name:  "ConnectionLostAfterData",
				fault: smtpfake.Fault{Phase: smtpfake.PhaseEndOfData, Drop: true},
				phase: SMTPPhaseEndOfData,
				want:  Outcome{Action: ActionRetry, Outage: true, MaybeAccepted: true}, wantReceived: true,
			},
		} {
			t.Run(tt.name, func(t *testing.T) {
				t.Parallel()

				bundle := setup(t, SMTPSchemeStartTLS, nil, nil)
				bundle.fake.Enqueue(tt.fault)
				msg := message("k1")
				_, err := bundle.sender.Send(t.Context(), msg)
				smtpErr := requireSMTPError(t, err, tt.phase, tt.code, tt.enhanced)
				require.Equal(t, MessageID(msg.IdempotencyKey, "example.com"), smtpErr.MessageID)
				require.NotContains(t, err.Error(), msg.To, "the error never names the recipient")
				if tt.want.Bounce != nil {
					tt.want.Bounce.EmailID = smtpErr.MessageID
				}
				require.Equal(t, tt.want, Classify(err))
				require.Empty(t, bundle.fake.Messages(), "nothing accepted")
				require.Equal(t, tt.wantReceived, len(bundle.fake.Received()) == 1, "whether the content reached the server")
			})
		}
	})

	t.Run("ContextCanceledClosesTheConnection", func(t *testing.T) {
		t.Parallel()

		ctx, cancel := context.WithCancel(t.Context())
		release := make(chan struct{})
		bundle := setup(t, SMTPSchemeStartTLS, &smtpfake.Config{
			// The server has the mail and holds its reply: only the cancelled context can end
			// the send.
			BeforeReplyFunc: func(*smtpfake.Message) {
				cancel()
				<-release
			},
		}, nil)
		t.Cleanup(func() { close(release) }) // before the fake's Close, which waits for its sessions

		_, err := bundle.sender.Send(ctx, message("k1"))
		require.ErrorIs(t, err, context.Canceled, "shutdown must stay recognisable")
		_ = requireSMTPError(t, err, SMTPPhaseEndOfData, 0, "")
		require.Equal(t, Outcome{Action: ActionRetry, Outage: true, MaybeAccepted: true}, Classify(err))
	})

	t.Run("InvalidMessage", func(t *testing.T) {
		t.Parallel()

		bundle := setup(t, SMTPSchemeStartTLS, nil, nil)
		for name, edit := range map[string]func(m *Message){
			"NoRecipient":    func(m *Message) { m.To = " " },
			"NotAnAddress":   func(m *Message) { m.To = "not an address" },
			"NoKey":          func(m *Message) { m.IdempotencyKey = "" },
			"HeaderInjected": func(m *Message) { m.Headers["List-Unsubscribe"] = "<https://a.example>\r\nBcc: eve@example.com" },
			"ReservedHeader": func(m *Message) { m.Headers["bcc"] = "eve@example.com" },
			"BadHeaderName":  func(m *Message) { m.Headers["X Bad"] = "1" },
		} {
			msg := message("k1")
			edit(msg)
			_, err := bundle.sender.Send(t.Context(), msg)
			require.ErrorIs(t, err, ErrInvalidMessage, name)
			require.Equal(t, Outcome{Action: ActionCancel}, Classify(err), name)
		}
		require.Zero(t, bundle.fake.Sessions(), "nothing dialled")
	})

	t.Run("ConcurrentSends", func(t *testing.T) {
		t.Parallel()

		bundle := setup(t, SMTPSchemeStartTLS, nil, nil)
		errs := make(chan error, 8)
		for i := range 8 {
			go func() {
				_, err := bundle.sender.Send(t.Context(), message("k"+strings.Repeat("x", i)))
				errs <- err
			}()
		}
		for range 8 {
			require.NoError(t, <-errs)
		}
		require.Len(t, bundle.fake.Messages(), 8)
	})
}

func TestNewSMTPSender(t *testing.T) {
	t.Parallel()

	u, err := ParseSMTPURL("smtp://relay.example.com")
	require.NoError(t, err)
	for _, tt := range []struct {
		name   string
		config *SMTPConfig
		want   string
	}{
		{"NoConfig", nil, "SMTP_URL"},
		{"NoURL", &SMTPConfig{From: "a@example.com"}, "SMTP_URL"},
		{"NoFrom", &SMTPConfig{URL: u}, "MAIL_FROM"},
		{"BadFrom", &SMTPConfig{URL: u, From: "not an address"}, "not an address"},
		{"NegativeTimeout", &SMTPConfig{URL: u, From: "a@example.com", Timeout: -time.Second}, "negative"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()

			_, err := NewSMTPSender(tt.config)
			require.ErrorContains(t, err, tt.want)
		})
	}
}

// requireSMTPError checks err is an *SMTPError at phase with the reply code and enhanced code.
func requireSMTPError(t *testing.T, err error, phase SMTPPhase, code int, enhanced string) *SMTPError {
	t.Helper()

	smtpErr, ok := errors.AsType[*SMTPError](err)
	require.True(t, ok, "%T %v", err, err)
	require.Equal(t, phase, smtpErr.Phase, "%v", err)
	require.Equal(t, code, smtpErr.Code, "%v", err)
	require.Equal(t, enhanced, smtpErr.EnhancedCode, "%v", err)
	return smtpErr
}
