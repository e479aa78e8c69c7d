package db

import "time"

// User is a registered user.
type User struct {
	ID              int64
	Email           string
	Name            string
	PasswordHash    string
	EmailVerifiedAt *time.Time
	UnsubscribedAt  *time.Time
	CreatedAt       time.Time
	UpdatedAt       time.Time
	// Locale is the user's language, a BCP 47 tag; "" when unknown. Mail goes out in the best
	// match among the locales that have templates (mail.Renderer.Match).
	Locale string
}

// TokenPurpose says what an email token may be used for; a token of one purpose never stands in
// for another.
type TokenPurpose string

const (
	TokenPurposeVerify TokenPurpose = "verify"
	TokenPurposeReset  TokenPurpose = "reset"
)

// EmailMessage is the message row of one email job, created at its first attempt.
type EmailMessage struct {
	JobID  int64
	Kind   string
	UserID int64
	// IdempotencyKey is the key every attempt sends under (<kind>:<user_id>:<random>).
	IdempotencyKey string
	// KeyCreatedAt is when IdempotencyKey was chosen: the provider forgets a key 24 hours later.
	KeyCreatedAt time.Time
	// Status is one of package email's Status* constants; email.Record moves it.
	Status string
	// ProviderID is the provider's id of the accepted mail; nil until then.
	ProviderID *string
	// AcceptedAt is when the provider accepted the mail; nil until then. A later attempt of a job
	// whose mail was accepted completes without sending.
	AcceptedAt *time.Time
	CreatedAt  time.Time
	UpdatedAt  time.Time
	// StatusAt is the time of the provider event that set Status; nil while Status is
	// postguard's own (queued, sent as the worker recorded the acceptance, suppressed before any
	// send), which any provider event may follow. An event older than StatusAt changes no
	// status.
	StatusAt *time.Time
	// The time each status was first reached (by the earliest event of that status); nil for a
	// status the message never had. The queued time is CreatedAt.
	SentAt       *time.Time
	DeliveredAt  *time.Time
	DelayedAt    *time.Time
	BouncedAt    *time.Time
	ComplainedAt *time.Time
	SuppressedAt *time.Time
	FailedAt     *time.Time
	// BounceType and BounceSubType are the provider's classification of a bounce (Permanent and
	// General, Transient and MailboxFull…); nil without one.
	BounceType    *string
	BounceSubType *string
	// Locale is the locale the job's mail is rendered in, chosen at its first attempt; "" for a
	// message of before locales.
	Locale string
	// PayloadSHA256 is the SHA-256 of what the job's attempts send under IdempotencyKey (never the
	// bytes, which hold the link's token); nil for a message of before it was kept.
	PayloadSHA256 []byte
	// Provider is the name of the provider that accepted the mail (resend, smtp, log…), written
	// with AcceptedAt; nil until then, and for mail accepted before providers were recorded.
	Provider *string
	// ProviderInDoubt is the provider an attempt handed the mail to without hearing that it took
	// it or did not (its answer was lost, or the worker died): the job's later attempts send to
	// it alone, never to another provider, which could deliver the mail a second time. nil when
	// no provider may hold the mail unaccepted.
	ProviderInDoubt *string
	// TraceParent is the W3C traceparent of the mail's trace (the insert of its job, as the job's
	// metadata carried it to its first attempt), which the webhook's spans link to; nil when
	// tracing was off.
	TraceParent *string
}

// EmailMessageMarkAcceptedParams record that a provider accepted a job's message.
type EmailMessageMarkAcceptedParams struct {
	JobID int64
	// Provider is the name of the provider that accepted it; ProviderID the id it gave the mail.
	Provider   string
	ProviderID string
	Now        time.Time
}

// EmailMessageSetProviderInDoubtParams record, before a send, the provider a job's message is
// handed to, or clear it (Provider nil) once that provider answered that it did not take it.
type EmailMessageSetProviderInDoubtParams struct {
	JobID    int64
	Provider *string
	Now      time.Time
}

