package api

import (
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/gin-gonic/gin"

	"github.com/postguard/postguard/db"
	"github.com/postguard/postguard/email"
)

const (
	// adminMessagesLimit is how many of a user's newest messages the admin API lists.
	adminMessagesLimit = 100
	// adminSuppressionsLimit and adminSuppressionsMaxLimit are the default and the largest page of
	// the suppression list.
	adminSuppressionsLimit    = 100
	adminSuppressionsMaxLimit = 1000
	// adminRealm names the admin API in WWW-Authenticate.
	adminRealm = "postguard admin"
)

// firstPageBefore starts the first page of the suppression list: after every time a suppression
// can have.
var firstPageBefore = time.Date(9999, 1, 1, 0, 0, 0, 0, time.UTC) //nolint:gochecknoglobals // a constant time

var (
	errAdminUnauthorized = newError(http.StatusUnauthorized, "The admin API needs the ADMIN_TOKEN as a bearer token: Authorization: Bearer <token>.")
	errBadUserID         = newError(http.StatusBadRequest, "The user id must be a positive whole number.")
	errUnknownUser       = newError(http.StatusNotFound, "No user has this id.")
	errBadEmailPath      = newError(http.StatusBadRequest, "The path's last segment must be an email address.")
	errBadLimit          = newError(http.StatusBadRequest, fmt.Sprintf("The limit must be a whole number from 1 to %d.", adminSuppressionsMaxLimit))
	errBadCursor         = newError(http.StatusBadRequest, "The cursor is not one this API gave.")
)

// mountAdmin adds the admin API under /v1/admin, every route behind the bearer token (adminAuth)
// and answered no-store. It is mounted only when ADMIN_TOKEN is set: without it every
// /v1/admin route is a 404, as any unknown path.
func (s *server) mountAdmin(v1 *gin.RouterGroup, token string) {
	admin := v1.Group("/admin", s.handle(adminAuth(token)))
	get(admin, "/users/:id/messages", s.handle(s.adminUserMessages))
	get(admin, "/suppressions", s.handle(s.adminSuppressions))
	admin.DELETE("/suppressions/:email", s.handle(s.adminDeleteSuppression))
}

// adminAuth is the admin API's bearer check (see bearerAuth). There is no rate limit: the token
// is at least 32 bytes, so guessing it is hopeless, and a refusal costs no database work.
func adminAuth(token string) handlerFunc {
	return bearerAuth(token, adminRealm, errAdminUnauthorized)
}

// adminMessage is one mail of a user as the admin API shows it: its kind, status and the time
// of each status, the provider that accepted it and its id there. Never its token, idempotency
// key or body.
type adminMessage struct {
	JobID  int64  `json:"job_id"`
	Kind   string `json:"kind"`
	Status string `json:"status"`
	// Provider is the provider that accepted the mail (resend, smtp, log); ProviderID its id
	// there (Resend's email id, the SMTP Message-ID).
	Provider   *string `json:"provider"`
	ProviderID *string `json:"provider_id"`
	// ProviderInDoubt is the provider an attempt handed the mail to without hearing whether it
	// took it: the job's later attempts send there only.
	ProviderInDoubt *string `json:"provider_in_doubt"`
	// StatusAt is the time of the provider event that set Status; null while the status is
	// postguard's own.
	StatusAt     *time.Time   `json:"status_at"`
	QueuedAt     time.Time    `json:"queued_at"`
	AcceptedAt   *time.Time   `json:"accepted_at"`
	SentAt       *time.Time   `json:"sent_at"`
	DeliveredAt  *time.Time   `json:"delivered_at"`
	DelayedAt    *time.Time   `json:"delayed_at"`
	BouncedAt    *time.Time   `json:"bounced_at"`
	ComplainedAt *time.Time   `json:"complained_at"`
	SuppressedAt *time.Time   `json:"suppressed_at"`
	FailedAt     *time.Time   `json:"failed_at"`
	Bounce       *adminBounce `json:"bounce"`
	UpdatedAt    time.Time    `json:"updated_at"`
	// TraceID is the id of the trace the mail belongs to (the request that caused it, each
	// attempt, its webhook events' links), when tracing was on; null otherwise.
	TraceID *string `json:"trace_id"`
}

type adminBounce struct {
	Type    *string `json:"type"`
	SubType *string `json:"sub_type"`
}

// adminSuppression is an entry of the suppression list: the address's HMAC (hex), never the
// address.
type adminSuppression struct {
	AddressHash  string    `json:"address_hash"`
	Reason       string    `json:"reason"`
	Detail       string    `json:"detail"`
	EmailID      string    `json:"email_id"`
	SuppressedAt time.Time `json:"suppressed_at"`
	CreatedAt    time.Time `json:"created_at"`
}

func adminSuppressionOf(suppression *db.EmailSuppression) *adminSuppression {
	return &adminSuppression{
		AddressHash:  hex.EncodeToString(suppression.AddressHash),
		Reason:       suppression.Reason,
		Detail:       suppression.Detail,
		EmailID:      suppression.EmailID,
		SuppressedAt: suppression.SuppressedAt,
		CreatedAt:    suppression.CreatedAt,
	}
}

