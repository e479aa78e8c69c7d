// Package abuse caps guarded auth actions (register, forgot password, resend verification, reset
// password) per client IP and, where a rule says so, per email address, with fixed-window
// counters kept in the database so that every API process shares one view. It knows no routes
// and no HTTP framework: the api package resolves the client IP with an IPResolver, asks
// Limiter.Allow (or Limiter.Peek, which spends nothing), and writes Decision.SetHeaders.
//
// Windows are fixed and aligned on the Unix epoch (window_start = floor(now/size)*size). Each
// check is one atomic statement (db.Store.RateLimitCounterConsume) that inserts the counter at 1
// or increments it only while below the limit, so exactly Limit requests pass per window whatever
// the concurrency, and a refused request is never counted. Counters are keyed by
// HMAC-SHA-256(APP_SECRET, "ratelimit:v1:<action>:<scope>:<value>"): no raw IP or email reaches
// the database. IPv6 clients count per /64 (BucketKey).
package abuse