// EmailMessageMarkBouncedParams record that a provider refused a job's recipient for good while
// the mail was sent (an SMTP relay's 5xx to RCPT TO): BounceType and BounceSubType are its
// classification, as a provider's bounce event gives them.
type EmailMessageMarkBouncedParams struct {
	JobID         int64
	BounceType    string
	BounceSubType string
	Now           time.Time
}

// EmailMessageMarkSuppressedParams are the fields of a job's message row when its mail is held
// back because its address is suppressed (nothing rendered, nothing sent).
type EmailMessageMarkSuppressedParams struct {
	JobID          int64
	Kind           string
	UserID         int64
	IdempotencyKey string
	Now            time.Time
}

// EmailMessageLifecycleParams are a message's status and the times of its statuses, as merged
// from a provider event: EmailMessageSetLifecycle writes them all.
type EmailMessageLifecycleParams struct {
	Status        string
	StatusAt      *time.Time
	SentAt        *time.Time
	DeliveredAt   *time.Time
	DelayedAt     *time.Time
	BouncedAt     *time.Time
	ComplainedAt  *time.Time
	SuppressedAt  *time.Time
	FailedAt      *time.Time
	BounceType    *string
	BounceSubType *string
	Now           time.Time
	JobID         int64
}

// EmailSuppression is an address on the suppression list: never the address itself, only its
// HMAC (email.SuppressionKey).
type EmailSuppression struct {
	AddressHash []byte
	// Reason is one of package email's Reason* constants; Detail the provider's classification
	// (a bounce's sub-type, say), possibly empty.
	Reason string
	Detail string
	// EmailID is the provider's id of the mail whose event suppressed the address.
	EmailID string
	// SuppressedAt is that event's time; CreatedAt when postguard recorded it.
	SuppressedAt time.Time
	CreatedAt    time.Time
}

// EmailSuppressionInsertParams put an address on the suppression list.
type EmailSuppressionInsertParams struct {
	AddressHash  []byte
	Reason       string
	Detail       string
	EmailID      string
	SuppressedAt time.Time
	Now          time.Time
}

// EmailSuppressionListParams select a page of the suppression list, newest first: up to Max
// suppressions after the one at (BeforeAt, BeforeHash) in that order. The first page starts
// before any time (a BeforeAt in the far future).
type EmailSuppressionListParams struct {
	BeforeAt   time.Time
	BeforeHash []byte
	Max        int
}

// EmailToken is a stored link token: never the token itself, only its hash and, while its job may
// still send it, its sealed copy.
type EmailToken struct {
	TokenHash []byte
	UserID    int64
	Purpose   TokenPurpose
	ExpiresAt time.Time
	UsedAt    *time.Time
	CreatedAt time.Time
	JobID     int64
	// Sealed is the token encrypted for its job's later attempts (jobs/tokens.Sealer); nil once
	// the provider accepted the mail, or after 24 hours.
	Sealed []byte
}

// TokenOwner is the user of a usable email token (EmailTokenLookup).
type TokenOwner struct {
	UserID int64
	// Locale is the user's locale (User.Locale), "" when unknown or when the user is gone: the
	// language of the pages the token's link opens.
	Locale string
}

// EmailMessageInsertParams are the fields of a job's new message row.
type EmailMessageInsertParams struct {
	JobID          int64
	Kind           string
	UserID         int64
	IdempotencyKey string
	Now            time.Time
	Locale         string
	PayloadSHA256  []byte
	// TraceParent is the W3C traceparent in the job's metadata; nil without one.
	TraceParent *string
}

// EmailMessageRekeyParams are a job's new idempotency key and what is sent under it.
type EmailMessageRekeyParams struct {
	JobID          int64
	IdempotencyKey string
	Locale         string
	PayloadSHA256  []byte
	Now            time.Time
}

// UserInsertParams are the fields of a new user.
type UserInsertParams struct {
	Email        string // normalised
	Name         string
	PasswordHash string
	Locale       string // a canonical BCP 47 tag, or ""
	Now          time.Time
}

// EmailTokenInsertParams are the stored forms of a job's new token.
type EmailTokenInsertParams struct {
	TokenHash []byte // SHA-256 of the token
	UserID    int64
	Purpose   TokenPurpose
	JobID     int64
	Sealed    []byte // the token sealed for the job's later attempts
	ExpiresAt time.Time
	Now       time.Time
}

