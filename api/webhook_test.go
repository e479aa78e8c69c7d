package api

import (
	"bytes"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/postguard/postguard/db"
	"github.com/postguard/postguard/email"
	"github.com/postguard/postguard/internal/dbtest"
	"github.com/postguard/postguard/internal/riverstore"
	"github.com/postguard/postguard/jobs/mail"
	"github.com/postguard/postguard/jobs/mail/resendfake"
	"github.com/postguard/postguard/tokens"
)

const webhookPath = "/v1/webhooks/resend"

// webhookBundle is a router with the webhook mounted under the secret of a resendfake, and a
// user with one accepted mail to send events about.
type webhookBundle struct {
	*testBundle
	fake     *resendfake.Server
	user     *db.User
	jobID    int64
	delivery resendfake.Delivery
}

// setupWebhook builds a webhookBundle on store. The user's address is stored normalised, as
// register stores it.
func setupWebhook(t *testing.T, store riverstore.Store, opts *setupOpts) *webhookBundle {
	t.Helper()
	if opts == nil {
		opts = &setupOpts{}
	}
	fake := resendfake.New(t, nil)
	configFunc := opts.configFunc
	opts.configFunc = func(config *Config) {
		config.ResendWebhookSecret = fake.WebhookSecret()
		if configFunc != nil {
			configFunc(config)
		}
	}
	bundle := setup(t, store, opts)
	user := insertUser(t, store, strings.ToLower(uniqueEmail("hook")), false)
	jobID, delivery := acceptedMessage(t, store, user, "verification_email")
	return &webhookBundle{testBundle: bundle, fake: fake, user: user, jobID: jobID, delivery: delivery}
}

var jobSeq struct {
	sync.Mutex
	n int64
}

// acceptedMessage gives user a message row of kind that the provider accepted, as a worker would
// have recorded it, and returns its job id and the delivery Resend would know it by.
func acceptedMessage(t *testing.T, store riverstore.Store, user *db.User, kind string) (int64, resendfake.Delivery) {
	t.Helper()
	jobSeq.Lock()
	jobSeq.n++
	jobID := 1_000_000 + jobSeq.n
	jobSeq.Unlock()

	now := time.Now()
	_, err := store.EmailMessageInsert(t.Context(), &db.EmailMessageInsertParams{
		JobID: jobID, Kind: kind, UserID: user.ID, IdempotencyKey: tokens.IdempotencyKey(kind, user.ID), Now: now,
	})
	require.NoError(t, err)
	delivery := resendfake.Delivery{
		ID:         "re_" + strings.ToLower(tokens.New()[:20]),
		From:       "Postguard <no-reply@example.com>",
		To:         []string{user.Email},
		Subject:    "Verify your email",
		ReceivedAt: now,
	}
	require.NoError(t, store.EmailMessageMarkAccepted(t.Context(), &db.EmailMessageMarkAcceptedParams{JobID: jobID, Provider: "resend", ProviderID: delivery.ID, Now: now}))
	return jobID, delivery
}

// post sends webhook through the router, signed by the fake.
func (b *webhookBundle) post(t *testing.T, webhook *resendfake.Webhook) *httptest.ResponseRecorder {
	t.Helper()
	return postWebhook(t, b.router, b.fake, webhook)
}

func postWebhook(t *testing.T, router http.Handler, fake *resendfake.Server, webhook *resendfake.Webhook) *httptest.ResponseRecorder {
	t.Helper()
	req, err := fake.WebhookRequest(t.Context(), webhookPath, webhook)
	require.NoError(t, err)
	return serve(t, router, req)
}

// event builds an event of eventType about the bundle's delivery.
func (b *webhookBundle) event(eventType string, opts *resendfake.EventOpts) *resendfake.Webhook {
	return b.fake.Event(b.delivery, eventType, opts)
}

func (b *webhookBundle) message(t *testing.T) *db.EmailMessage {
	t.Helper()
	message, err := b.store.EmailMessageGetByJob(t.Context(), b.jobID)
	require.NoError(t, err)
	return message
}

