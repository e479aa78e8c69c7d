package resendfake_test

import (
	"context"
	"fmt"
	"time"

	"github.com/postguard/postguard/jobs/mail"
	"github.com/postguard/postguard/jobs/mail/resendfake"
)

// A host app's tests send its mail through the real Resend client to the fake, which keeps what
// it accepted and answers a repeat of one idempotency key with the same id, as Resend does.
func Example() {
	fake := resendfake.New(nil, nil)
	defer fake.Close()
	sender, err := mail.NewResendSender(&mail.ResendConfig{APIKey: "re_test", BaseURL: fake.URL(), From: "Acme <no-reply@acme.example>", Timeout: 10 * time.Second})
	if err != nil {
		panic(err)
	}

	msg := &mail.Message{To: "ada@example.com", Subject: "Welcome", Text: "Hi Ada", HTML: "<p>Hi Ada</p>", IdempotencyKey: "welcome_email:1:x", Kind: "welcome_email"}
	first, err := sender.Send(context.Background(), msg)
	if err != nil {
		panic(err)
	}
	again, err := sender.Send(context.Background(), msg) // a retry after a lost answer
	if err != nil {
		panic(err)
	}
	deliveries := fake.Deliveries()
	fmt.Println("same id:", first == again)
	fmt.Println("delivered:", len(deliveries), deliveries[0].To, deliveries[0].Subject)
	// Output:
	// same id: true
	// delivered: 1 [ada@example.com] Welcome
}