// RateLimitCounterConsumeParams names one fixed window of one key and its limit.
type RateLimitCounterConsumeParams struct {
	KeyHash     []byte
	WindowStart time.Time
	WindowEnd   time.Time
	LimitCount  int64
}

// RateLimitChainMax is the most windows one RateLimitCounterConsumeChain spends: one per scope
// (IP, email, key).
const RateLimitChainMax = 3

// RateLimitCounterChainParams are the windows one request spends, in the order they are checked,
// and an email whose user to read in the same round trip.
type RateLimitCounterChainParams struct {
	// Windows are spent in order, each only when every one before it admitted: 1 to
	// RateLimitChainMax of them, each of a different key.
	Windows []RateLimitCounterConsumeParams
	// UserEmail, when not empty, is a normalised email whose user is read when every window
	// admitted.
	UserEmail string
	// Device, when not nil, is a trusted device whose own bucket one of the windows is counted in
	// instead, while the device stands.
	Device *RateLimitDeviceParams
}

// RateLimitCounterChainResult is what RateLimitCounterConsumeChain spent and read.
type RateLimitCounterChainResult struct {
	// Counts holds, for each window that admitted, in order, its count after the request. When
	// it is shorter than the chain's windows, Windows[len(Counts)] refused (nothing counted) and
	// the windows after it were not spent.
	Counts []int64
	// User is UserEmail's user when every window admitted and there is one; nil otherwise.
	User *User
	// DeviceTrusted says the Device stood: its window was the device's own bucket.
	DeviceTrusted bool
}

// RateLimitDeviceParams are a trusted-device token's part in a request's windows: while no
// revocation of its account's devices is recorded later than Since, the window at Window is
// counted in the device's own bucket, KeyHash, instead of the account's. The check is made in the
// same round trip as the windows' own statements.
type RateLimitDeviceParams struct {
	// Window is the index, among the request's windows, of the one the device's bucket replaces
	// (the key rule's).
	Window int
	// KeyHash is the device's own bucket of that window's rule.
	KeyHash []byte
	// RevocationHash is the key the account's revocations are recorded under
	// (RateLimitDeviceRevocationUpsert).
	RevocationHash []byte
	// Since is the account's last revocation time when the token was issued
	// (RateLimitDeviceRevocationGet), the Unix epoch when there was none.
	Since time.Time
}

// RateLimitCounterWindowsParams are several fixed windows of a request, each of a different key,
// in the order its rules are checked (at most RateLimitChainMax), and the trusted device it
// carries, if any: what RateLimitCounterGetMany reads, RateLimitCounterRefund gives back to and
// RateLimitCounterDeleteMany deletes.
type RateLimitCounterWindowsParams struct {
	Windows []RateLimitCounterGetParams
	Device  *RateLimitDeviceParams
}

// RateLimitCounterGetManyResult is what RateLimitCounterGetMany read.
type RateLimitCounterGetManyResult struct {
	// Counts holds each window's count, in the order asked (0 when nothing was counted).
	Counts []int64
	// DeviceTrusted says the Device stood: its window's count is the device's own bucket's.
	DeviceTrusted bool
}

// RateLimitCounterGetParams names one fixed window of one key: its start and its end, as the
// window was spent (RateLimitCounterConsumeParams). SQLite keeps its counters in the order of
// their windows' ends and finds one by the whole of it; Tables refuse a window that does not end
// after it starts.
type RateLimitCounterGetParams struct {
	KeyHash     []byte
	WindowStart time.Time
	WindowEnd   time.Time
}

// RateLimitCounterDeleteParams names one fixed window of one key, as RateLimitCounterGetParams
// does.
type RateLimitCounterDeleteParams struct {
	KeyHash     []byte
	WindowStart time.Time
	WindowEnd   time.Time
}

// SecretCheckParams are the check value of a secret (never the secret itself: an HMAC of a
// fixed label under a key derived from it) and when it is recorded.
type SecretCheckParams struct {
	CheckValue []byte
	Now        time.Time
}