func (b *webhookBundle) suppression(t *testing.T) (*db.EmailSuppression, bool) {
	t.Helper()
	address, err := email.Normalize(b.user.Email)
	require.NoError(t, err)
	suppression, err := b.store.EmailSuppressionGet(t.Context(), email.SuppressionKey(testSecret, address))
	if err != nil {
		require.ErrorIs(t, err, db.ErrNotFound)
		return nil, false
	}
	return suppression, true
}

// events reads postguard_email_events_total{type,outcome}.
func events(t testing.TB, registry *prometheus.Registry, eventType, outcome string) float64 {
	t.Helper()
	families, err := registry.Gather()
	require.NoError(t, err)
	for _, family := range families {
		if family.GetName() != "postguard_email_events_total" {
			continue
		}
		for _, metric := range family.GetMetric() {
			labels := map[string]string{}
			for _, label := range metric.GetLabel() {
				labels[label.GetName()] = label.GetValue()
			}
			if labels["type"] == eventType && labels["outcome"] == outcome {
				return metric.GetCounter().GetValue()
			}
		}
	}
	return 0
}

// readBody reads req's body and leaves it in place.
func readBody(t *testing.T, req *http.Request) []byte {
	t.Helper()
	body, err := io.ReadAll(req.Body)
	require.NoError(t, err)
	setBody(req, body)
	return body
}

func setBody(req *http.Request, body []byte) {
	req.Body, req.ContentLength = io.NopCloser(bytes.NewReader(body)), int64(len(body))
}

// ms is t as Resend gives event times: to the millisecond.
func ms(t time.Time) time.Time { return t.UTC().Truncate(time.Millisecond) }

// resignTimestamp sets req's svix-timestamp to timestamp, as written, and signs the delivery
// anew over it with the right secret.
func resignTimestamp(t *testing.T, bundle *webhookBundle, req *http.Request, timestamp string) {
	t.Helper()
	entry, err := resendfake.SignWebhookHeader(bundle.fake.WebhookSecret(), req.Header.Get("svix-id"), timestamp, readBody(t, req))
	require.NoError(t, err)
	req.Header.Set("svix-timestamp", timestamp)
	req.Header.Set("svix-signature", entry)
}

func requireTime(t *testing.T, want time.Time, got *time.Time, msgAndArgs ...any) {
	t.Helper()
	require.NotNil(t, got, msgAndArgs...)
	require.True(t, want.Equal(*got), "want %s, got %s", want, *got)
}

