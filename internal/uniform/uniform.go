// Package uniform holds the hold of the service's uniform answers, for api, which holds
// forgot-password and resend-verification to it, and for the load tool, which sizes its held
// scenarios by it. It is not API: a host app has routes of its own to time.
package uniform

import "time"

// AnswerMin is the least time forgot-password and resend-verification take once the limiter let
// them through, so the answer's timing does not tell a known email from an unknown one: well
// above the few milliseconds that the work of a known email adds, well below what a person
// notices. A client that waits for each answer makes at most one such request per AnswerMin.
const AnswerMin = 100 * time.Millisecond
