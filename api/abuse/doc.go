// Package abuse caps actions per client IP, per email address and per opaque key, with
// fixed-window counters kept in the database so that every process shares one view: postguard's
// own auth actions (register, forgot password, resend verification, reset password, River UI
// logins), and any custom action a host app names (login above all) through its
// RATE_LIMIT_<ACTION>_<SCOPE> variables, the limits API or its own Rules. It knows no routes and
// no HTTP framework: the caller resolves the client IP with an IPResolver, asks Limiter.Allow (or
// Limiter.Peek, which spends nothing, Limiter.Refund, which gives a request back, or
// Limiter.Clear, which starts a subject's windows afresh) for a Subject, and writes
// Decision.SetHeaders. Package ginlimit does that for a Gin app.
//
// A login spends first: Allow before the password is checked (a refusal checks nothing), so at
// most Limit passwords per account per window are ever checked, however many guesses arrive at
// once; a right password clears the account's key and refunds the IP. Trusted devices keep the
// owner's own device working while guessers lock the account for everyone else: Limiter.IssueDevice
// gives a device a token after a success; a request carrying it (Subject.Device) counts the key
// rule in the device's own bucket while it stands (until DeviceTokenTTL, or Limiter.RevokeDevices);
// any other token is no token.
//
// Windows are fixed and aligned on the Unix epoch (window_start = floor(now/size)*size). An
// action's rules are checked IP, then email, then key, each spending only when the ones before it
// admitted. Each check is one atomic statement (db.Counters.RateLimitCounterConsume) that inserts
// the counter at 1 or increments it only while below the limit, so exactly Limit requests pass
// per window whatever the concurrency and however many processes, and a refused request is never
// counted. Counters are keyed by HMAC-SHA-256(APP_SECRET, "ratelimit:v1:<action>:<scope>:<value>"):
// no raw IP, email or key reaches the database. IPv6 clients count per /64 (BucketKey).
package abuse
