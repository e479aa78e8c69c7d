// Package email is postguard's email domain, one concept used by the HTTP handlers, the delivery
// webhook and the mail workers alike: an address's normal form (Normalize), its key on the
// suppression list (SuppressionKey) and which provider events put it there (Suppression), and
// the lifecycle of a message, its statuses and how a provider's event moves it (Record). What a
// provider sends is read into an Event by the provider's own code (jobs/mail for Resend); what
// is stored is db's.
//
// Every address postguard keys, counts or mails goes through Normalize first, whoever gave it: a
// request, a provider's event, or a host app's jobs.Recipients. So ada@bücher.de and
// ada@xn--bcher-kva.de are one account, one rate-limit bucket and one suppression.
package email
