package email_test

import (
	"fmt"

	"github.com/postguard/postguard/email"
)

// Every spelling of one mailbox has one normal form, the one postguard stores, counts, mails and
// suppresses; what is not one plain address is refused.
func ExampleNormalize() {
	for _, in := range []string{"  Ada@Bücher.DE ", "ada@xn--bcher-kva.de", "ada@ｅxample.com", "Ada <ada@example.com>", "ada@[127.0.0.1]"} {
		address, err := email.Normalize(in)
		fmt.Printf("%q: %q %v\n", in, address, err)
	}
	// Output:
	// "  Ada@Bücher.DE ": "ada@xn--bcher-kva.de" <nil>
	// "ada@xn--bcher-kva.de": "ada@xn--bcher-kva.de" <nil>
	// "ada@ｅxample.com": "ada@example.com" <nil>
	// "Ada <ada@example.com>": "" invalid email address
	// "ada@[127.0.0.1]": "" invalid email address
}

// The suppression policy: a permanent bounce or a complaint puts the recipient on the
// suppression list; a transient bounce or a delivery does not.
func ExampleSuppression() {
	for _, event := range []*email.Event{
		{Status: email.StatusBounced, Bounce: &email.Bounce{Type: "Permanent", SubType: "General", Permanent: true}},
		{Status: email.StatusBounced, Bounce: &email.Bounce{Type: "Transient", SubType: "MailboxFull"}},
		{Status: email.StatusComplained},
		{Status: email.StatusDelivered},
	} {
		reason, detail, suppresses := email.Suppression(event)
		fmt.Printf("%s: %t %q %q\n", event.Status, suppresses, reason, detail)
	}
	// Output:
	// bounced: true "bounced" "General"
	// bounced: false "" ""
	// complained: true "complained" ""
	// delivered: false "" ""
}