func TestResendWebhook_Signatures(t *testing.T) {
	t.Parallel()

	dbtest.Engines(t, func(t *testing.T, newStore dbtest.NewStoreFunc) {
		t.Run("NotMountedWithoutSecret", func(t *testing.T) {
			t.Parallel()

			bundle := setup(t, newStore(t), nil)
			fake := resendfake.New(t, nil)
			webhook := fake.Event(resendfake.Delivery{ID: "re_1", To: []string{"ada@example.com"}}, resendfake.EventDelivered, nil)
			decodeProblem(t, postWebhook(t, bundle.router, fake, webhook), http.StatusNotFound)
		})

		t.Run("Signed", func(t *testing.T) {
			t.Parallel()

			bundle := setupWebhook(t, newStore(t), nil)
			rec := bundle.post(t, bundle.event(resendfake.EventDelivered, nil))
			require.Equal(t, http.StatusNoContent, rec.Code, rec.Body.String())
			require.Empty(t, rec.Body.String())
			require.Equal(t, email.StatusDelivered, bundle.message(t).Status)
			require.Equal(t, float64(1), events(t, bundle.registry, mail.ResendEventDelivered, EventApplied))
		})

		// Each refusal is a 401 that changes nothing: the message keeps its status, and the
		// delivery's id is not recorded, so the genuine delivery with that id applies after.
		for _, tt := range []struct {
			name   string
			tamper func(t *testing.T, bundle *webhookBundle, req *http.Request)
		}{
			{"BodyChanged", func(t *testing.T, _ *webhookBundle, req *http.Request) {
				setBody(req, bytes.Replace(readBody(t, req), []byte(resendfake.EventDelivered), []byte(resendfake.EventComplained), 1))
			}},
			{"SignatureMissing", func(_ *testing.T, _ *webhookBundle, req *http.Request) { req.Header.Del("svix-signature") }},
			{"IDMissing", func(_ *testing.T, _ *webhookBundle, req *http.Request) { req.Header.Del("svix-id") }},
			{"TimestampMissing", func(_ *testing.T, _ *webhookBundle, req *http.Request) { req.Header.Del("svix-timestamp") }},
			{"NoHeadersAtAll", func(_ *testing.T, _ *webhookBundle, req *http.Request) {
				req.Header.Del("svix-signature")
				req.Header.Del("svix-id")
				req.Header.Del("svix-timestamp")
			}},
			{"OtherSecret", func(t *testing.T, bundle *webhookBundle, req *http.Request) {
				other := resendfake.New(t, nil)
				signed, err := other.WebhookRequest(t.Context(), webhookPath, &resendfake.Webhook{
					ID: req.Header.Get("svix-id"), SignedAt: time.Now(), Body: readBody(t, req),
				})
				require.NoError(t, err)
				req.Header.Set("svix-signature", signed.Header.Get("svix-signature"))
				req.Header.Set("svix-timestamp", signed.Header.Get("svix-timestamp"))
			}},
			{"SignatureGarbled", func(_ *testing.T, _ *webhookBundle, req *http.Request) {
				req.Header.Set("svix-signature", "v1,"+strings.Repeat("A", 44))
			}},
			// Right secret, right bytes, but not Svix's syntax: another version's entry, an
			// entry without a version, a timestamp with a sign or leading zeros (each signed
			// over exactly what it carries).
			{"V1aEntry", func(_ *testing.T, _ *webhookBundle, req *http.Request) {
				req.Header.Set("svix-signature", strings.Replace(req.Header.Get("svix-signature"), "v1,", "v1a,", 1))
			}},
			{"V2Entry", func(_ *testing.T, _ *webhookBundle, req *http.Request) {
				req.Header.Set("svix-signature", strings.Replace(req.Header.Get("svix-signature"), "v1,", "v2,", 1))
			}},
			{"UnversionedEntry", func(_ *testing.T, _ *webhookBundle, req *http.Request) {
				req.Header.Set("svix-signature", strings.Replace(req.Header.Get("svix-signature"), "v1,", ",", 1))
			}},
			{"PlusTimestamp", func(t *testing.T, bundle *webhookBundle, req *http.Request) {
				resignTimestamp(t, bundle, req, "+"+req.Header.Get("svix-timestamp"))
			}},
			{"ZeroPaddedTimestamp", func(t *testing.T, bundle *webhookBundle, req *http.Request) {
				resignTimestamp(t, bundle, req, "000"+req.Header.Get("svix-timestamp"))
			}},
		} {
			t.Run(tt.name, func(t *testing.T) {
				t.Parallel()

				bundle := setupWebhook(t, newStore(t), nil)
				webhook := bundle.event(resendfake.EventDelivered, nil)
				req, err := bundle.fake.WebhookRequest(t.Context(), webhookPath, webhook)
				require.NoError(t, err)
				tt.tamper(t, bundle, req)
				decodeProblem(t, serve(t, bundle.router, req), http.StatusUnauthorized)
				require.Equal(t, email.StatusSent, bundle.message(t).Status)

				rec := bundle.post(t, webhook)
				require.Equal(t, http.StatusNoContent, rec.Code)
				require.Equal(t, email.StatusDelivered, bundle.message(t).Status)
			})
		}

		t.Run("Stale", func(t *testing.T) {
			t.Parallel()

			// A delivery signed six minutes ago (captured and replayed later, or a clock far
			// off): refused, even a complaint.
			bundle := setupWebhook(t, newStore(t), nil)
			stale := bundle.event(resendfake.EventComplained, &resendfake.EventOpts{SignedAt: time.Now().Add(-6 * time.Minute)})
			decodeProblem(t, bundle.post(t, stale), http.StatusUnauthorized)
			early := bundle.event(resendfake.EventComplained, &resendfake.EventOpts{SignedAt: time.Now().Add(6 * time.Minute)})
			decodeProblem(t, bundle.post(t, early), http.StatusUnauthorized)
			require.Equal(t, email.StatusSent, bundle.message(t).Status)
			_, suppressed := bundle.suppression(t)
			require.False(t, suppressed)

			// Signed again now (Resend signs each retry anew), it applies.
			stale.SignedAt = time.Now()
			require.Equal(t, http.StatusNoContent, bundle.post(t, stale).Code)
			require.Equal(t, email.StatusComplained, bundle.message(t).Status)
		})

		t.Run("Rotated", func(t *testing.T) {
			t.Parallel()

			// After a rotation Resend signs with the old and the new secret: a service still on
			// the old one, and one already on the new one, both take the delivery.
			store := newStore(t)
			oldBundle := setupWebhook(t, store, nil)
			newSecret := oldBundle.fake.RotateWebhookSecret()
			newBundle := setup(t, store, &setupOpts{configFunc: func(config *Config) { config.ResendWebhookSecret = newSecret }})

			rec := oldBundle.post(t, oldBundle.event(resendfake.EventDeliveryDelayed, nil))
			require.Equal(t, http.StatusNoContent, rec.Code)
			require.Equal(t, email.StatusDelayed, oldBundle.message(t).Status)
			rec = postWebhook(t, newBundle.router, oldBundle.fake, oldBundle.event(resendfake.EventDelivered, nil))
			require.Equal(t, http.StatusNoContent, rec.Code)
			require.Equal(t, email.StatusDelivered, oldBundle.message(t).Status)

			// A third secret's signature alone is refused.
			stranger := resendfake.New(t, nil)
			decodeProblem(t, postWebhook(t, newBundle.router, stranger, oldBundle.event(resendfake.EventComplained, nil)), http.StatusUnauthorized)
			require.Equal(t, email.StatusDelivered, oldBundle.message(t).Status)
		})
	})
}

