package mail_test

import (
	"context"
	"fmt"
	"log"

	"github.com/postguard/postguard/jobs/mail"
	"github.com/postguard/postguard/jobs/mail/resendfake"
)

func ExampleRenderer() {
	renderer, err := mail.NewRenderer(&mail.RendererConfig{
		AppName: "Acme",
		AppURL:  "https://app.example.com",
		// TemplatesDir: "/etc/postguard/mail" would replace built-in templates file by file.
	})
	if err != nil {
		log.Fatal(err) // a template that does not parse or names an unknown field
	}

	welcome, err := renderer.Render(mail.KindWelcome, renderer.Match("fr-CA"), &mail.Data{
		Name:           "Ada",
		ActionURL:      "https://app.example.com",
		UnsubscribeURL: "https://app.example.com/v1/unsubscribe?token=abc",
	})
	if err != nil {
		log.Fatal(err)
	}

	fmt.Println("Locale:", welcome.Locale) // no French templates: the default locale's
	fmt.Println("Subject:", welcome.Subject)
	fmt.Print(welcome.Text)
	// Output:
	// Locale: en
	// Subject: Welcome to Acme
	// Hi Ada,
	//
	// Welcome to Acme! Your account is ready.
	//
	// Get started: https://app.example.com
	//
	// We have also sent you a separate email with a link to confirm your address.
	//
	// — The Acme team
	//
	// --
	// You are receiving this email because you signed up for Acme with this address.
	// Not interested in emails like this one? Unsubscribe: https://app.example.com/v1/unsubscribe?token=abc
	// Acme · https://app.example.com
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
		Subject:        "Welcome to App",
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