// adminUserMessages is GET /v1/admin/users/{id}/messages: the user's newest mails with their
// lifecycle, and whether the user's address is on the suppression list.
func (s *server) adminUserMessages(c *gin.Context) error {
	raw := pathParam(c, "id")
	id, err := strconv.ParseInt(raw, 10, 64)
	if err != nil || id <= 0 || strconv.FormatInt(id, 10) != raw {
		return errBadUserID
	}
	ctx := c.Request.Context()
	user, err := s.store.UserGetByID(ctx, id)
	if errors.Is(err, db.ErrNotFound) {
		return errUnknownUser
	}
	if err != nil {
		return err
	}
	messages, err := s.store.EmailMessageListByUser(ctx, id, adminMessagesLimit)
	if err != nil {
		return err
	}
	var suppression *adminSuppression
	switch found, err := s.store.EmailSuppressionGet(ctx, email.SuppressionKey(s.secret, user.Email)); {
	case err == nil:
		suppression = adminSuppressionOf(found)
	case !errors.Is(err, db.ErrNotFound):
		return err
	}

	out := make([]adminMessage, len(messages))
	for i, m := range messages {
		out[i] = adminMessage{
			JobID:           m.JobID,
			Kind:            m.Kind,
			Status:          m.Status,
			Provider:        m.Provider,
			ProviderID:      m.ProviderID,
			ProviderInDoubt: m.ProviderInDoubt,
			StatusAt:        m.StatusAt,
			QueuedAt:        m.CreatedAt,
			AcceptedAt:      m.AcceptedAt,
			SentAt:          m.SentAt,
			DeliveredAt:     m.DeliveredAt,
			DelayedAt:       m.DelayedAt,
			BouncedAt:       m.BouncedAt,
			ComplainedAt:    m.ComplainedAt,
			SuppressedAt:    m.SuppressedAt,
			FailedAt:        m.FailedAt,
			UpdatedAt:       m.UpdatedAt,
		}
		if m.TraceParent != nil {
			if mailTrace := spanContextOf(*m.TraceParent); mailTrace.IsValid() {
				traceID := mailTrace.TraceID().String()
				out[i].TraceID = &traceID
			}
		}
		if m.BounceType != nil || m.BounceSubType != nil {
			out[i].Bounce = &adminBounce{Type: m.BounceType, SubType: m.BounceSubType}
		}
	}
	return writeJSON(c, http.StatusOK, map[string]any{
		"user_id":     id,
		"suppression": suppression,
		"messages":    out,
	})
}

// adminSuppressions is GET /v1/admin/suppressions: a page of the suppression list, newest
// first, ?limit= entries (100, at most 1000) after ?cursor=, the next_cursor of the page before.
// next_cursor is null on the last page.
func (s *server) adminSuppressions(c *gin.Context) error {
	limit := adminSuppressionsLimit
	if raw, ok := c.GetQuery("limit"); ok {
		n, err := strconv.Atoi(raw)
		if err != nil || n < 1 || n > adminSuppressionsMaxLimit {
			return errBadLimit
		}
		limit = n
	}
	params := &db.EmailSuppressionListParams{BeforeAt: firstPageBefore, Max: limit + 1}
	if raw, ok := c.GetQuery("cursor"); ok {
		at, hash, ok := parseCursor(raw)
		if !ok {
			return errBadCursor
		}
		params.BeforeAt, params.BeforeHash = at, hash
	}
	suppressions, err := s.store.EmailSuppressionList(c.Request.Context(), params)
	if err != nil {
		return err
	}

	var next *string
	if len(suppressions) > limit {
		suppressions = suppressions[:limit]
		last := suppressions[limit-1]
		cursor := formatCursor(last.SuppressedAt, last.AddressHash)
		next = &cursor
	}
	out := make([]*adminSuppression, len(suppressions))
	for i, suppression := range suppressions {
		out[i] = adminSuppressionOf(suppression)
	}
	return writeJSON(c, http.StatusOK, map[string]any{"suppressions": out, "next_cursor": next})
}

// formatCursor and parseCursor are the opaque cursor of a page of the suppression list: the
// last entry's time (Unix microseconds) and hash (hex), base64url. parseCursor takes only what
// formatCursor writes: a time from the Unix epoch to firstPageBefore (the ones a suppression
// can have, within what both engines store; PostgreSQL refuses a time before 4713 BC), in its
// canonical decimal form, and a lowercase hash, so a tampered cursor is a 400, never a
// database error.
func formatCursor(at time.Time, hash []byte) string {
	return base64.RawURLEncoding.EncodeToString([]byte(strconv.FormatInt(at.UnixMicro(), 10) + ":" + hex.EncodeToString(hash)))
}

func parseCursor(cursor string) (time.Time, []byte, bool) {
	raw, err := base64.RawURLEncoding.Strict().DecodeString(cursor)
	if err != nil {
		return time.Time{}, nil, false
	}
	us, hexHash, found := strings.Cut(string(raw), ":")
	micros, err := strconv.ParseInt(us, 10, 64)
	if !found || err != nil || strconv.FormatInt(micros, 10) != us || micros < 0 || micros > firstPageBefore.UnixMicro() {
		return time.Time{}, nil, false
	}
	hash, err := hex.DecodeString(hexHash)
	if err != nil || len(hash) != sha256.Size || hex.EncodeToString(hash) != hexHash {
		return time.Time{}, nil, false
	}
	return time.UnixMicro(micros).UTC(), hash, true
}

// adminDeleteSuppression is DELETE /v1/admin/suppressions/{email}: the address, normalised as
// everywhere, is taken off the suppression list, so mail flows to it again. 204 whether it was
// on the list or not: the address is off it either way (the list says which beforehand).
func (s *server) adminDeleteSuppression(c *gin.Context) error {
	address, err := email.Normalize(pathParam(c, "email"))
	if err != nil {
		return errBadEmailPath
	}
	key := email.SuppressionKey(s.secret, address)
	deleted, err := s.store.EmailSuppressionDelete(c.Request.Context(), key)
	if err != nil {
		return err
	}
	s.logger.InfoContext(c.Request.Context(), "suppression removed through the admin API",
		slog.String("request_id", requestIDOf(c)),
		slog.String("address_hash", hex.EncodeToString(key)),
		slog.Bool("was_suppressed", deleted))
	c.Status(http.StatusNoContent)
	return nil
}