func TestResendWebhook_Events(t *testing.T) {
	t.Parallel()

	dbtest.Engines(t, func(t *testing.T, newStore dbtest.NewStoreFunc) {
		t.Run("Lifecycle", func(t *testing.T) {
			t.Parallel()

			bundle := setupWebhook(t, newStore(t), nil)
			// Resend's clock a minute behind the workers': its email.sent comes before the
			// worker's record of the acceptance, and each later event still applies.
			start := ms(time.Now()).Add(-time.Minute)
			for i, step := range []struct {
				eventType string
				status    string
			}{
				{resendfake.EventSent, email.StatusSent},
				{resendfake.EventDeliveryDelayed, email.StatusDelayed},
				{resendfake.EventDelivered, email.StatusDelivered},
				{resendfake.EventComplained, email.StatusComplained},
			} {
				at := start.Add(time.Duration(i) * time.Second)
				rec := bundle.post(t, bundle.event(step.eventType, &resendfake.EventOpts{At: at}))
				require.Equal(t, http.StatusNoContent, rec.Code)
				message := bundle.message(t)
				require.Equal(t, step.status, message.Status, step.eventType)
				requireTime(t, at, message.StatusAt)
			}
			message := bundle.message(t)
			requireTime(t, start, message.SentAt, "Resend's email.sent time, earlier than the worker's")
			requireTime(t, start.Add(time.Second), message.DelayedAt)
			requireTime(t, start.Add(2*time.Second), message.DeliveredAt)
			requireTime(t, start.Add(3*time.Second), message.ComplainedAt)
			require.Nil(t, message.BouncedAt)
			require.Nil(t, message.FailedAt)
			require.Equal(t, float64(1), events(t, bundle.registry, mail.ResendEventComplained, EventApplied))
		})

		t.Run("OutOfOrder", func(t *testing.T) {
			t.Parallel()

			// Delivered at t2 arrives first; the delay of t1 and the send of t0 come after it:
			// they record their times and leave the status delivered. A complaint of t3 then
			// moves it on.
			bundle := setupWebhook(t, newStore(t), nil)
			t0 := ms(time.Now()).Add(-time.Minute) // before the worker's record of the acceptance
			t1, t2, t3 := t0.Add(time.Second), t0.Add(2*time.Second), t0.Add(3*time.Second)
			for _, ev := range []struct {
				eventType string
				at        time.Time
			}{{resendfake.EventDelivered, t2}, {resendfake.EventDeliveryDelayed, t1}, {resendfake.EventSent, t0}} {
				require.Equal(t, http.StatusNoContent, bundle.post(t, bundle.event(ev.eventType, &resendfake.EventOpts{At: ev.at})).Code)
			}
			message := bundle.message(t)
			require.Equal(t, email.StatusDelivered, message.Status)
			requireTime(t, t2, message.StatusAt)
			requireTime(t, t1, message.DelayedAt)
			requireTime(t, t0, message.SentAt)
			require.Equal(t, float64(1), events(t, bundle.registry, mail.ResendEventDeliveryDelayed, EventOutOfOrder))
			require.Equal(t, float64(1), events(t, bundle.registry, mail.ResendEventSent, EventOutOfOrder))

			// A second delay, later than the delivery (Resend would not, but a clock might): it
			// wins by time, and its status keeps the earliest delay's time.
			require.Equal(t, http.StatusNoContent, bundle.post(t, bundle.event(resendfake.EventComplained, &resendfake.EventOpts{At: t3})).Code)
			require.Equal(t, http.StatusNoContent, bundle.post(t, bundle.event(resendfake.EventDelivered, &resendfake.EventOpts{At: t1})).Code)
			message = bundle.message(t)
			require.Equal(t, email.StatusComplained, message.Status)
			requireTime(t, t1, message.DeliveredAt, "the earliest delivery")
			requireTime(t, t3, message.StatusAt)
		})

		t.Run("Ties", func(t *testing.T) {
			t.Parallel()

			// Events of one instant: the status later in a mail's life wins, whatever the order
			// they come in.
			bundle := setupWebhook(t, newStore(t), nil)
			at := ms(time.Now())
			for _, eventType := range []string{resendfake.EventComplained, resendfake.EventDelivered, resendfake.EventDeliveryDelayed, resendfake.EventSent} {
				require.Equal(t, http.StatusNoContent, bundle.post(t, bundle.event(eventType, &resendfake.EventOpts{At: at})).Code)
			}
			require.Equal(t, email.StatusComplained, bundle.message(t).Status)

			other := setupWebhook(t, newStore(t), nil)
			for _, eventType := range []string{resendfake.EventSent, resendfake.EventDeliveryDelayed, resendfake.EventDelivered, resendfake.EventComplained} {
				require.Equal(t, http.StatusNoContent, other.post(t, other.event(eventType, &resendfake.EventOpts{At: at})).Code)
			}
			require.Equal(t, email.StatusComplained, other.message(t).Status)
		})

		t.Run("ReplayWithAnotherBodyChangesNothing", func(t *testing.T) {
			t.Parallel()

			bundle := setupWebhook(t, newStore(t), nil)
			delivered := bundle.event(resendfake.EventDelivered, nil)
			require.Equal(t, http.StatusNoContent, bundle.post(t, delivered).Code)
			before := bundle.message(t)

			// The same svix-id, correctly signed, with another event and a later time: a
			// complaint that, were it new, would change the status and suppress the address.
			forged := bundle.event(resendfake.EventComplained, &resendfake.EventOpts{ID: delivered.ID, At: time.Now().Add(time.Hour)})
			rec := bundle.post(t, forged)
			require.Equal(t, http.StatusNoContent, rec.Code)
			require.Equal(t, before, bundle.message(t))
			_, suppressed := bundle.suppression(t)
			require.False(t, suppressed)
			// The same delivery again, byte for byte: nothing again.
			require.Equal(t, http.StatusNoContent, bundle.post(t, delivered).Code)
			require.Equal(t, before, bundle.message(t))
			require.Equal(t, float64(1), events(t, bundle.registry, mail.ResendEventComplained, EventReplayed))
			require.Equal(t, float64(1), events(t, bundle.registry, mail.ResendEventDelivered, EventReplayed))
			require.Equal(t, float64(1), events(t, bundle.registry, mail.ResendEventDelivered, EventApplied))
		})

		t.Run("ConcurrentDeliveriesOfOneEvent", func(t *testing.T) {
			t.Parallel()

			// Resend retrying a delivery while the first is still answered: one applies.
			bundle := setupWebhook(t, newStore(t), nil)
			webhook := bundle.event(resendfake.EventComplained, nil)
			var wg sync.WaitGroup
			for range 8 {
				wg.Go(func() {
					rec := bundle.post(t, webhook)
					require.Equal(t, http.StatusNoContent, rec.Code, rec.Body.String())
				})
			}
			wg.Wait()
			require.Equal(t, float64(1), events(t, bundle.registry, mail.ResendEventComplained, EventApplied))
			require.Equal(t, float64(7), events(t, bundle.registry, mail.ResendEventComplained, EventReplayed))
		})

		t.Run("UnknownType", func(t *testing.T) {
			t.Parallel()

			bundle := setupWebhook(t, newStore(t), nil)
			before := bundle.message(t)
			require.Equal(t, http.StatusNoContent, bundle.post(t, bundle.event(resendfake.EventOpened, nil)).Code)
			// A type of another kind, whose data names no email at all.
			contact := &resendfake.Webhook{ID: "msg_contact", SignedAt: time.Now(), Body: []byte(
				`{"type":"contact.created","created_at":"2026-03-01T12:00:00.000Z","data":{"id":"c_1","audience_id":"a_1","email":"` + bundle.user.Email + `","unsubscribed":false}}`)}
			require.Equal(t, http.StatusNoContent, bundle.post(t, contact).Code)

			require.Equal(t, before, bundle.message(t))
			require.Equal(t, float64(2), events(t, bundle.registry, "other", EventUnknownType))
		})

		t.Run("UnknownEmail", func(t *testing.T) {
			t.Parallel()

			// An event about mail postguard has no message for (another sender on the account,
			// or one pruned since): 204, counted, and nothing changes, not even for a complaint.
			bundle := setupWebhook(t, newStore(t), nil)
			stranger := resendfake.Delivery{ID: "re_unknown", To: bundle.delivery.To, ReceivedAt: time.Now()}
			for _, eventType := range []string{resendfake.EventDelivered, resendfake.EventComplained} {
				require.Equal(t, http.StatusNoContent, bundle.post(t, bundle.fake.Event(stranger, eventType, nil)).Code)
			}
			require.Equal(t, email.StatusSent, bundle.message(t).Status)
			_, suppressed := bundle.suppression(t)
			require.False(t, suppressed)
			require.Equal(t, float64(1), events(t, bundle.registry, mail.ResendEventDelivered, EventUnknownEmail))
			require.Equal(t, float64(1), events(t, bundle.registry, mail.ResendEventComplained, EventUnknownEmail))
		})

		t.Run("MalformedSignedBody", func(t *testing.T) {
			t.Parallel()

			bundle := setupWebhook(t, newStore(t), nil)
			for _, body := range []string{
				`not json`,
				`{"type":"email.delivered","data":{"email_id":"x"}}`,                               // no created_at
				`{"type":"email.bounced","created_at":"2026-03-01T12:00:00Z","data":{"to":["a"]}}`, // no email_id
			} {
				webhook := &resendfake.Webhook{ID: "msg_malformed", SignedAt: time.Now(), Body: []byte(body)}
				decodeProblem(t, bundle.post(t, webhook), http.StatusBadRequest)
			}
			// Its id was not recorded: the right body under it applies.
			good := bundle.event(resendfake.EventDelivered, &resendfake.EventOpts{ID: "msg_malformed"})
			require.Equal(t, http.StatusNoContent, bundle.post(t, good).Code)
			require.Equal(t, email.StatusDelivered, bundle.message(t).Status)
		})

		t.Run("TooLarge", func(t *testing.T) {
			t.Parallel()

			bundle := setupWebhook(t, newStore(t), nil)
			webhook := &resendfake.Webhook{ID: "msg_large", SignedAt: time.Now(), Body: bytes.Repeat([]byte(" "), MaxBodyBytes+1)}
			decodeProblem(t, bundle.post(t, webhook), http.StatusRequestEntityTooLarge)
		})
	})
}

