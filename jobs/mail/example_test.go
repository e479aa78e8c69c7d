package mail_test

import (
	"context"
	"fmt"
	"log"

	"github.com/postguard/postguard/jobs/mail"
	"github.com/postguard/postguard/jobs/mail/resendfake"
)

func ExampleRenderWelcome() {
	subject, _, text, err := mail.RenderWelcome(&mail.WelcomeData{
		AppURL:         "https://app.example.com",
		Name:           "Ada",
		UnsubscribeURL: "https://app.example.com/v1/unsubscribe?token=abc",
	})
	if err != nil {
		log.Fatal(err)
	}

	fmt.Println("Subject:", subject)
	fmt.Print(text)
	// Output:
	// Subject: Welcome aboard
	// Hi Ada,
	//
	// Welcome aboard! Your account is ready.
	//
	// Get started: https://app.example.com
	//
	// We have also sent you a separate email with a link to confirm your address.
	//
	// --
	// You are receiving this email because you signed up at https://app.example.com.
	// Not interested in emails like this one? Unsubscribe: https://app.example.com/v1/unsubscribe?token=abc
}

func ExampleNewResendSender() {
	// A local fake of Resend's API; in production BaseURL is left empty
	// (https://api.resend.com/) or comes from RESEND_BASE_URL.
	fake := resendfake.New(nil, nil)
	defer fake.Close()

	sender, err := mail.NewResendSender(&mail.ResendConfig{
		APIKey:  "re_example",
		BaseURL: fake.URL(),
		From:    "App <no-reply@example.com>",
	})
	if err != nil {
		log.Fatal(err)
	}

	msg := &mail.Message{
		IdempotencyKey: "welcome_email:1:5f2b0c9d4e7a1b3c8d6e0f1a2b3c4d5e",
		Subject:        "Welcome aboard",
		Text:           "Hi Ada",
		To:             "ada@example.com",
	}
	id, err := sender.Send(context.Background(), msg)
	if err != nil {
		outcome := mail.Classify(err)
		fmt.Println("send failed, job should", outcome.Action)
		return
	}
	// A retry with the same idempotency key is not delivered twice: Resend answers the first
	// send's id.
	again, err := sender.Send(context.Background(), msg)
	if err != nil {
		log.Fatal(err)
	}

	fmt.Println("deliveries:", len(fake.Deliveries()), "same id:", again == id)
	// Output:
	// deliveries: 1 same id: true
}