func TestResendWebhook_Suppression(t *testing.T) {
	t.Parallel()

	dbtest.Engines(t, func(t *testing.T, newStore dbtest.NewStoreFunc) {
		for _, tt := range []struct {
			name       string
			eventType  string
			opts       *resendfake.EventOpts
			status     string
			suppressed bool
			reason     string
			detail     string
		}{
			{"PermanentBounce", resendfake.EventBounced, nil, email.StatusBounced, true, email.ReasonBounced, "General"},
			{"TransientBounce", resendfake.EventBounced, &resendfake.EventOpts{BounceType: resendfake.BounceTransient, BounceSubType: resendfake.BounceMailboxFull}, email.StatusBounced, false, "", ""},
			{"UndeterminedBounce", resendfake.EventBounced, &resendfake.EventOpts{BounceType: "Undetermined", BounceSubType: "Undetermined"}, email.StatusBounced, false, "", ""},
			{"Complaint", resendfake.EventComplained, nil, email.StatusComplained, true, email.ReasonComplained, ""},
			{"ResendSuppressed", resendfake.EventSuppressed, nil, email.StatusSuppressed, true, email.ReasonSuppressed, "OnAccountSuppressionList"},
			{"Failed", resendfake.EventFailed, nil, email.StatusFailed, false, "", ""},
			{"Delayed", resendfake.EventDeliveryDelayed, nil, email.StatusDelayed, false, "", ""},
		} {
			t.Run(tt.name, func(t *testing.T) {
				t.Parallel()

				bundle := setupWebhook(t, newStore(t), nil)
				at := ms(time.Now())
				opts := tt.opts
				if opts == nil {
					opts = &resendfake.EventOpts{}
				}
				opts.At = at
				rec := bundle.post(t, bundle.event(tt.eventType, opts))
				require.Equal(t, http.StatusNoContent, rec.Code)
				require.Equal(t, tt.status, bundle.message(t).Status)

				suppression, suppressed := bundle.suppression(t)
				require.Equal(t, tt.suppressed, suppressed)
				if suppressed {
					require.Equal(t, tt.reason, suppression.Reason)
					require.Equal(t, tt.detail, suppression.Detail)
					require.Equal(t, bundle.delivery.ID, suppression.EmailID)
					require.True(t, at.Equal(suppression.SuppressedAt))
				}
				// The bounce's message quotes the address: it is neither stored nor logged.
				require.NotContains(t, bundle.logs.String(), bundle.user.Email)
				require.NotContains(t, bundle.logs.String(), "Recipient address rejected")
			})
		}

		t.Run("BounceClassificationKept", func(t *testing.T) {
			t.Parallel()

			bundle := setupWebhook(t, newStore(t), nil)
			require.Equal(t, http.StatusNoContent, bundle.post(t, bundle.event(resendfake.EventBounced,
				&resendfake.EventOpts{BounceType: resendfake.BounceTransient, BounceSubType: resendfake.BounceMailboxFull})).Code)
			message := bundle.message(t)
			require.Equal(t, "Transient", *message.BounceType)
			require.Equal(t, "MailboxFull", *message.BounceSubType)
		})

		t.Run("AddressNormalised", func(t *testing.T) {
			t.Parallel()

			// Resend echoes the address as it was sent; whatever its case, the list keys the
			// normalised form, which the workers look up.
			bundle := setupWebhook(t, newStore(t), nil)
			bundle.delivery.To = []string{strings.ToUpper(bundle.user.Email)}
			require.Equal(t, http.StatusNoContent, bundle.post(t, bundle.event(resendfake.EventComplained, nil)).Code)
			_, suppressed := bundle.suppression(t)
			require.True(t, suppressed)
		})

		t.Run("FirstReasonStays", func(t *testing.T) {
			t.Parallel()

			bundle := setupWebhook(t, newStore(t), nil)
			at := ms(time.Now())
			require.Equal(t, http.StatusNoContent, bundle.post(t, bundle.event(resendfake.EventBounced, &resendfake.EventOpts{At: at})).Code)
			require.Equal(t, http.StatusNoContent, bundle.post(t, bundle.event(resendfake.EventComplained, &resendfake.EventOpts{At: at.Add(time.Minute)})).Code)
			suppression, suppressed := bundle.suppression(t)
			require.True(t, suppressed)
			require.Equal(t, email.ReasonBounced, suppression.Reason)
			require.True(t, at.Equal(suppression.SuppressedAt))
		})
	})
}
